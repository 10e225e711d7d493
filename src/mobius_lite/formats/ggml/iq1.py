"""IQ1_S and IQ1_M: 1-bit codebook blocks of 256 values (ggml's block_iq1_s, block_iq1_m).

Every 8 values are one 11-bit index into iq1s_grid (values -1, 0, 1), shifted by +-IQ1S_DELTA:
y = d * (2 * scale + 1) * (grid[i][j] + delta), as dequantize_row_iq1_* in ggml. IQ1_S has a
3-bit scale and one delta sign per 32 values; IQ1_M a 3-bit scale per 16 values, a delta sign
per 8, and its fp16 d spread over the top nibbles of its four scale words.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    INT64,
    BlockDecode,
    bit_fields,
    emit_bit_fields,
    emit_f16_at,
    emit_f16_bits_to_float,
    emit_int64_bytes,
    emit_le_uint,
    emit_mask,
    emit_or_high,
    emit_reshape,
    emit_scaled_lookup,
    emit_shift,
    emit_table_lookup,
    f16_at,
    f16_bits_to_float,
    le_uint,
)
from mobius_lite.formats.ggml.grids import IQ1S_DELTA, IQ1S_GRID

_DELTA = np.float32(IQ1S_DELTA)
_GRID_F32 = IQ1S_GRID.astype(np.float32)
# Graph tables over a 4-bit field [sign:1 | scale:3]: ggml's int (2 * scale + 1) as float, and
# the delta (negative where the sign bit is set).
_ODD_F32 = (2 * (np.arange(16) & 7) + 1).astype(np.float32)
_DELTA_F32 = np.where(np.arange(16) >= 8, -_DELTA, _DELTA).astype(np.float32)


def _np_delta(sign_bit: np.ndarray) -> np.ndarray:
    return np.where(sign_bit != 0, -_DELTA, _DELTA).astype(np.float32)


# ---- IQ1_S: d (fp16) | 32 grid-index low bytes | 8 x uint16 qh
# ---- [4 x 3 high index bits | scale:3 | delta sign:1]


def _iq1_s(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)  # [n, 1]
    low = blocks[:, 2:34].reshape(-1, 8, 4).astype(np.int64)
    qh = le_uint(blocks[:, 34:50].reshape(-1, 8, 2), np.int64, keepdims=False)  # [n, 8]
    dl = d * (2 * ((qh >> 12) & 7) + 1).astype(np.float32)
    delta = _np_delta(qh & 0x8000)
    index = low | (bit_fields(qh, 3, 4) << 8)  # [n, 8, 4]
    grid = IQ1S_GRID[index].astype(np.float32)  # [n, 8, 4, 8]
    return dl[:, :, None, None] * (grid + delta[:, :, None, None])


def _emit_iq1_s(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1])
    low = emit_int64_bytes(op, blocks, 2, 34, [-1, 8, 4])
    qh = emit_le_uint(op, emit_int64_bytes(op, blocks, 34, 50, [-1, 8, 2]), 2, INT64)  # [n, 8, 1]
    high = emit_bit_fields(op, qh, 3, 4, new_axis=False)  # [n, 8, 4]
    grid = emit_table_lookup(op, _GRID_F32, emit_or_high(op, low, high, 8))
    top = emit_shift(op, qh, 12, "RIGHT")  # [n, 8, 1]: delta sign and scale
    dl = emit_scaled_lookup(op, d, _ODD_F32.reshape(16, 1), top)  # [n, 8, 1, 1]
    delta = emit_table_lookup(op, _DELTA_F32.reshape(16, 1), top)
    return op.Mul(dl, op.Add(grid, delta))


# ---- IQ1_M: 32 grid-index low bytes | 16 qh bytes (per nibble: 3 high index bits, delta sign)
# ---- | 4 x uint16 scales [4 x 3-bit scale | 4 bits of d]


def _iq1_m(blocks: np.ndarray) -> np.ndarray:
    sc = le_uint(blocks[:, 48:56].reshape(-1, 4, 2), np.int64, keepdims=False)  # [n, 4]
    d = f16_bits_to_float(((sc >> 12) << (4 * np.arange(4))).sum(axis=-1))[:, None]  # [n, 1]
    scales = bit_fields(sc, 3, 4)  # [n, 4, 4] -> one per 16 values
    dl = d * (2 * scales.reshape(-1, 16) + 1).astype(np.float32)
    nibbles = bit_fields(blocks[:, 32:48].astype(np.int64), 4, 2).reshape(-1, 16, 2)  # per 8
    index = blocks[:, :32].reshape(-1, 16, 2).astype(np.int64) | ((nibbles & 7) << 8)
    delta = _np_delta(nibbles & 8)
    grid = IQ1S_GRID[index].astype(np.float32)  # [n, 16, 2, 8]
    return dl[:, :, None, None] * (grid + delta[..., None])


def _emit_iq1_m(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    sc = emit_le_uint(op, emit_int64_bytes(op, blocks, 48, 56, [-1, 4, 2]), 2, INT64)  # [n, 4, 1]
    top = emit_shift(op, emit_shift(op, sc, 12, "RIGHT"), [[0], [4], [8], [12]], "LEFT")
    joined = op.ReduceSum(top, op.Constant(value_ints=[1]), keepdims=0)  # d's four nibbles
    bits = op.Cast(joined, to=ir.DataType.UINT16)
    d = emit_reshape(op, emit_f16_bits_to_float(op, bits), [-1, 1, 1, 1])
    scales = emit_reshape(op, emit_bit_fields(op, sc, 3, 4, new_axis=False), [-1, 16])
    dl = emit_scaled_lookup(op, d, _ODD_F32.reshape(16, 1, 1), scales)  # [n, 16, 1, 1]
    qh = emit_int64_bytes(op, blocks, 32, 48, [-1, 16, 1])
    nibbles = emit_bit_fields(op, qh, 4, 2, new_axis=False)  # [n, 16, 2]
    low = emit_int64_bytes(op, blocks, 0, 32, [-1, 16, 2])
    grid = emit_table_lookup(op, _GRID_F32, emit_or_high(op, low, emit_mask(op, nibbles, 3), 8))
    delta = emit_table_lookup(op, _DELTA_F32.reshape(16, 1), nibbles)  # [n, 16, 2, 1]
    return op.Mul(dl, op.Add(grid, delta))


IQ1_S = BlockDecode(_iq1_s, _emit_iq1_s)
IQ1_M = BlockDecode(_iq1_m, _emit_iq1_m)

DECODES: tuple[BlockDecode, ...] = (IQ1_S, IQ1_M)
