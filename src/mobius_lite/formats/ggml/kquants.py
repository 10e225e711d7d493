"""ggml's K-quant 256-element super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Block layouts (ggml-common.h), byte offsets inside one super-block:
  Q2_K (84):  scales[16] @0 (low nibble scale, high nibble min), qs[64] @16, d @80, dmin @82
  Q3_K (110): hmask[32] @0, qs[64] @32, scales[12] @96 (sixteen 6-bit), d @108
  Q4_K (144): d @0, dmin @2, scales[12] @4 (eight 6-bit scales + eight 6-bit mins), qs[128] @16
  Q5_K (176): d @0, dmin @2, scales[12] @4, qh[32] @16, qs[128] @48
  Q6_K (210): ql[128] @0, qh[64] @128, scales int8[16] @192, d @208
The element order of each (which bits of which byte make element e) is spelled out at each
decoder; it follows dequantize_row_*_K in ggml-quants.c. All products are exact in float32
(fp16 significand x sub-scale x code needs at most 23 bits), so the only rounding is the
final "- min" of Q2_K / Q4_K / Q5_K; the products keep ggml's order for the sign of zeros.
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
    emit_mask,
    emit_or_high,
    emit_reshape,
    emit_shift,
    f16_at,
    merge_last,
)

# Element layouts, per super-block of 256:
# - 2-bit codes (Q2_K, Q3_K low bits): qs viewed [2, 32]; element 128 n + 32 j + l is bits
#   2j..2j+1 of qs[n, l]  -> bit_fields(width 2, count 4, axis -2) then flatten.
# - one high bit per element (Q3_K hmask, Q5_K qh): element 32 k + l is bit k of byte l of a
#   32-byte array -> bit_fields(width 1, count 8, axis -2) then flatten.
# - 4-bit codes (Q4_K, Q5_K low bits): qs viewed [4, 32]; element 64 g + 32 h + l is nibble h
#   of qs[g, l] -> bit_fields(width 4, count 2, axis -2) then flatten.
# - Q6_K low nibbles: ql viewed [2, 2, 32]; element 128 n + 64 h + 32 p + l is nibble h of
#   ql[n, p, l] -> bit_fields(width 4, count 2, axis -3); its 2 high bits: qh viewed [2, 32],
#   element 128 n + 32 k + l is bits 2k..2k+1 of qh[n, l].

# ---------------------------------------------------------------------------- numpy


def crumbs_256(qs: np.ndarray) -> np.ndarray:
    """qs [..., 64] -> 2-bit codes [..., 256]."""
    return merge_last(bit_fields(qs.reshape(*qs.shape[:-1], 2, 32), 2, 4, axis=-2), 3)


def _high_bits_256(qh: np.ndarray) -> np.ndarray:
    """qh / hmask [..., 32] -> one bit per element [..., 256]."""
    return merge_last(bit_fields(qh, 1, 8, axis=-2), 2)


def _nibbles_256(qs: np.ndarray) -> np.ndarray:
    """qs [..., 128] -> 4-bit codes [..., 256]."""
    return merge_last(bit_fields(qs.reshape(*qs.shape[:-1], 4, 32), 4, 2, axis=-2), 3)


def _scale_min_k4(sc12: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K packed 6-bit scales and mins: [..., 12] -> ([..., 8], [..., 8])."""
    b0, b1, b2 = sc12[..., 0:4], sc12[..., 4:8], sc12[..., 8:12]
    scales = np.concatenate([b0 & 63, (b2 & 0xF) | ((b0 >> 6) << 4)], axis=-1)
    mins = np.concatenate([b1 & 63, (b2 >> 4) | ((b1 >> 6) << 4)], axis=-1)
    return scales, mins


def _q3_scales(sc12: np.ndarray) -> np.ndarray:
    """Q3_K sixteen 6-bit scales: low 4 bits are nibble j // 8 of byte j % 8, high 2 bits are
    bits 2 (j // 4) of byte 8 + j % 4. Returns the unsigned 0..63 values [..., 16]."""
    low = merge_last(bit_fields(sc12[..., 0:8], 4, 2, axis=-2), 2)
    high = merge_last(bit_fields(sc12[..., 8:12], 2, 4, axis=-2), 2)
    return low | (high << np.uint8(4))


def _per16(a: np.ndarray) -> np.ndarray:
    """[..., 256] -> [..., 16, 16] (sixteen sub-blocks of sixteen)."""
    return a.reshape(*a.shape[:-1], 16, 16)


