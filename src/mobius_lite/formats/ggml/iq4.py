"""IQ4_NL and IQ4_XS: 4-bit non-linear blocks (ggml's block_iq4_nl, block_iq4_xs).

Each value is a 4-bit index into kvalues_iq4nl: IQ4_NL y = d * kvalues[q] per 32 values,
IQ4_XS y = d * (ls - 32) * kvalues[q] with a 6-bit ls per 32 of 256 values, as
dequantize_row_iq4_* in ggml. Within 32 values the low nibbles of 16 bytes come first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    INT64,
    BlockDecode,
    bit_fields,
    emit_bit_fields,
    emit_f16_at,
    emit_int64_bytes,
    emit_le_uint,
    emit_nibble_lookup,
    emit_nibble_pairs,
    emit_or_high,
    emit_scaled_lookup,
    f16_at,
    le_uint,
    nibble_lookup,
    nibble_pairs,
)
from mobius_lite.formats.ggml.grids import KVALUES_IQ4NL

_KVALUES_F32 = KVALUES_IQ4NL.astype(np.float32)
_LS_F32 = (np.arange(64) - 32).astype(np.float32)  # ggml's int (ls - 32) as float


def _nibble_values(qs: np.ndarray) -> np.ndarray:
    """uint8 [..., 16] -> float32 [..., 32]: kvalues of the low nibbles, then the high ones."""
    return nibble_lookup(_KVALUES_F32, qs)


def _emit_nibble_values(
    op: OpBuilder, blocks: ir.Value, start: int, stop: int, dims: Sequence[int]
) -> ir.Value:
    """Bytes [start, stop) viewed as dims [..., 1, 16] -> kvalues FLOAT [..., 2, 16]."""
    return emit_nibble_lookup(op, _KVALUES_F32, blocks, start, stop, dims)


# ---- IQ4_NL: d (fp16) | 16 bytes of 2 x 4-bit index (32 values)


def _iq4_nl(blocks: np.ndarray) -> np.ndarray:
    return f16_at(blocks, 0) * _nibble_values(blocks[:, 2:18])


def _emit_iq4_nl(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1])
    return op.Mul(d, _emit_nibble_values(op, blocks, 2, 18, [-1, 1, 16]))  # [n, 2, 16]


# ---- IQ4_XS: d (fp16) | uint16 scales_h (8 x 2 high ls bits) | 4 scales_l bytes (8 x 4 low ls
# ---- bits) | 128 bytes of 2 x 4-bit index


def _iq4_xs(blocks: np.ndarray) -> np.ndarray:
    scales_h = le_uint(blocks[:, 2:4], np.int64, keepdims=False)  # [n]
    ls = nibble_pairs(blocks, 4, 8).astype(np.int64) | (bit_fields(scales_h, 2, 8) << 4)
    dl = f16_at(blocks, 0) * (ls - 32).astype(np.float32)  # [n, 8]
    values = _nibble_values(blocks[:, 8:136].reshape(-1, 8, 16))  # [n, 8, 32]
    return dl[:, :, None] * values


def _emit_iq4_xs(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_f16_at(op, blocks, 0, [-1, 1, 1, 1])
    scales_h = emit_le_uint(op, emit_int64_bytes(op, blocks, 2, 4, [-1, 2]), 2, INT64)  # [n, 1]
    high = emit_bit_fields(op, scales_h, 2, 8, new_axis=False)  # [n, 8]
    ls = emit_or_high(op, emit_nibble_pairs(op, blocks, 4, 8), high, 4)
    dl = emit_scaled_lookup(op, d, _LS_F32.reshape(64, 1, 1), ls)  # [n, 8, 1, 1]
    return op.Mul(dl, _emit_nibble_values(op, blocks, 8, 136, [-1, 8, 1, 16]))  # [n, 8, 2, 16]


IQ4_NL = BlockDecode(_iq4_nl, _emit_iq4_nl)
IQ4_XS = BlockDecode(_iq4_xs, _emit_iq4_xs)

DECODES: tuple[BlockDecode, ...] = (IQ4_NL, IQ4_XS)
