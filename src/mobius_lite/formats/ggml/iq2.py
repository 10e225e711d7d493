"""IQ2_XXS, IQ2_XS and IQ2_S: 2-bit codebook blocks of 256 values (ggml's block_iq2_*).

Every 8 values are one entry of a grid of 8-value vectors (values 8, 25, 43) with 8 signs and
share a 4-bit scale per 32 (IQ2_XXS) or 16 (IQ2_XS, IQ2_S) values:
y = d * (0.5 + scale) * 0.25 * grid[index][j] * sign[j], as dequantize_row_iq2_* in ggml.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    INT64,
    BlockDecode,
    bit_fields,
    codebook_values,
    emit_bit_fields,
    emit_bytes,
    emit_codebook_values,
    emit_f16_at,
    emit_int64_bytes,
    emit_le_uint,
    emit_mask,
    emit_nibble_pairs,
    emit_or_high,
    emit_reshape,
    emit_scaled_lookup,
    emit_shift,
    emit_table_lookup,
    f16_at,
    le_uint,
    nibble_pairs,
    sign_bits,
)
from mobius_lite.formats.ggml.grids import (
    IQ2S_GRID,
    IQ2XS_GRID,
    IQ2XXS_GRID,
    KSIGNS_F32,
    KSIGNS_IQ2XS,
    SIGN_BYTE_F32,
)

# (0.5 + s) * 0.25 for a 4-bit scale s. d * table[s] equals ggml's d * (0.5 + s) * 0.25 bit for
# bit: scaling by 0.25 is exact (d * (0.5 + s) stays far from float32's under/overflow).
_SCALE_F32 = (np.arange(16, dtype=np.float32) + np.float32(0.5)) * np.float32(0.25)


def _np_scales(d: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """d [n, 1] and 4-bit scales [n, k] -> float32 [n, k, 1, 1], ggml's d * (0.5 + s) * 0.25."""
    return (d * (np.float32(0.5) + scale.astype(np.float32)) * np.float32(0.25))[:, :, None, None]


# ---- IQ2_XXS: d (fp16) | 8 x [4 grid-index bytes | uint32: 4 x 7-bit ksigns index, scale:4]


def _iq2_xxs(blocks: np.ndarray) -> np.ndarray:
    groups = blocks[:, 2:].reshape(-1, 8, 8)  # one group per 32 values
    index = groups[:, :, :4].astype(np.int64)  # [n, 8, 4]
    aux = le_uint(groups[:, :, 4:], np.int64, keepdims=False)  # [n, 8]
    signs = sign_bits(KSIGNS_IQ2XS[bit_fields(aux, 7, 4)])  # [n, 8, 4, 8]
    return codebook_values(_np_scales(f16_at(blocks, 0), aux >> 28), IQ2XXS_GRID, index, signs)


def _emit_iq2_xxs(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1])
    groups = emit_int64_bytes(op, blocks, 2, 66, [-1, 8, 8])
    index = emit_bytes(op, groups, 0, 4)  # [n, 8, 4]
    aux = emit_le_uint(op, emit_bytes(op, groups, 4, 8), 4, INT64)  # [n, 8, 1]
    db = emit_scaled_lookup(op, d, _SCALE_F32.reshape(16, 1), emit_shift(op, aux, 28, "RIGHT"))
    signs = emit_table_lookup(op, KSIGNS_F32, emit_bit_fields(op, aux, 7, 4, new_axis=False))
    return emit_codebook_values(op, db, IQ2XXS_GRID, index, signs)  # [n, 8, 4, 8]


# ---- IQ2_XS: d (fp16) | 32 x uint16 [grid index:9, ksigns index:7] | 8 x scale bytes (2 x 4-bit)


def _iq2_xs(blocks: np.ndarray) -> np.ndarray:
    qs = le_uint(blocks[:, 2:66].reshape(-1, 16, 2, 2), np.int64, keepdims=False)  # 2 per scale
    db = _np_scales(f16_at(blocks, 0), nibble_pairs(blocks, 66, 74))  # [n, 16, 1, 1]
    return codebook_values(db, IQ2XS_GRID, qs & 511, sign_bits(KSIGNS_IQ2XS[qs >> 9]))


def _emit_iq2_xs(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1])
    fields = emit_int64_bytes(op, blocks, 2, 66, [-1, 16, 2, 2])
    qs = emit_le_uint(op, fields, 2, INT64, keepdims=False)  # [n, 16, 2]
    scales = emit_nibble_pairs(op, blocks, 66, 74)  # [n, 16]
    db = emit_scaled_lookup(op, d, _SCALE_F32.reshape(16, 1, 1), scales)  # [n, 16, 1, 1]
    signs = emit_table_lookup(op, KSIGNS_F32, emit_shift(op, qs, 9, "RIGHT"))
    return emit_codebook_values(op, db, IQ2XS_GRID, emit_mask(op, qs, 9), signs)


# ---- IQ2_S: d (fp16) | 32 grid-index low bytes | 32 sign bytes | 8 qh (4 x 2 high index bits)
# ---- | 8 scale bytes (2 x 4-bit)


def _iq2_s(blocks: np.ndarray) -> np.ndarray:
    low = blocks[:, 2:34].reshape(-1, 8, 4).astype(np.int64)
    high = bit_fields(blocks[:, 66:74].astype(np.int64), 2, 4)  # [n, 8, 4]
    index = (low | (high << 8)).reshape(-1, 16, 2)
    db = _np_scales(f16_at(blocks, 0), nibble_pairs(blocks, 74, 82))  # [n, 16, 1, 1]
    signs = sign_bits(blocks[:, 34:66].reshape(-1, 16, 2))
    return codebook_values(db, IQ2S_GRID, index, signs)  # [n, 16, 2, 8]


def _emit_iq2_s(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1])
    low = emit_int64_bytes(op, blocks, 2, 34, [-1, 8, 4])
    qh = emit_int64_bytes(op, blocks, 66, 74, [-1, 8, 1])
    high = emit_bit_fields(op, qh, 2, 4, new_axis=False)
    index = emit_reshape(op, emit_or_high(op, low, high, 8), [-1, 16, 2])
    scales = emit_nibble_pairs(op, blocks, 74, 82)
    db = emit_scaled_lookup(op, d, _SCALE_F32.reshape(16, 1, 1), scales)  # [n, 16, 1, 1]
    signs = emit_table_lookup(op, SIGN_BYTE_F32, emit_int64_bytes(op, blocks, 34, 66, [-1, 16, 2]))
    return emit_codebook_values(op, db, IQ2S_GRID, index, signs)  # [n, 16, 2, 8]


IQ2_XXS = BlockDecode(_iq2_xxs, _emit_iq2_xxs)
IQ2_XS = BlockDecode(_iq2_xs, _emit_iq2_xs)
IQ2_S = BlockDecode(_iq2_s, _emit_iq2_s)

DECODES: tuple[BlockDecode, ...] = (IQ2_XXS, IQ2_XS, IQ2_S)
