"""llama.cpp's ternary types TQ1_0 (34) and TQ2_0 (35): 256 values of -d, 0, +d per block.

Block layouts (ggml-common.h block_tq1_0 / block_tq2_0), byte offsets inside one block:
  TQ1_0 (54): qs[48] @0, qh[4] @48, d f16 @52. Each byte packs base-3 digits: digit n of byte q
      is ((uint8)(q * 3^n) * 3) >> 8 (a fixed-point fraction, not q // 3^n % 3). qs[0..31] hold
      5 digits each, element 32 n + m from byte m; qs[32..47] 5 digits, element 160 + 16 n + m;
      qh 4 digits, element 240 + 4 n + m.
  TQ2_0 (66): qs[64] @0, d f16 @64. 2-bit codes in the Q2_K order (element 128 j + 32 l + m is
      bits 2 l .. 2 l + 1 of qs[32 j + m]); code 3 (+2 d) is valid in the format.
y = (digit or code - 1) * d, exact in float32 (d's sign decides the sign of a zero).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    BlockDecode,
    const,
    emit_bytes,
    emit_f16_at,
    emit_float,
    emit_int64_bytes,
    emit_mask,
    emit_reshape,
    emit_shift,
    f16_at,
)
from mobius_lite.formats.ggml.kquants import crumbs_256, emit_crumbs_256

# TQ1_0's three digit groups: (first byte, bytes, digits per byte), in element order.
_TQ1_GROUPS = ((0, 32, 5), (32, 16, 5), (48, 4, 4))
_TQ1_D = 52
_TQ2_D = 64


def _powers_of_3(count: int) -> np.ndarray:
    return 3 ** np.arange(count, dtype=np.int64)


# ---------------------------------------------------------------------------- numpy


def _base3_digits(q: np.ndarray, count: int) -> np.ndarray:
    """uint8 bytes [..., n] -> their first `count` digits [..., count * n], digit-major."""
    wrapped = (q[..., None, :].astype(np.int64) * _powers_of_3(count)[:, None]) & 0xFF
    return ((wrapped * 3) >> 8).reshape(*q.shape[:-1], count * q.shape[-1])


def _ternary_values(codes: np.ndarray, d: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore"):  # 0 * inf is NaN, as in ggml
        return (codes.astype(np.float32) - np.float32(1)) * d


def _tq1_0(blocks: np.ndarray) -> np.ndarray:
    digits = [_base3_digits(blocks[:, s : s + n], c) for s, n, c in _TQ1_GROUPS]
    return _ternary_values(np.concatenate(digits, axis=-1), f16_at(blocks, _TQ1_D))


def _tq2_0(blocks: np.ndarray) -> np.ndarray:
    return _ternary_values(crumbs_256(blocks[:, 0:64]), f16_at(blocks, _TQ2_D))


# ---------------------------------------------------------------------------- graph


def _emit_base3_digits(op: OpBuilder, blocks: ir.Value, start: int, n: int, count: int):
    q = emit_int64_bytes(op, blocks, start, start + n, [-1, 1, n])
    wrapped = emit_mask(op, op.Mul(q, const(op, _powers_of_3(count)[:, None], np.int64)), 8)
    digits = emit_shift(op, op.Mul(wrapped, const(op, [3], np.int64)), 8, "RIGHT")
    return emit_reshape(op, digits, [-1, count * n])


def _emit_ternary_values(op: OpBuilder, codes: ir.Value, d: ir.Value) -> ir.Value:
    return op.Mul(op.Sub(emit_float(op, codes), const(op, [1.0], np.float32)), d)


def _emit_tq1_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    digits = [_emit_base3_digits(op, blocks, s, n, c) for s, n, c in _TQ1_GROUPS]
    return _emit_ternary_values(op, op.Concat(*digits, axis=-1), emit_f16_at(op, blocks, _TQ1_D))


def _emit_tq2_0(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    codes = emit_crumbs_256(op, emit_bytes(op, blocks, 0, 64))
    return _emit_ternary_values(op, codes, emit_f16_at(op, blocks, _TQ2_D))


TQ1_0 = BlockDecode(_tq1_0, _emit_tq1_0)
TQ2_0 = BlockDecode(_tq2_0, _emit_tq2_0)

DECODES: tuple[BlockDecode, ...] = (TQ1_0, TQ2_0)
