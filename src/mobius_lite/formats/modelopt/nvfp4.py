"""ModelOpt NVFP4 linears: E2M1 codes, one E4M3 scale per 16 inputs, one FP32 global scale.

Storage of a linear X with logical weight [N, K] (leading dims, e.g. stacked experts, allowed):
  X.weight          uint8 [..., N, K/2]   two codes per byte, low nibble = even k
  X.weight_scale    E4M3FN [..., N, K/16] block scales
  X.weight_scale_2  FP32 [...]            global multiplier (scalar for one linear)
  X.input_scale     FP32 scalar           activation scale of the W4A4 recipe (not used here)
Dequantized W[n, k] = (e2m1(code) * e4m3(scale[n, k // 16])) * scale_2, in float32, in that
order: the first product is exact (2 + 4 significant bits), so only the multiply by scale_2
rounds. The graphs use the same order and are bit-exact with `dequantize`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.errors import CheckpointError
from mobius_lite.formats.contrib import contrib_op
from mobius_lite.formats.modelopt.fp8 import (
    E4M3_VALUES,
    e4m3_to_float32,
    gather_widened,
    type_matmul_output,
)

FLOAT = ir.DataType.FLOAT
GROUP_SIZE = 16


def _e2m1_table() -> np.ndarray:
    """The 16 E2M1 values by code (1 sign, 2 exponent bits with bias 1, 1 mantissa bit)."""
    codes = np.arange(16)
    sign = np.where(codes & 0x8, -1.0, 1.0)
    exponent = (codes >> 1) & 0x3
    mantissa = codes & 0x1
    magnitude = np.where(
        exponent == 0, 0.5 * mantissa, (1.0 + 0.5 * mantissa) * np.exp2(exponent - 1)
    )
    return (sign * magnitude).astype(np.float32)


E2M1_VALUES: np.ndarray = _e2m1_table()  # 0, .5, 1, 1.5, 2, 3, 4, 6, -0, -.5, ..., -6


def unpack_codes(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., K/2] -> codes uint8 [..., K]: byte j holds k = 2j (low) and 2j + 1 (high)."""
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1)
    return codes.reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))


def _byte_pairs() -> np.ndarray:
    """float32 [256, 2]: the two E2M1 values of every byte (low nibble = even k first)."""
    return E2M1_VALUES[unpack_codes(np.arange(256, dtype=np.uint8)[:, None])]


def pack_codes(codes: np.ndarray) -> np.ndarray:
    """codes uint8 [..., K] (K even, values < 16) -> uint8 [..., K/2], the stored layout."""
    codes = codes.astype(np.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)


BYTE_PAIRS: np.ndarray = _byte_pairs()


