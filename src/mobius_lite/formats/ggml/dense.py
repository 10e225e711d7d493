"""ggml's unquantized types F32, F16, BF16 as "codecs": little-endian row bytes -> float32.

They let a GGUF tensor of any type go through the same byte-level path (one element per
"block"). Every decode is exact: F32 and BF16 are pure bit moves (NaN payloads included),
F16 widens through the exact fp16 -> fp32 conversion.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    FLOAT,
    BlockDecode,
    const,
    emit_f16_bits_to_float,
    emit_le_uint,
    emit_shift,
    f16_at,
    le_uint,
)


def _f32(blocks: np.ndarray) -> np.ndarray:
    return le_uint(blocks, np.uint32).view(np.float32)


def _f16(blocks: np.ndarray) -> np.ndarray:
    return f16_at(blocks, 0)


def _bf16(blocks: np.ndarray) -> np.ndarray:
    # bf16 is the top half of an fp32: widen by placing its bits in bits 16..31
    return (le_uint(blocks, np.uint32) << np.uint32(16)).view(np.float32)


def _emit_f32(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    return op.BitCast(emit_le_uint(op, blocks, 4, ir.DataType.UINT32), to=FLOAT)


def emit_f16_keeping_nan_payload(op: OpBuilder, fields: ir.Value) -> ir.Value:
    """Little-endian fp16 bytes [..., 2] -> FLOAT [..., 1], NaN payloads kept bit for bit.

    onnxruntime's Cast sets the quiet bit of signalling NaNs; numpy and ggml keep the
    payload (f32 bits = sign | 0x7f800000 | mantissa << 13), so NaNs take a bit path. Needed
    where the widened value reaches the output without arithmetic (F16, Q1_0's +-d)."""
    bits16 = emit_le_uint(op, fields, 2, ir.DataType.UINT16)
    bits = op.Cast(bits16, to=ir.DataType.UINT32)
    is_nan = op.Greater(_and(op, bits, 0x7FFF), _u32(op, 0x7C00))
    sign = emit_shift(op, _and(op, bits, 0x8000), 16, "LEFT")
    mantissa = emit_shift(op, _and(op, bits, 0x3FF), 13, "LEFT")
    nan_bits = op.BitwiseOr(op.BitwiseOr(sign, _u32(op, 0x7F800000)), mantissa)
    return op.Where(is_nan, op.BitCast(nan_bits, to=FLOAT), emit_f16_bits_to_float(op, bits16))


def _u32(op: OpBuilder, value: int) -> ir.Value:
    return const(op, [value], np.uint32)


def _and(op: OpBuilder, value: ir.Value, mask: int) -> ir.Value:
    return op.BitwiseAnd(value, _u32(op, mask))


def _emit_bf16(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    return op.BitCast(
        emit_shift(op, emit_le_uint(op, blocks, 2, ir.DataType.UINT32), 16, "LEFT"), to=FLOAT
    )


F32 = BlockDecode(_f32, _emit_f32)
F16 = BlockDecode(_f16, emit_f16_keeping_nan_payload)
BF16 = BlockDecode(_bf16, _emit_bf16)

DECODES: tuple[BlockDecode, ...] = (F32, F16, BF16)
