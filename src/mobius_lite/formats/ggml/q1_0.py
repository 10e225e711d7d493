"""Q1_0 (ggml type 41): one sign bit per value under one fp16 scale, 128 values per block.

Block (18 bytes, ggml-common.h block_q1_0): d f16 @0, qs[16] @2. Element j is bit j % 8 of
qs[j / 8]; a set bit is +d, a clear bit -d (dequantize_row_q1_0: `bit ? d : -d`, a select,
no product). gguf-py 0.19 does not decode Q1_0; the tests hold this decode to the definition.
Because no arithmetic follows the fp16 widening, the graph widens NaN scales bit for bit.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    FLOAT,
    BlockDecode,
    bit_fields,
    const,
    emit_bit_fields,
    emit_bytes,
    emit_reshape,
    emit_shift,
    f16_at,
    merge_last,
)
from mobius_lite.formats.ggml.dense import emit_f16_keeping_nan_payload


def _q1_0(blocks: np.ndarray) -> np.ndarray:
    d = f16_at(blocks, 0)  # [n, 1]
    bits = merge_last(bit_fields(blocks[:, 2:18], 1, 8), 2)  # [n, 128]
    return np.where(bits != 0, d, -d)


def _emit_q1_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    # -d as d's bits with the sign bit flipped where the bit is clear. Not Where(bit, d, -d):
    # onnxruntime 1.32's CPU Where returns +0.0 where it selects a -0.0 from its first input.
    d = emit_f16_keeping_nan_payload(op, emit_bytes(op, blocks, 0, 2))  # [n, 1]
    bits = emit_reshape(op, emit_bit_fields(op, emit_bytes(op, blocks, 2, 18), 1, 8), [-1, 128])
    clear = op.BitwiseXor(op.Cast(bits, to=ir.DataType.UINT32), const(op, [1], np.uint32))
    sign = emit_shift(op, clear, 31, "LEFT")
    return op.BitCast(op.BitwiseXor(op.BitCast(d, to=ir.DataType.UINT32), sign), to=FLOAT)


Q1_0 = BlockDecode(_q1_0, _emit_q1_0)

DECODES: tuple[BlockDecode, ...] = (Q1_0,)
