"""MXFP4 (ggml type 39): OCP microscaling FP4, 32 E2M1 values under one E8M0 exponent.

Block (17 bytes, ggml's block_mxfp4): e (E8M0) @0, qs[16] @1. Byte j of qs holds element j in
its low nibble and element j + 16 in its high nibble. ggml keeps the E2M1 values doubled, as
the integers KVALUES_MXFP4, and halves the scale to match: y = kvalues[q] * 2^(e - 128)
(ggml_e8m0_to_fp32_half; below e = 2 the half-scale is the subnormal 2^-128 or 2^-127).
e = 0xFF, a NaN in the OCP format, is 2^127 in ggml, and is decoded as ggml decodes it (a
product past the float32 range is then +-inf). Each product is exact or overflows: a power of
two times a 4-bit integer.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    BlockDecode,
    emit_bytes,
    emit_nibble_lookup,
    emit_reshape,
    emit_table_lookup,
    nibble_lookup,
)

# ggml-common.h kvalues_mxfp4: 2 x E2M1 by code (sign bit 3). Code 8 (E2M1's -0) is the
# integer 0, so it decodes to +0, not -0.
KVALUES_MXFP4 = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.int8)
KVALUES_MXFP4.setflags(write=False)
_KVALUES_F32 = KVALUES_MXFP4.astype(np.float32)


def e8m0_half_bits(e: np.ndarray) -> np.ndarray:
    """float32 bit patterns of 2^(e - 128) for E8M0 bytes e (ggml_e8m0_to_fp32_half)."""
    e = np.asarray(e, dtype=np.uint32)
    return np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))


# The 256 half-scales by byte, looked up by both decodes.
E8M0_HALF = e8m0_half_bits(np.arange(256)).astype(np.uint32).view(np.float32)
E8M0_HALF.setflags(write=False)


def _mxfp4(blocks: np.ndarray) -> np.ndarray:
    d = E8M0_HALF[blocks[:, 0:1]]  # [n, 1]
    with np.errstate(over="ignore"):  # past float32's range is +-inf, as in ggml
        return nibble_lookup(_KVALUES_F32, blocks[:, 1:17]) * d  # [n, 32]


def _emit_mxfp4(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_reshape(op, emit_table_lookup(op, E8M0_HALF, emit_bytes(op, blocks, 0, 1)), [-1, 1, 1])
    return op.Mul(emit_nibble_lookup(op, _KVALUES_F32, blocks, 1, 17, [-1, 1, 16]), d)


MXFP4 = BlockDecode(_mxfp4, _emit_mxfp4)

DECODES: tuple[BlockDecode, ...] = (MXFP4,)
