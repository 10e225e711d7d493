"""ModelOpt FP8 linears: E4M3FN weights [N, K] with one FP32 scale per tensor.

Dequantized W[n, k] = e4m3(weight[n, k]) * weight_scale, one float32 multiply (one rounding).
`input_scale` is the static activation scale of the W8A8 recipe; the CPU graphs compute with
float activations and do not use it. E4M3FN has no infinities; 0x7F / 0xFF are NaN and a
checkpoint holding them is refused.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.errors import CheckpointError
from mobius_lite.formats.contrib import contrib_op

FLOAT = ir.DataType.FLOAT
E4M3_NAN_BITS = (0x7F, 0xFF)
E4M3_MAX = 448.0
ORT_FP8_BLOCK = 128  # MatMulBlockQuantizedFp8Weight's default block_size


def _e4m3_table() -> np.ndarray:
    """All 256 E4M3FN values by bit pattern, from the definition (bias 7, no infinities)."""
    bits = np.arange(256, dtype=np.uint32)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent = ((bits >> 3) & 0xF).astype(np.int64)
    mantissa = (bits & 0x7).astype(np.float64)
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = (mantissa / 8.0) * 2.0**-6
    values = sign * np.where(exponent == 0, subnormal, normal)
    values[list(E4M3_NAN_BITS)] = np.nan
    return values.astype(np.float32)


E4M3_VALUES: np.ndarray = _e4m3_table()  # float32 [256], index = the stored byte


def e4m3_bits(array: np.ndarray) -> np.ndarray:
    """The stored bytes of an E4M3 array (ml_dtypes float8_e4m3fn or raw uint8), as uint8."""
    if array.dtype.itemsize != 1:
        raise TypeError(f"E4M3 data is one byte per value, got dtype {array.dtype}")
    return np.ascontiguousarray(array).view(np.uint8)


def check_e4m3_finite(bits: np.ndarray, name: str) -> None:
    """Refuse NaN bit patterns (0x7F, 0xFF): a NaN weight or scale means a broken source."""
    bad = np.isin(bits, E4M3_NAN_BITS)
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise CheckpointError(
            f"{name}: {int(bad.sum())} E4M3 value(s) are NaN (bit pattern 0x7F/0xFF), first at "
            f"index {first}; the checkpoint is broken, re-export it"
        )


def e4m3_to_float32(array: np.ndarray, name: str) -> np.ndarray:
    """Decode E4M3FN bytes to float32 exactly (subnormals included); NaN patterns are refused."""
    bits = e4m3_bits(array)
    check_e4m3_finite(bits, name)
    return E4M3_VALUES[bits]


def dequantize(
    weight: np.ndarray, weight_scale: np.ndarray | float, name: str = "weight"
) -> np.ndarray:
    """Dense float32 [..., N, K] from E4M3 weights and their FP32 scale (scalar or [...])."""
    values = e4m3_to_float32(weight, name)
    scale = np.asarray(weight_scale, dtype=np.float32)
    return values * scale.reshape(scale.shape + (1, 1))


def _per_row_scale(op: OpBuilder, weight_scale: ir.Value) -> ir.Value:
    # scalar -> [1, 1]; per-expert [E] -> [E, 1, 1]: broadcasts over the trailing [N, K]
    return op.Unsqueeze(weight_scale, op.Constant(value_ints=[-2, -1]))


def emit_dense(op: OpBuilder, weight: ir.Value, weight_scale: ir.Value) -> ir.Value:
    """FLOAT [..., N, K] from FLOAT8E4M3FN [..., N, K] and FLOAT scale [] or [...] (per expert).

    Cast to float32 is exact; the one multiply rounds exactly like `dequantize`.
    """
    return op.Mul(op.Cast(weight, to=FLOAT), _per_row_scale(op, weight_scale))


def emit_rows(
    op: OpBuilder, weight: ir.Value, weight_scale: ir.Value, indices: ir.Value
) -> ir.Value:
    """FLOAT [S, N, K]: the experts `indices` [S] of stacked [E, N, K] weights, dequantized.

    onnxruntime's CPU Gather has no float8 kernel, so the rows are gathered and widened in one
    com.microsoft GatherBlockQuantized (scale 1: exact), then scaled per expert.
    """
    rows = gather_widened(op, weight, indices)
    scale = op.Gather(weight_scale, indices, axis=0)
    return op.Mul(rows, _per_row_scale(op, scale))


def gather_widened(op: OpBuilder, data: ir.Value, indices: ir.Value) -> ir.Value:
    """data[indices] along axis 0 as FLOAT, for FLOAT8E4M3FN / FLOAT4E2M1 data (exact).

    onnxruntime's CPU Gather and Cast take no 4-bit floats and Gather no float8;
    com.microsoft GatherBlockQuantized takes both (scale 1, one block per row). Its output
    is typed here: ONNX type inference does not know the contrib op, and an untyped value
    would leave everything downstream (an If that contains it) untyped.
    """
    if data.shape is None:
        raise ValueError(f"{data.name}: gathering rows needs a value of known rank")
    rank = data.shape.rank()
    ones = op.Constant(value=ir.tensor(np.ones((1,) * rank, dtype=np.float32)))
    rows = op.GatherBlockQuantized(
        data,
        indices,
        ones,
        block_size=0,
        quantize_axis=rank - 1,
        gather_axis=0,
        **contrib_op(op),
    )
    rows.type = ir.TensorType(FLOAT)
    if indices.shape is not None:
        rows.shape = ir.Shape([*indices.shape.dims, *data.shape.dims[1:]])
    return rows


def emit_matmul_ort(
    op: OpBuilder,
    x: ir.Value,
    weight: ir.Value,
    weight_scale: ir.Value,
    in_features: int,
    input_scale: ir.Value | None = None,
) -> ir.Value:
    """y = x W^T with onnxruntime's CUDA MatMulBlockQuantizedFp8Weight (x FLOAT16/BFLOAT16).

    The per-tensor scale is repeated into the kernel's default 128-wide K blocks
    (b_scale [N, ceil(K / 128)], every entry the same scale). With `input_scale` the kernel
    quantizes x to E4M3 first (the W8A8 recipe); without it x stays 16-bit (W8A16).
    onnxruntime 1.32 registers this op for CUDA only.
    """
    blocks = -(-in_features // ORT_FP8_BLOCK)
    b_scale = op.Expand(
        op.Reshape(weight_scale, op.Constant(value_ints=[1, 1])),
        op.Concat(op.Shape(weight, start=0, end=1), op.Constant(value_ints=[blocks]), axis=0),
    )
    inputs = [x, weight, b_scale] + ([input_scale] if input_scale is not None else [])
    y = op.MatMulBlockQuantizedFp8Weight(*inputs, block_size=ORT_FP8_BLOCK, **contrib_op(op))
    return type_matmul_output(y, x, weight)


def type_matmul_output(y: ir.Value, x: ir.Value, weight: ir.Value) -> ir.Value:
    """Give a contrib matmul's output x's dtype and shape [..., N] (the builder infers none)."""
    y.type = ir.TensorType(x.dtype)
    if x.shape is not None and weight.shape is not None:
        y.shape = ir.Shape([*x.shape.dims[:-1], weight.shape.dims[0]])
    return y