def _per32(a: np.ndarray) -> np.ndarray:
    """[..., 256] -> [..., 8, 32] (eight sub-blocks of thirty-two)."""
    return a.reshape(*a.shape[:-1], 8, 32)


def _q2_k(blocks: np.ndarray) -> np.ndarray:
    sc = blocks[..., 0:16]
    d, dmin = f16_at(blocks, 80), f16_at(blocks, 82)
    dl = d * (sc & 0xF).astype(np.float32)
    ml = dmin * (sc >> 4).astype(np.float32)
    q = _per16(crumbs_256(blocks[..., 16:80])).astype(np.float32)
    return dl[..., None] * q - ml[..., None]


def _q3_k(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 108)
    dl = d * (_q3_scales(blocks[..., 96:108]).astype(np.float32) - np.float32(32))
    # code = low 2 bits - (high bit ? 0 : 4) = (low | high << 2) - 4
    codes = crumbs_256(blocks[..., 32:96]) | (_high_bits_256(blocks[..., 0:32]) << np.uint8(2))
    q = _per16(codes).astype(np.float32) - np.float32(4)
    return dl[..., None] * q


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin = f16_at(blocks, 0), f16_at(blocks, 2)
    scales, mins = _scale_min_k4(blocks[..., 4:16])
    d1 = d * scales.astype(np.float32)
    m1 = dmin * mins.astype(np.float32)
    q = _per32(_nibbles_256(blocks[..., 16:144])).astype(np.float32)
    return d1[..., None] * q - m1[..., None]


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin = f16_at(blocks, 0), f16_at(blocks, 2)
    scales, mins = _scale_min_k4(blocks[..., 4:16])
    d1 = d * scales.astype(np.float32)
    m1 = dmin * mins.astype(np.float32)
    codes = _nibbles_256(blocks[..., 48:176]) | (_high_bits_256(blocks[..., 16:48]) << np.uint8(4))
    q = _per32(codes).astype(np.float32)
    return d1[..., None] * q - m1[..., None]


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 208)
    ql = blocks[..., 0:128].reshape(*blocks.shape[:-1], 2, 2, 32)
    qh = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 32)
    low = merge_last(bit_fields(ql, 4, 2, axis=-3), 4)
    high = merge_last(bit_fields(qh, 2, 4, axis=-2), 3)
    q = _per16(low | (high << np.uint8(4))).astype(np.float32) - np.float32(32)
    dsc = d * as_int8(blocks[..., 192:208]).astype(np.float32)
    return dsc[..., None] * q


# ---------------------------------------------------------------------------- graph


def emit_crumbs_256(op: OpBuilder, qs: ir.Value) -> ir.Value:
    """uint8 [B, 64] -> 2-bit codes [B, 256] (Q2_K / Q3_K element order)."""
    viewed = emit_reshape(op, qs, [-1, 2, 32])
    return emit_reshape(op, emit_bit_fields(op, viewed, 2, 4, axis=-2), [-1, 256])


def emit_high_bits_256(op: OpBuilder, qh: ir.Value) -> ir.Value:
    """uint8 [B, 32] -> one bit per element [B, 256] (Q3_K hmask / Q5_K qh order)."""
    return emit_reshape(op, emit_bit_fields(op, qh, 1, 8, axis=-2), [-1, 256])


def emit_nibbles_256(op: OpBuilder, qs: ir.Value) -> ir.Value:
    """uint8 [B, 128] -> 4-bit codes [B, 256] (Q4_K / Q5_K element order)."""
    viewed = emit_reshape(op, qs, [-1, 4, 32])
    return emit_reshape(op, emit_bit_fields(op, viewed, 4, 2, axis=-2), [-1, 256])


def emit_scale_min_k4(op: OpBuilder, sc12: ir.Value) -> tuple[ir.Value, ir.Value]:
    """Q4_K / Q5_K packed scales [B, 12] -> (6-bit scales [B, 8], 6-bit mins [B, 8]) uint8."""
    b0 = emit_bytes(op, sc12, 0, 4)
    b1 = emit_bytes(op, sc12, 4, 8)
    b2 = emit_bytes(op, sc12, 8, 12)
    top0 = emit_shift(op, b0, 6, "RIGHT")
    top1 = emit_shift(op, b1, 6, "RIGHT")
    scales_hi = emit_or_high(op, emit_mask(op, b2, 4), top0, 4)
    mins_hi = emit_or_high(op, emit_shift(op, b2, 4, "RIGHT"), top1, 4)
    scales = op.Concat(emit_mask(op, b0, 6), scales_hi, axis=-1)
    mins = op.Concat(emit_mask(op, b1, 6), mins_hi, axis=-1)
    return scales, mins


