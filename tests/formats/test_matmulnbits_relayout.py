"""Exact re-layouts of ggml blocks onto MatMulNBits with uint8 zero points (nbits_layout.py).

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

from gguf_fixtures import random_blocks
from mobius_lite.formats.ggml.nbits_layout import (
    NBitsLayout,
    layout_cost,
    layout_parts,
    to_nbits_layout,
)
from mobius_lite.formats.ggml.nbits_matmul import emit_exact_nbits_matmul

from .emit_harness import run_emitter
from .ggml_data import random_rows

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
    elif layout.bits == 8:
        zp = layout.zero_points.astype(np.float32)
    else:
        zp = np.stack([layout.zero_points & 0xF, layout.zero_points >> 4], -1).reshape(n, -1)
        zp = zp[:, :k_blocks].astype(np.float32)
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


@pytest.mark.parametrize("type_name", TYPES)
def test_matmulnbits_accuracy0_matches_float64(type_name: str) -> None:
    n, k, m = 24, 512, 3
    rows = ggml_rows(type_name, n, k, seed=3, finite_scales=True)
    layout = to_nbits_layout(type_name, rows)
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


@pytest.mark.parametrize("type_name", ["Q4_K", "Q6_K"])
def test_matmulnbits_with_bias_matches_float64(type_name: str) -> None:
    """A bias rides on MatMulNBits, or (with Q4_K's min term) on the correction Gemm."""
    n, k, m = 16, 256, 2
    rows = ggml_rows(type_name, n, k, seed=5, finite_scales=True)
    layout = to_nbits_layout(type_name, rows)
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
