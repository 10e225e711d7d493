"""Each exact-form type's blocks read as integer codes, scales and mins (exact_codes.py has
the forms and the proof of exactness). A type's row holds its reader (types.py,
CodeForm.read), so this module does not import the type table.

A reader takes uint8 blocks [..., n_blocks, block_bytes] and returns codes (uint8, or an
integer array that converts to it), float32 scales and float32 mins or None, each with the
type's sub-blocks along the trailing axes; exact_codes.py reshapes them to the form's blocks.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mobius_lite.formats.ggml.blocks import as_int8, bit_fields, f16_at, le_uint, nibble_lookup
from mobius_lite.formats.ggml.grids import IQ2XXS_GRID, KSIGNS_IQ2XS
from mobius_lite.formats.ggml.kquants import _nibbles_256, _per16, _per32, _scale_min_k4
from mobius_lite.formats.ggml.legacy import _nibbles
from mobius_lite.formats.ggml.mxfp4 import E8M0_HALF, KVALUES_MXFP4
from mobius_lite.formats.ggml.nvfp4 import UE4M3_HALF

CodeReader = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray | None]]
"""uint8 blocks [..., n_blocks, block_bytes] -> (codes, scales, mins or None)."""


def q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    return _nibbles(blocks[..., 2:18]), f16_at(blocks, 0)[..., 0], None


def q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    return blocks[..., 2:34] ^ np.uint8(0x80), f16_at(blocks, 0)[..., 0], None


def q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = f16_at(blocks, 0), f16_at(blocks, 2)
    sc, m = _scale_min_k4(blocks[..., 4:16])
    codes = _per32(_nibbles_256(blocks[..., 16:144]))  # [..., 8, 32]
    return codes, d * sc.astype(np.float32), dmin * m.astype(np.float32)


def q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    ql = blocks[..., 0:128].reshape(*blocks.shape[:-1], 2, 2, 32)
    qh = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 32)
    low = bit_fields(ql, 4, 2, axis=-3).reshape(*blocks.shape[:-1], 256)
    high = bit_fields(qh, 2, 4, axis=-2).reshape(*blocks.shape[:-1], 256)
    codes = _per16(low | (high << np.uint8(4))) + np.uint8(96)  # q - 32 + 128
    return codes, f16_at(blocks, 208) * as_int8(blocks[..., 192:208]).astype(np.float32), None


def iq2_xxs(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    lead = blocks.shape[:-1]
    groups = blocks[..., 2:].reshape(*lead, 8, 8)  # one group of 32 values per scale
    grid = IQ2XXS_GRID[groups[..., :4].astype(np.int64)].astype(np.int16)  # [..., 8, 4, 8]
    aux = le_uint(groups[..., 4:], np.int64, keepdims=False)  # [..., 8]
    negative = bit_fields(KSIGNS_IQ2XS[bit_fields(aux, 7, 4)], 1, 8) != 0  # [..., 8, 4, 8]
    codes = (np.int16(128) + np.where(negative, -grid, grid)).astype(np.uint8)
    ls = (aux >> 28).astype(np.float32)
    scales = f16_at(blocks, 0) * (np.float32(0.5) + ls) * np.float32(0.25)
    return codes.reshape(*lead, 8, 32), scales, None


# ggml's doubled E2M1 values as 8-bit codes around the zero point 128, by 4-bit code
FP4_CODES = (KVALUES_MXFP4.astype(np.int16) + 128).astype(np.uint8)
FP4_CODES.setflags(write=False)


def mxfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """qs byte j: element j (low nibble), element j + 16 (high); scale 2^(e - 128)."""
    return nibble_lookup(FP4_CODES, blocks[..., 1:17]), E8M0_HALF[blocks[..., 0]], None


def nvfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """Group s of a superblock: qs[8 s + j] holds its element j (low) and j + 8 (high)."""
    lead = blocks.shape[:-1]
    codes = nibble_lookup(FP4_CODES, blocks[..., 4:36].reshape(*lead, 4, 8))  # [..., 4, 16]
    return codes, UE4M3_HALF[blocks[..., 0:4]], None
