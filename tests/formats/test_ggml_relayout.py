"""Q8_0 / Q4_0 -> com.microsoft MatMulNBits re-layouts: lossless, and numerically the weight.

Oracles: the original bytes (round trip), the MatMulNBits schema's dequantization formula
(code - zero_point) * scale against the ggml numpy decode, and x @ W^T in float64.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import (
    MatMulNBitsWeights,
    emit_matmulnbits,
    from_matmulnbits,
    to_matmulnbits,
)
from mobius_lite.formats.ggml.types import GGML_TYPES

from .emit_harness import run_emitter
from .ggml_data import random_rows

CODECS = {name: GGML_TYPES[name].codec for name in ("Q8_0", "Q4_0")}
BITS = {"Q8_0": 8, "Q4_0": 4}
# odd N; K = 64 gives an even number of K blocks, K = 96 an odd one (a padded zero-point byte)
SIZES = [(5, 64), (7, 96)]
CASES = [(t, n, k) for t in CODECS for n, k in SIZES]
CASE_IDS = [f"{t}-N{n}-K{k}" for t, n, k in CASES]

# Fixed before running: MatMulNBits accumulates K <= 96 float32 products, so its error is at
# most ~K * 2**-24 * sum|x||w| ~= 5.7e-6 * sum|x||w|; gate at 1e-5 * sum|x||w| per output.
REL_TOL = 1e-5


def weight(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    return random_rows(np.random.default_rng(seed), type_name, (n,), k // 32)


def unpack_schema(w: MatMulNBitsWeights, n: int, k: int) -> np.ndarray:
    """dequant(B) [N, K] as the MatMulNBits schema defines it, in float32."""
    if w.bits == 8:
        codes = w.b.reshape(n, k)
    else:  # element 2i in the low nibble of byte i, 2i + 1 in the high nibble
        codes = np.stack([w.b & 0xF, w.b >> 4], axis=-1).reshape(n, k)
    k_blocks = k // w.block_size
    if w.zero_points is None:
        zp = np.full((n, k_blocks), 1 << (w.bits - 1), dtype=np.float32)
    elif w.bits == 8:
        zp = w.zero_points.astype(np.float32)
    else:
        zp = np.stack([w.zero_points & 0xF, w.zero_points >> 4], -1).reshape(n, -1)[:, :k_blocks]
        zp = zp.astype(np.float32)
    per_block = (codes.astype(np.float32).reshape(n, k_blocks, w.block_size) - zp[..., None]) * (
        w.scales.astype(np.float32)[..., None]
    )
    return per_block.reshape(n, k)


@pytest.mark.parametrize("explicit_zero_points", [False, True], ids=["default_zp", "explicit_zp"])
@pytest.mark.parametrize(("type_name", "n", "k"), CASES, ids=CASE_IDS)
def test_round_trip_is_byte_exact(
    type_name: str, n: int, k: int, explicit_zero_points: bool
) -> None:
    data = weight(type_name, n, k, 11)
    w = to_matmulnbits(type_name, data, k, explicit_zero_points=explicit_zero_points)
    bits, k_blocks = BITS[type_name], k // 32
    assert (w.bits, w.block_size) == (bits, 32)
    assert w.b.dtype == np.uint8 and w.b.shape == (n, k_blocks, 32 * bits // 8)
    assert w.scales.dtype == np.float16 and w.scales.shape == (n, k_blocks)
    if explicit_zero_points:
        assert w.zero_points is not None
        assert w.zero_points.dtype == np.uint8
        assert w.zero_points.shape == (n, -(-k_blocks * bits // 8))
    else:
        assert w.zero_points is None
    back = from_matmulnbits(type_name, w, k)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, data)


@pytest.mark.parametrize("explicit_zero_points", [False, True], ids=["default_zp", "explicit_zp"])
@pytest.mark.parametrize(("type_name", "n", "k"), CASES, ids=CASE_IDS)
def test_schema_dequantization_is_the_ggml_decode(
    type_name: str, n: int, k: int, explicit_zero_points: bool
) -> None:
    data = weight(type_name, n, k, 12)
    w = to_matmulnbits(type_name, data, k, explicit_zero_points=explicit_zero_points)
    expected = CODECS[type_name].dequantize(data)
    np.testing.assert_array_equal(unpack_schema(w, n, k).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("as_initializers", [False, True], ids=["input", "initializer"])
@pytest.mark.parametrize("explicit_zero_points", [False, True], ids=["default_zp", "explicit_zp"])
@pytest.mark.parametrize(("type_name", "n", "k"), CASES, ids=CASE_IDS)
def test_matmulnbits_in_onnxruntime_matches_float64(
    type_name: str, n: int, k: int, explicit_zero_points: bool, as_initializers: bool
) -> None:
    rng = np.random.default_rng(13)
    data = weight(type_name, n, k, 14)
    w = to_matmulnbits(type_name, data, k, explicit_zero_points=explicit_zero_points)
    x = rng.standard_normal((2, 3, k)).astype(np.float32)
    arrays = [x, w.b, w.scales] + ([w.zero_points] if explicit_zero_points else [])

    def emit(
        op: OpBuilder, xv: ir.Value, bv: ir.Value, sv: ir.Value, zv: ir.Value | None = None
    ) -> ir.Value:
        y = emit_matmulnbits(op, xv, bv, sv, zv, k, n, w.bits, w.block_size)
        assert op.builder.root.graph.opset_imports["com.microsoft"] == 1
        return y

    (y,) = run_emitter(emit, arrays, as_initializers=as_initializers)
    weights = CODECS[type_name].dequantize(data).astype(np.float64)
    reference = x.astype(np.float64) @ weights.T
    bound = REL_TOL * (np.abs(x.astype(np.float64)) @ np.abs(weights).T)
    assert y.shape == (2, 3, n) and y.dtype == np.float32
    assert np.all(np.abs(y - reference) <= bound), np.max(np.abs(y - reference) / bound)


def test_relayout_rejects_what_it_cannot_keep() -> None:
    data = weight("Q4_0", 3, 64, 15)
    with pytest.raises(ValueError, match="no lossless"):
        to_matmulnbits("Q4_1", data, 64)
    with pytest.raises(ValueError, match="must be uint8"):
        to_matmulnbits("Q4_0", data, 96)
    w = to_matmulnbits("Q4_0", data, 64, explicit_zero_points=True)
    assert w.zero_points is not None
    shifted = MatMulNBitsWeights(w.b, w.scales, w.zero_points + 1, w.bits, w.block_size)
    with pytest.raises(ValueError, match="constant zero point"):
        from_matmulnbits("Q4_0", shifted, 64)
    widened = MatMulNBitsWeights(w.b, w.scales.astype(np.float32), None, w.bits, w.block_size)
    with pytest.raises(ValueError, match="float16"):
        from_matmulnbits("Q4_0", widened, 64)
