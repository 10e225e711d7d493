"""IQ3_XXS and IQ3_S: 3-bit codebook blocks of 256 values (ggml's block_iq3_*).

Every 4 values are one entry of a grid of 4-value vectors, signed per value; IQ3_XXS takes
y = d * (0.5 + scale) * 0.5 * grid[i][j] * sign[j], IQ3_S y = d * (1 + 2 * scale) * grid[i][j]
* sign[j], each with a 4-bit scale per 32 values, as dequantize_row_iq3_* in ggml.
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
    emit_codebook_values,
    emit_f16_at,
    emit_int64_bytes,
    emit_le_uint,
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
    IQ3S_GRID,
    IQ3XXS_GRID,
    KSIGNS_F32,
    KSIGNS_IQ2XS,
    SIGN_BYTE_F32,
)

# (0.5 + s) * 0.5: d * table[s] equals ggml's d * (0.5 + s) * 0.5 bit for bit (halving is exact).
_XXS_SCALE_F32 = (np.arange(16, dtype=np.float32) + np.float32(0.5)) * np.float32(0.5)
_S_SCALE_F32 = (1 + 2 * np.arange(16)).astype(np.float32)  # ggml's int (1 + 2 * s) as float

# Both types decode 32 values as [8 groups, 4 sign bytes, 2 grid entries, 4 values]; the numpy
# scales [n, 8] broadcast over the last three axes.

# ---- IQ3_XXS: d (fp16) | 64 grid-index bytes | 8 x uint32 [4 x 7-bit ksigns index, scale:4]


def _iq3_xxs(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)  # [n, 1]
    index = blocks[:, 2:66].reshape(-1, 8, 4, 2).astype(np.int64)  # 2 grid entries per 8 values
    aux = le_uint(blocks[:, 66:98].reshape(-1, 8, 4), np.int64, keepdims=False)  # [n, 8]
    db = d * (np.float32(0.5) + (aux >> 28).astype(np.float32)) * np.float32(0.5)
    signs = sign_bits(KSIGNS_IQ2XS[bit_fields(aux, 7, 4)]).reshape(-1, 8, 4, 2, 4)
    return codebook_values(db[:, :, None, None, None], IQ3XXS_GRID, index, signs)


def _emit_iq3_xxs(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1, 1])
    index = emit_int64_bytes(op, blocks, 2, 66, [-1, 8, 4, 2])
    aux = emit_le_uint(op, emit_int64_bytes(op, blocks, 66, 98, [-1, 8, 4]), 4, INT64)  # [n, 8, 1]
    scale = emit_shift(op, aux, 28, "RIGHT")
    db = emit_scaled_lookup(op, d, _XXS_SCALE_F32.reshape(16, 1, 1), scale)
    sign_index = emit_bit_fields(op, aux, 7, 4, new_axis=False)  # [n, 8, 4]
    signs = emit_table_lookup(op, KSIGNS_F32.reshape(128, 2, 4), sign_index)  # [n, 8, 4, 2, 4]
    return emit_codebook_values(op, db, IQ3XXS_GRID, index, signs)


# ---- IQ3_S: d (fp16) | 64 grid-index low bytes | 8 qh (bit m: 9th index bit of entry m of a
# ---- 32-value group) | 32 sign bytes | 4 scale bytes (2 x 4-bit)


def _iq3_s(blocks: np.ndarray) -> np.ndarray:
    low = blocks[:, 2:66].reshape(-1, 8, 8).astype(np.int64)
    high = bit_fields(blocks[:, 66:74].astype(np.int64), 1, 8)  # [n, 8, 8]
    index = (low | (high << 8)).reshape(-1, 8, 4, 2)
    scales = nibble_pairs(blocks, 106, 110).astype(np.int64)
    db = f16_at(blocks, 0) * (1 + 2 * scales).astype(np.float32)  # [n, 8]
    signs = sign_bits(blocks[:, 74:106].reshape(-1, 8, 4)).reshape(-1, 8, 4, 2, 4)
    return codebook_values(db[:, :, None, None, None], IQ3S_GRID, index, signs)


def _emit_iq3_s(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1, 1])
    low = emit_int64_bytes(op, blocks, 2, 66, [-1, 8, 8])
    qh = emit_int64_bytes(op, blocks, 66, 74, [-1, 8, 1])
    high = emit_bit_fields(op, qh, 1, 8, new_axis=False)  # [n, 8, 8]
    index = emit_reshape(op, emit_or_high(op, low, high, 8), [-1, 8, 4, 2])
    scales = emit_nibble_pairs(op, blocks, 106, 110)  # [n, 8]
    db = emit_scaled_lookup(op, d, _S_SCALE_F32.reshape(16, 1, 1, 1), scales)
    sign_bytes = emit_int64_bytes(op, blocks, 74, 106, [-1, 8, 4])
    signs = emit_table_lookup(op, SIGN_BYTE_F32.reshape(256, 2, 4), sign_bytes)
    return emit_codebook_values(op, db, IQ3S_GRID, index, signs)  # [n, 8, 4, 2, 4]


IQ3_XXS = BlockDecode(_iq3_xxs, _emit_iq3_xxs)
IQ3_S = BlockDecode(_iq3_s, _emit_iq3_s)

DECODES: tuple[BlockDecode, ...] = (IQ3_XXS, IQ3_S)