def emit_q3_scales(op: OpBuilder, sc12: ir.Value) -> ir.Value:
    """Q3_K packed scales [B, 12] -> unsigned 6-bit scales [B, 16] uint8 (see _q3_scales)."""
    low = emit_reshape(op, emit_bit_fields(op, emit_bytes(op, sc12, 0, 8), 4, 2, -2), [-1, 16])
    high = emit_reshape(op, emit_bit_fields(op, emit_bytes(op, sc12, 8, 12), 2, 4, -2), [-1, 16])
    return emit_or_high(op, low, high, 4)


def _col(op: OpBuilder, value: ir.Value) -> ir.Value:
    """[B, S] -> [B, S, 1] so a per-sub-block factor broadcasts over its elements."""
    return op.Unsqueeze(value, op.Constant(value_ints=[-1]))


def _emit_q2_k(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    sc = emit_bytes(op, blocks, 0, 16)
    dl = op.Mul(emit_f16_at(op, blocks, 80), emit_float(op, emit_mask(op, sc, 4)))
    ml = op.Mul(emit_f16_at(op, blocks, 82), emit_float(op, emit_shift(op, sc, 4, "RIGHT")))
    q = emit_float(
        op, emit_reshape(op, emit_crumbs_256(op, emit_bytes(op, blocks, 16, 80)), [-1, 16, 16])
    )
    return op.Sub(op.Mul(_col(op, dl), q), _col(op, ml))


def _emit_q3_k(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    scales = op.Sub(
        emit_float(op, emit_q3_scales(op, emit_bytes(op, blocks, 96, 108))),
        const(op, [32.0], np.float32),
    )
    dl = op.Mul(emit_f16_at(op, blocks, 108), scales)
    codes = emit_or_high(
        op,
        emit_crumbs_256(op, emit_bytes(op, blocks, 32, 96)),
        emit_high_bits_256(op, emit_bytes(op, blocks, 0, 32)),
        2,
    )
    q = op.Sub(emit_float(op, emit_reshape(op, codes, [-1, 16, 16])), const(op, [4.0], np.float32))
    return op.Mul(_col(op, dl), q)


def _emit_k4_scaled(op: OpBuilder, blocks: ir.Value, codes: ir.Value) -> ir.Value:
    """Q4_K / Q5_K: (d * scale) * code - dmin * min over eight sub-blocks of 32."""
    scales, mins = emit_scale_min_k4(op, emit_bytes(op, blocks, 4, 16))
    d1 = op.Mul(emit_f16_at(op, blocks, 0), emit_float(op, scales))
    m1 = op.Mul(emit_f16_at(op, blocks, 2), emit_float(op, mins))
    q = emit_float(op, emit_reshape(op, codes, [-1, 8, 32]))
    return op.Sub(op.Mul(_col(op, d1), q), _col(op, m1))


def _emit_q4_k(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    return _emit_k4_scaled(op, blocks, emit_nibbles_256(op, emit_bytes(op, blocks, 16, 144)))


def _emit_q5_k(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    codes = emit_or_high(
        op,
        emit_nibbles_256(op, emit_bytes(op, blocks, 48, 176)),
        emit_high_bits_256(op, emit_bytes(op, blocks, 16, 48)),
        4,
    )
    return _emit_k4_scaled(op, blocks, codes)


def _emit_q6_k(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    ql = emit_reshape(op, emit_bytes(op, blocks, 0, 128), [-1, 2, 2, 32])
    qh = emit_reshape(op, emit_bytes(op, blocks, 128, 192), [-1, 2, 32])
    low = emit_reshape(op, emit_bit_fields(op, ql, 4, 2, axis=-3), [-1, 16, 16])
    high = emit_reshape(op, emit_bit_fields(op, qh, 2, 4, axis=-2), [-1, 16, 16])
    q = op.Sub(emit_float(op, emit_or_high(op, low, high, 4)), const(op, [32.0], np.float32))
    dsc = op.Mul(
        emit_f16_at(op, blocks, 208),
        emit_float(op, emit_int8(op, emit_bytes(op, blocks, 192, 208))),
    )
    return op.Mul(_col(op, dsc), q)


Q2_K = BlockDecode(_q2_k, _emit_q2_k)
Q3_K = BlockDecode(_q3_k, _emit_q3_k)
Q4_K = BlockDecode(_q4_k, _emit_q4_k)
Q5_K = BlockDecode(_q5_k, _emit_q5_k)
Q6_K = BlockDecode(_q6_k, _emit_q6_k)

DECODES: tuple[BlockDecode, ...] = (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)