def dequantize(
    weight: np.ndarray,
    weight_scale: np.ndarray,
    weight_scale_2: np.ndarray | float,
    name: str = "weight",
) -> np.ndarray:
    """Dense float32 [..., N, K] from the stored NVFP4 tensors (reference decode, see module)."""
    packed = np.asarray(weight)
    if packed.dtype != np.uint8:
        raise TypeError(f"{name}: NVFP4 codes are stored as uint8, got {packed.dtype}")
    k = packed.shape[-1] * 2
    expected = packed.shape[:-1] + (k // GROUP_SIZE,)
    if k % GROUP_SIZE or tuple(weight_scale.shape) != expected:
        raise CheckpointError(
            f"{name}: block scales have shape {tuple(weight_scale.shape)}, expected {expected} "
            f"(one per {GROUP_SIZE} of K={k})"
        )
    scale_2 = np.asarray(weight_scale_2, dtype=np.float32)
    if not np.isfinite(scale_2).all():
        raise CheckpointError(f"{name}_scale_2: the global scale is not finite")
    values = E2M1_VALUES[unpack_codes(packed)].reshape(expected + (GROUP_SIZE,))
    scales = e4m3_to_float32(weight_scale, f"{name}_scale")
    blocked = values * scales[..., None]  # exact
    dense = blocked.reshape(packed.shape[:-1] + (k,))
    return dense * scale_2.reshape(scale_2.shape + (1, 1))


def fp4_tensor(packed: np.ndarray, name: str) -> ir.PackedTensor:
    """The stored bytes uint8 [..., N, K/2] as a FLOAT4E2M1 [..., N, K] tensor (same bytes).

    ONNX packs 4-bit elements two per byte with the even index in the low nibble, which is
    ModelOpt's layout, so no byte changes.
    """
    shape = list(packed.shape[:-1]) + [packed.shape[-1] * 2]
    return ir.PackedTensor(
        np.ascontiguousarray(packed, dtype=np.uint8),
        ir.DataType.FLOAT4E2M1,
        shape=ir.Shape(shape),
        name=name,
    )


def _widen_rows(op: OpBuilder, data: ir.Value, indices: ir.Value) -> ir.Value:
    """data[indices] along axis 0 as FLOAT, for FLOAT4E2M1 / FLOAT8E4M3FN data (exact).

    onnxruntime's CPU kernels for Gather, Cast and DequantizeLinear take neither 4-bit floats
    nor (Gather) float8; com.microsoft GatherBlockQuantized takes both. Scale 1, one block.
    """
    return gather_widened(op, data, indices)


def _all_rows(op: OpBuilder, data: ir.Value) -> ir.Value:
    rows = op.Squeeze(op.Shape(data, start=0, end=1), op.Constant(value_ints=[0]))
    zero = op.Constant(value=ir.tensor(0, dtype=ir.DataType.INT64))
    one = op.Constant(value=ir.tensor(1, dtype=ir.DataType.INT64))
    return op.Range(zero, rows, one)


def _code_values(op: OpBuilder, weight: ir.Value, indices: ir.Value | None) -> ir.Value:
    """E2M1 values as FLOAT: [..., N, K] (FLOAT4E2M1 storage) or [..., N, K/2, 2] (uint8)."""
    dtype = weight.dtype
    if dtype == ir.DataType.FLOAT4E2M1:
        return _widen_rows(op, weight, _all_rows(op, weight) if indices is None else indices)
    if dtype != ir.DataType.UINT8:
        raise ValueError(f"{weight.name}: NVFP4 codes must be FLOAT4E2M1 or UINT8, not {dtype}")
    packed = weight if indices is None else op.Gather(weight, indices, axis=0)
    axis = op.Constant(value_ints=[-1])
    low = op.BitwiseAnd(packed, op.Constant(value=ir.tensor(np.uint8(0x0F))))
    high = op.BitShift(packed, op.Constant(value=ir.tensor(np.uint8(4))), direction="RIGHT")
    codes = op.Concat(op.Unsqueeze(low, axis), op.Unsqueeze(high, axis), axis=-1)
    table = op.Constant(value=ir.tensor(E2M1_VALUES))
    return op.Gather(table, op.Cast(codes, to=ir.DataType.INT32), axis=0)


def _scale_values(op: OpBuilder, weight_scale: ir.Value, indices: ir.Value | None) -> ir.Value:
    """E4M3 block scales as FLOAT [..., N, K/16], from FLOAT8E4M3FN or raw UINT8 bytes."""
    dtype = weight_scale.dtype
    if dtype == ir.DataType.FLOAT8E4M3FN:
        if indices is None:
            return op.Cast(weight_scale, to=FLOAT)
        return _widen_rows(op, weight_scale, indices)
    if dtype != ir.DataType.UINT8:
        raise ValueError(
            f"{weight_scale.name}: NVFP4 block scales must be FLOAT8E4M3FN or UINT8, not {dtype}"
        )
    raw = weight_scale if indices is None else op.Gather(weight_scale, indices, axis=0)
    table = op.Constant(value=ir.tensor(E4M3_VALUES))
    return op.Gather(table, op.Cast(raw, to=ir.DataType.INT32), axis=0)


def _combine(op: OpBuilder, codes: ir.Value, scales: ir.Value, scale_2: ir.Value) -> ir.Value:
    """(codes * block scale) * scale_2 -> FLOAT [..., N, K], the reference's order."""
    blocked_shape = op.Concat(op.Shape(scales), op.Constant(value_ints=[GROUP_SIZE]), axis=0)
    blocked = op.Mul(
        op.Reshape(codes, blocked_shape), op.Unsqueeze(scales, op.Constant(value_ints=[-1]))
    )
    dense_shape = op.Concat(op.Shape(scales, start=0, end=-1), op.Constant(value_ints=[-1]), axis=0)
    dense = op.Reshape(blocked, dense_shape)
    # scalar -> [1, 1]; per-expert [E] -> [E, 1, 1]
    return op.Mul(dense, op.Unsqueeze(scale_2, op.Constant(value_ints=[-2, -1])))


def emit_dense(
    op: OpBuilder, weight: ir.Value, weight_scale: ir.Value, weight_scale_2: ir.Value
) -> ir.Value:
    """FLOAT [..., N, K] from NVFP4 storage; leading dims (stacked experts) allowed.

    weight: FLOAT4E2M1 [..., N, K] or UINT8 [..., N, K/2] (same bytes); weight_scale:
    FLOAT8E4M3FN or UINT8 [..., N, K/16]; weight_scale_2: FLOAT [] or [...] (per expert).
    """
    return _combine(
        op,
        _code_values(op, weight, None),
        _scale_values(op, weight_scale, None),
        weight_scale_2,
    )


def emit_dense_at_run_time(
    op: OpBuilder, weight: ir.Value, weight_scale: ir.Value, weight_scale_2: ir.Value
) -> ir.Value:
    """FLOAT [..., N, K] like `emit_dense`, decoded at every run instead of once at load.

    onnxruntime constant-folds a decode whose inputs are all initializers (bit ops, Gather,
    Cast, Mul) into a dense FLOAT initializer when the session is created, so the packed
    bytes would be dense in memory. Its constant folding leaves DequantizeLinear alone, so
    both chains start there: the code bytes (UINT8) and the block scales (FLOAT8E4M3FN) are
    widened to FLOAT by DequantizeLinear with scale 1 (exact); each byte then looks up its two
    E2M1 values in a [256, 2] table (low nibble first), and the rest is `emit_dense`'s math.
    """
    for value, dtype in ((weight, ir.DataType.UINT8), (weight_scale, ir.DataType.FLOAT8E4M3FN)):
        if value.dtype != dtype:
            raise ValueError(
                f"{value.name}: run-time NVFP4 decode needs {dtype}, not {value.dtype}"
            )
    one = op.Constant(value=ir.tensor(np.float32(1.0)))
    byte = op.Cast(op.DequantizeLinear(weight, one), to=ir.DataType.INT64)  # [..., N, K/2]
    pairs = op.Constant(value=ir.tensor(BYTE_PAIRS))
    values = op.Gather(pairs, byte, axis=0)  # [..., N, K/2, 2]
    scales = op.DequantizeLinear(weight_scale, one)
    return _combine(op, values, scales, weight_scale_2)


def emit_rows(
    op: OpBuilder,
    weight: ir.Value,
    weight_scale: ir.Value,
    weight_scale_2: ir.Value,
    indices: ir.Value,
    per_row_scale_2: bool = True,
) -> ir.Value:
    """FLOAT [S, N, K]: experts `indices` [S] of stacked [E, ...] NVFP4 storage, dequantized.

    Only the selected experts are gathered and decoded (the packed bytes are what is gathered).
    `per_row_scale_2`: weight_scale_2 is [E] (one per expert, gathered with them); False: one
    scalar for the whole tensor (rows of a single linear, e.g. an embedding table).
    """
    # a scalar scale_2 broadcasts over [S, N, K] as it is; per-expert ones are gathered
    scale_2 = op.Gather(weight_scale_2, indices, axis=0) if per_row_scale_2 else weight_scale_2
    return _combine(
        op, _code_values(op, weight, indices), _scale_values(op, weight_scale, indices), scale_2
    )


def emit_matmul_ort(
    op: OpBuilder,
    x: ir.Value,
    weight: ir.Value,
    weight_scale: ir.Value,
    weight_scale_2: ir.Value,
    input_scale: ir.Value | None = None,
) -> ir.Value:
    """y = x W^T with onnxruntime's CUDA MatMulBlockQuantizedFp4Weight (x FLOAT16/BFLOAT16).

    The kernel reads ModelOpt's layout unchanged but its inputs are typed uint8: the codes
    UINT8 [N, K/2] and the block scales as raw UINT8 bytes [N, K/16] (the same bytes as the
    FLOAT4E2M1 / FLOAT8E4M3FN storage). It multiplies e2m1 * scale_2 * e4m3 and rounds the
    weight to x's dtype, so it agrees with `dequantize` to 16-bit rounding, not bit for bit.
    `input_scale` is accepted and unused by the weight-only kernel. CUDA only in onnxruntime 1.32.
    """
    for value in (weight, weight_scale):
        if value.dtype != ir.DataType.UINT8:
            raise ValueError(
                f"{value.name}: the ort route needs UINT8 storage of the same bytes, not "
                f"{value.dtype}"
            )
    inputs = [x, weight, weight_scale, weight_scale_2]
    if input_scale is not None:
        inputs.append(input_scale)
    y = op.MatMulBlockQuantizedFp4Weight(*inputs, block_size=GROUP_SIZE, **contrib_op(op))
    return type_matmul_output(y, x, weight)
