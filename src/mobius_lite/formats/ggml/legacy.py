"""ggml's legacy 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Block layouts (ggml-common.h), byte offsets inside one block:
  Q4_0 (18): d f16 @0, qs[16] @2          y = (q - 8) * d
  Q4_1 (20): d f16 @0, m f16 @2, qs[16] @4  y = q * d + m
  Q5_0 (22): d f16 @0, qh[4] @2, qs[16] @6  y = (q - 16) * d
  Q5_1 (24): d f16 @0, m f16 @2, qh[4] @4, qs[16] @8   y = q * d + m
  Q8_0 (34): d f16 @0, qs int8[32] @2      y = q * d
A 4-bit block keeps element j (j < 16) in the low nibble of qs[j] and element j + 16 in its
high nibble; the 5-bit types keep bit 4 of element e in bit e of qh read as a little-endian
uint32. Every product is exact in float32 (an 11-bit fp16 significand times a <= 8-bit
integer); Q4_1 / Q5_1 round once, in the final add.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    BlockDecode,
    as_int8,
    bit_fields,
    const,
    emit_bit_fields,
    emit_bytes,
    emit_f16_at,
    emit_float,
    emit_int8,
    emit_or_high,
    emit_reshape,
    f16_at,
)

# ---------------------------------------------------------------------------- numpy


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [..., 16] -> codes [..., 32]: low nibbles are elements 0..15, high 16..31."""
    return bit_fields(qs, 4, 2, axis=-2).reshape(*qs.shape[:-1], 32)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """qh [..., 4] -> bit e of the little-endian uint32, [..., 32]."""
    return bit_fields(qh, 1, 8, axis=-1).reshape(*qh.shape[:-1], 32)


def _q4_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)
    q = _nibbles(blocks[..., 2:18]).astype(np.float32) - np.float32(8)
    return q * d


def _q4_1(blocks: np.ndarray) -> np.ndarray:
    d, m = f16_at(blocks, 0), f16_at(blocks, 2)
    q = _nibbles(blocks[..., 4:20]).astype(np.float32)
    return q * d + m


def _q5_codes(qh: np.ndarray, qs: np.ndarray) -> np.ndarray:
    return _nibbles(qs) | (_high_bits(qh) << np.uint8(4))


def _q5_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)
    q = _q5_codes(blocks[..., 2:6], blocks[..., 6:22]).astype(np.float32) - np.float32(16)
    return q * d


def _q5_1(blocks: np.ndarray) -> np.ndarray:
    d, m = f16_at(blocks, 0), f16_at(blocks, 2)
    q = _q5_codes(blocks[..., 4:8], blocks[..., 8:24]).astype(np.float32)
    return q * d + m


def _q8_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)
    return as_int8(blocks[..., 2:34]).astype(np.float32) * d


# ---------------------------------------------------------------------------- graph


def emit_nibbles(op: OpBuilder, qs: ir.Value) -> ir.Value:
    """uint8 [B, 16] -> codes [B, 32] in a 32-block's element order (low nibbles first)."""
    return emit_reshape(op, emit_bit_fields(op, qs, 4, 2, axis=-2), [-1, 32])


def emit_high_bits(op: OpBuilder, qh: ir.Value) -> ir.Value:
    """uint8 [B, 4] -> [B, 32]: bit e of the little-endian uint32 (a 5-bit code's bit 4)."""
    return emit_reshape(op, emit_bit_fields(op, qh, 1, 8, axis=-1), [-1, 32])


def _emit_q5_codes(op: OpBuilder, blocks: ir.Value, qh_at: int) -> ir.Value:
    qh = emit_bytes(op, blocks, qh_at, qh_at + 4)
    qs = emit_bytes(op, blocks, qh_at + 4, qh_at + 20)
    return emit_float(op, emit_or_high(op, emit_nibbles(op, qs), emit_high_bits(op, qh), 4))


def _emit_q4_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    q = op.Sub(
        emit_float(op, emit_nibbles(op, emit_bytes(op, blocks, 2, 18))),
        const(op, [8.0], np.float32),
    )
    return op.Mul(q, emit_f16_at(op, blocks, 0))


def _emit_q4_1(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    q = emit_float(op, emit_nibbles(op, emit_bytes(op, blocks, 4, 20)))
    return op.Add(op.Mul(q, emit_f16_at(op, blocks, 0)), emit_f16_at(op, blocks, 2))


def _emit_q5_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    q = op.Sub(_emit_q5_codes(op, blocks, 2), const(op, [16.0], np.float32))
    return op.Mul(q, emit_f16_at(op, blocks, 0))


def _emit_q5_1(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    q = _emit_q5_codes(op, blocks, 4)
    return op.Add(op.Mul(q, emit_f16_at(op, blocks, 0)), emit_f16_at(op, blocks, 2))


def _emit_q8_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    q = emit_float(op, emit_int8(op, emit_bytes(op, blocks, 2, 34)))
    return op.Mul(q, emit_f16_at(op, blocks, 0))


Q4_0 = BlockDecode(_q4_0, _emit_q4_0)
Q4_1 = BlockDecode(_q4_1, _emit_q4_1)
Q5_0 = BlockDecode(_q5_0, _emit_q5_0)
Q5_1 = BlockDecode(_q5_1, _emit_q5_1)
Q8_0 = BlockDecode(_q8_0, _emit_q8_0)

DECODES: tuple[BlockDecode, ...] = (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)
