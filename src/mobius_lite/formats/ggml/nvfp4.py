"""NVFP4 (ggml type 40): E2M1 values in 16-element groups, each under one UE4M3 scale byte.

Superblock (36 bytes, 64 elements, ggml's block_nvfp4): d[4] (UE4M3, one per group) @0,
qs[32] @4. Group s uses qs[8 s .. 8 s + 7]: the low nibble of byte j is its element j, the
high nibble its element j + 8 (not ModelOpt's even / odd order). The codes index ggml's
doubled E2M1 table (mxfp4.KVALUES_MXFP4), so the scale is halved: y = kvalues[q] * d / 2.

UE4M3 is E4M3 without its sign: bias 7, exponent bits 3..6, mantissa bits 0..2; bit 7 is
ignored, and bytes 0x00 and 0x7F (E4M3's NaN) decode to 0 (ggml_ue4m3_to_fp32). No byte
decodes to NaN or infinity, and every product is exact (4 x 4 significant bits).
llama.cpp's converter clears the sign bit of ModelOpt's E4M3 scales and keeps the rest.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.blocks import (
    BlockDecode,
    emit_int64_bytes,
    emit_nibble_lookup,
    emit_table_lookup,
    nibble_lookup,
)
from mobius_lite.formats.ggml.mxfp4 import KVALUES_MXFP4

GROUP = 16
_KVALUES_F32 = KVALUES_MXFP4.astype(np.float32)


def ue4m3_half(x: np.ndarray) -> np.ndarray:
    """UE4M3 bytes -> float32 value / 2, as ggml_ue4m3_to_fp32 (its 0.5 factor included)."""
    x = np.asarray(x, dtype=np.int64)
    exponent, mantissa = (x >> 3) & 0xF, x & 0x7
    raw = np.where(
        exponent == 0,
        np.ldexp(mantissa.astype(np.float64), -9),
        np.ldexp(1.0 + mantissa / 8.0, exponent - 7),
    )
    return np.where((x == 0x00) | (x == 0x7F), 0.0, raw * 0.5).astype(np.float32)  # exact


# The 256 half-scales by byte, looked up by both decodes.
UE4M3_HALF = ue4m3_half(np.arange(256))
UE4M3_HALF.setflags(write=False)


def _nvfp4(blocks: np.ndarray) -> np.ndarray:
    d = UE4M3_HALF[blocks[:, 0:4]][:, :, None]  # [n, 4, 1]
    return nibble_lookup(_KVALUES_F32, blocks[:, 4:36].reshape(-1, 4, 8)) * d  # [n, 4, 16]


def _emit_nvfp4(op: OpBuilder, blocks: ir.Value) -> ir.Value:
    d = emit_table_lookup(op, UE4M3_HALF, emit_int64_bytes(op, blocks, 0, 4, [-1, 4, 1, 1]))
    return op.Mul(emit_nibble_lookup(op, _KVALUES_F32, blocks, 4, 36, [-1, 4, 1, 8]), d)


NVFP4 = BlockDecode(_nvfp4, _emit_nvfp4)

DECODES: tuple[BlockDecode, ...] = (NVFP4,)
