"""Exact re-layouts of ggml blocks onto MatMulNBits with uint8 zero points
(formats/ggml/relayout/exact_layout.py).

Oracles, independent of the code under test: gguf-py's `dequantize` (the re-laid weight,
decoded by the MatMulNBits schema's definition (code - zero_point) * scale [- min] written
here, must equal it bit for bit), and x @ W^T in float64 over gguf-py's values (onnxruntime's
MatMulNBits at accuracy 0 must match it within float32 rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.formats.ggml.relayout.exact_codes import exact_codes
from mobius_lite.formats.ggml.relayout.exact_layout import (
    NBitsLayout,
    layout_cost,
    layout_parts,
    to_nbits_layout,
)
from mobius_lite.formats.ggml.relayout.exact_matmulnbits import emit_exact_nbits_matmul
from reference_fixtures.gguf_fixtures import random_blocks

from .emit_harness import run_emitter
from .ggml_data import random_rows
from .q4_k_blocks import q4_k_quantize

TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ2_XXS")
CONTRIB = {"com.microsoft": 1}
QTYPE = GGMLQuantizationType
# Fixed before running: an f32 kernel's accumulation over K <= 512 terms errs at most
# ~K * 2**-24 * sum|x||w| ~= 3e-5 sum|x||w|; 1e-5 holds with blocked sums (pairwise).
REL_TOL = 1e-5


def ggml_rows(type_name: str, n: int, k: int, seed: int, *, finite_scales: bool) -> np.ndarray:
    """Valid ggml rows uint8 [n, row_bytes]. `finite_scales`: fp16 scales small (products stay
    finite, for matmuls); otherwise every special fp16 value too (subnormals, max finite)."""
    rng = np.random.default_rng(seed)
    legacy = type_name in ("Q4_0", "Q8_0")
    if finite_scales and legacy:  # gguf-py quantizes these types itself
        return quantize(rng.standard_normal((n, k)).astype(np.float32), QTYPE[type_name])
    if type_name == "IQ2_XXS" or finite_scales:
        return random_blocks(type_name, (n, k), rng)
    return random_rows(rng, type_name, (n,), k // (32 if legacy else 256))


def gguf_values(type_name: str, rows: np.ndarray, n: int) -> np.ndarray:
    return np.asarray(dequantize(rows, QTYPE[type_name]), dtype=np.float32).reshape(n, -1)


def unpacked_zero_points(layout: NBitsLayout, n: int, k_blocks: int) -> np.ndarray:
    """uint8 zero points [N, k_blocks] from the packed form (4 bits: low nibble first)."""
    if layout.bits == 8:
        return layout.zero_points
    z = np.stack([layout.zero_points & 0xF, layout.zero_points >> 4], -1).reshape(n, -1)
    return z[:, :k_blocks]


def schema_dequant(layout: NBitsLayout, n: int, k: int) -> np.ndarray:
    """dequant(B) [N, K] by the MatMulNBits definition, float32: (code - zp) * scale per
    block, minus the layout's min where it has one."""
    bs = layout.block_size
    if layout.bits == 8:
        codes = layout.b.reshape(n, k)
    else:  # element 2i in the low nibble of byte i, 2i + 1 in the high one
        codes = np.stack([layout.b & 0xF, layout.b >> 4], axis=-1).reshape(n, k)
    k_blocks = k // bs
    if layout.zero_points is None:
        zp = np.full((n, k_blocks), 1 << (layout.bits - 1), dtype=np.float32)
    else:
        zp = unpacked_zero_points(layout, n, k_blocks).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        value = (codes.astype(np.float32).reshape(n, k_blocks, bs) - zp[..., None]) * (
            layout.scales.reshape(n, k_blocks, 1)
        )
        value = value.reshape(n, k)
        if layout.mins is not None:  # one min per 32 elements
            value = (value.reshape(n, k // 32, 32) - layout.mins[..., None]).reshape(n, k)
    return value


@pytest.mark.parametrize("type_name", TYPES)
def test_relayout_decodes_to_gguf_values_bit_for_bit(type_name: str) -> None:
    n, k = 6, 512
    rows = ggml_rows(type_name, n, k, seed=1, finite_scales=False)
    layout = to_nbits_layout(type_name, rows)
    expected = gguf_values(type_name, rows, n)
    got = schema_dequant(layout, n, k)
    assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist()
    assert layout.b.dtype == np.uint8 and layout.scales.dtype == np.float32
    if layout.zero_points is not None:
        assert layout.zero_points.dtype == np.uint8
    assert sorted(layout.arrays()) == sorted(layout_parts(type_name))


def test_centered_q4_k_decodes_to_gguf_values_bit_for_bit() -> None:
    """Per-block zero points z = round(b / a) with the residual min b - a z: every value is
    gguf-py's float32, on random blocks (special fp16 scales: blocks whose residual is not
    exact keep z = 0) and on a quantized Gaussian (mins near the code range's middle)."""
    n, k = 64, 512
    rng = np.random.default_rng(7)
    special = random_rows(rng, "Q4_K", (n,), k // 256)
    realistic = q4_k_quantize(rng.standard_normal((n, k)).astype(np.float32))
    layouts = {}
    for name, rows in (("special", special), ("realistic", realistic)):
        layout = layouts[name] = to_nbits_layout("Q4_K", rows, center_mins=True)
        expected = gguf_values("Q4_K", rows, n)
        got = schema_dequant(layout, n, k)
        assert got.view(np.uint32).tolist() == expected.view(np.uint32).tolist()
        assert sorted(layout.arrays()) == sorted(layout_parts("Q4_K"))
    code = exact_codes("Q4_K", special)
    z = unpacked_zero_points(layouts["special"], n, k // 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = code.mins.astype(np.float64) / code.scales
    assert np.any((z == 0) & np.isfinite(ratio) & (ratio >= 1))  # fallbacks were exercised
    assert np.any(z > 0)
    assert np.array_equal(layouts["special"].mins[z == 0], code.mins[z == 0])
    # the quantized Gaussian: every block centered at round(b / a), the residual within half
    # a step
    code = exact_codes("Q4_K", realistic)
    z = unpacked_zero_points(layouts["realistic"], n, k // 32)
    assert np.array_equal(z, np.rint(code.mins.astype(np.float64) / code.scales))
    assert np.all(np.abs(layouts["realistic"].mins) <= code.scales / 2)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "IQ2_XXS"])
def test_smaller_blocks_and_repeated_rows_are_the_same_values(type_name: str) -> None:
    n, k = 3, 256
    rows = ggml_rows(type_name, n, k, seed=2, finite_scales=True)
    layout = to_nbits_layout(type_name, rows, block_size=16, repeat=2)
    expected = gguf_values(type_name, rows, n)
    got = schema_dequant(layout, 2 * n, k)
    assert np.array_equal(got, np.repeat(expected, 2, axis=0))  # [u0, u0, u1, u1, ...]


def test_byte_costs_are_the_issue_figures() -> None:
    # B + float32 scales (+ uint8 zero points, + mins) over the ggml bytes, from the layouts
    assert round(layout_cost("Q4_K"), 2) == 1.36
    assert round(layout_cost("Q6_K"), 2) == 1.52
    assert round(layout_cost("IQ2_XXS"), 1) == 4.4
    assert round(layout_cost("Q8_0"), 2) == 1.06


def test_no_exact_layout_is_one_clear_error() -> None:
    rows = random_blocks("Q5_K", (2, 256), np.random.default_rng(0))
    with pytest.raises(ValueError, match="Q5_K has no exact integer-code form"):
        to_nbits_layout("Q5_K", rows)


@pytest.mark.parametrize(
    ("type_name", "data"), [*((t, "random") for t in TYPES), ("Q4_K", "quantized")]
)
def test_matmulnbits_accuracy0_matches_float64(type_name: str, data: str) -> None:
    """Q4_K with its centered zero points (the package's MatMulNBits layout), on random
    blocks and on a quantized Gaussian."""
    n, k, m = 24, 512, 3
    if data == "quantized":
        rng = np.random.default_rng(8)
        rows = q4_k_quantize(rng.standard_normal((n, k)).astype(np.float32))
    else:
        rows = ggml_rows(type_name, n, k, seed=3, finite_scales=True)
    layout = to_nbits_layout(type_name, rows, center_mins=True)
    w = gguf_values(type_name, rows, n).astype(np.float64)
    x = np.random.default_rng(4).standard_normal((m, k)).astype(np.float32)
    names = list(layout.arrays())

    def emit(op, x_value, *parts):
        params = dict(zip(names, parts, strict=True))
        return emit_exact_nbits_matmul(
            op, x_value, params, k, n, layout.bits, layout.block_size, accuracy_level=0
        )

    inputs = [x, *layout.arrays().values()]
    (y,) = run_emitter(lambda op, *v: emit(op, v[0], *v[1:]), inputs, opset_imports=CONTRIB)
    expected = x.astype(np.float64) @ w.T
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T
    assert np.all(np.abs(y - expected) <= REL_TOL * scale)
    result = compare("matmulnbits", y, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_matmulnbits_with_bias_matches_float64(type_name: str) -> None:
    """A bias rides on MatMulNBits, or (with Q4_K's min term) on the correction Gemm."""
    n, k, m = 16, 256, 2
    rows = ggml_rows(type_name, n, k, seed=5, finite_scales=True)
    layout = to_nbits_layout(type_name, rows, center_mins=True)
    w = gguf_values(type_name, rows, n).astype(np.float64)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    names = list(layout.arrays())

    def emit(op, x_value, bias_value, *parts):
        params = dict(zip(names, parts, strict=True))
        return emit_exact_nbits_matmul(
            op, x_value, params, k, n, layout.bits, layout.block_size, bias=bias_value
        )

    (y,) = run_emitter(emit, [x, bias, *layout.arrays().values()], opset_imports=CONTRIB)
    expected = x.astype(np.float64) @ w.T + bias
    scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + np.abs(bias)
    assert np.all(np.abs(y - expected) <= REL_TOL * scale)
