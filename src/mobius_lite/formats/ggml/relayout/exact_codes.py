"""ggml blocks as integer codes with one scale (and one min) per sub-block, exactly.

onnxruntime's block-wise kernels (MatMulNBits, QMoE) compute with (code - zero_point) * scale
per block along K, the code an unsigned 4- or 8-bit integer. Seven ggml types fit that form
without changing one decoded value (every product below is exact in float32, so
(code - zero_point) * scale is the very float32 ggml's dequantize gives):

| type    | bits | block | code          | zero point | scale             | min       |
| Q4_0    | 4    | 32    | q             | 8          | d                 | -         |
| Q8_0    | 8    | 32    | q + 128       | 128        | d                 | -         |
| Q4_K    | 4    | 32    | q             | 0          | d * sc            | dmin * m  |
| Q6_K    | 8    | 16    | q + 96        | 128        | d * sc            | -         |
| IQ2_XXS | 8    | 32    | 128 + g       | 128        | d * (0.5+ls) / 4  | -         |
| MXFP4   | 8    | 32    | 128 + 2 e2m1  | 128        | 2^(e - 128)       | -         |
| NVFP4   | 8    | 16    | 128 + 2 e2m1  | 128        | ue4m3(d) / 2      | -         |

Q4_K's value is d*sc*q - dmin*m: the min is not a zero point (a block with sc = 0 still has
one), so it stays a separate per-block term that the graph subtracts (exact_matmulnbits.py). The
MatMulNBits layout of linear layers moves most of it into a per-block zero point z =
round(dmin*m / (d*sc)), keeping the residual dmin*m - d*sc*z as the min (exact_layout.py,
center_mins): the same float32 values, at the same bytes (Q4_K's zero points are stored
anyway), and int8 activations then err as llama.cpp's do. IQ2_XXS's g
is a grid value (8, 25 or 43) with its sign. MXFP4's and NVFP4's code is the E2M1 value
doubled, an integer in [-12, 12] (ggml's kvalues_mxfp4), under the block's E8M0 half-scale
(one per 32) or UE4M3 half-scale (one per 16 of a 64-element superblock); ggml decodes them
as exactly this product. Their `.scale` sidecar (a per-tensor / per-expert output scale)
stays outside the layout (formats/weight.py, OutputScaled). Other types have no exact form
here: their values are not one integer code times one scale per power-of-two block (Q5_K,
Q3_K, IQ3, IQ4: codebooks or two-level scales whose product is not a block scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mobius_lite.formats.ggml.blocks import (
    as_blocks,
    as_int8,
    bit_fields,
    f16_at,
    le_uint,
    nibble_lookup,
)
from mobius_lite.formats.ggml.grids import IQ2XXS_GRID, KSIGNS_IQ2XS
from mobius_lite.formats.ggml.kquants import _nibbles_256, _per16, _per32, _scale_min_k4
from mobius_lite.formats.ggml.legacy import _nibbles
from mobius_lite.formats.ggml.mxfp4 import E8M0_HALF, KVALUES_MXFP4
from mobius_lite.formats.ggml.nvfp4 import UE4M3_HALF
from mobius_lite.formats.ggml.types import GGML_TYPES, CodeForm


@dataclass(frozen=True)
class ExactCodes:
    """One weight [..., N, K] as codes: codes uint8 [..., N, K / block, block], scales float32
    [..., N, K / block], mins float32 [..., N, K / block] or None; value =
    (code - zero_point) * scale - min."""

    codes: np.ndarray
    scales: np.ndarray
    zero_point: int
    bits: int
    mins: np.ndarray | None = None

    @property
    def block_size(self) -> int:
        return int(self.codes.shape[-1])


# the types with an exact code form (their GGMLType rows' `exact`), in ggml's order
CODE_FORMS: dict[str, CodeForm] = {
    t.name: t.exact for t in GGML_TYPES.values() if t.exact is not None
}
EXACT_CODE_TYPES: tuple[str, ...] = tuple(CODE_FORMS)


def code_form(type_name: str) -> CodeForm | None:
    """The type's exact code form, or None when it has none."""
    return CODE_FORMS.get(type_name)


def _q4_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    return _nibbles(blocks[..., 2:18]), f16_at(blocks, 0)[..., 0], None


def _q8_0(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    return blocks[..., 2:34] ^ np.uint8(0x80), f16_at(blocks, 0)[..., 0], None


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = f16_at(blocks, 0), f16_at(blocks, 2)
    sc, m = _scale_min_k4(blocks[..., 4:16])
    codes = _per32(_nibbles_256(blocks[..., 16:144]))  # [..., 8, 32]
    return codes, d * sc.astype(np.float32), dmin * m.astype(np.float32)


def _q6_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    ql = blocks[..., 0:128].reshape(*blocks.shape[:-1], 2, 2, 32)
    qh = blocks[..., 128:192].reshape(*blocks.shape[:-1], 2, 32)
    low = bit_fields(ql, 4, 2, axis=-3).reshape(*blocks.shape[:-1], 256)
    high = bit_fields(qh, 2, 4, axis=-2).reshape(*blocks.shape[:-1], 256)
    codes = _per16(low | (high << np.uint8(4))) + np.uint8(96)  # q - 32 + 128
    return codes, f16_at(blocks, 208) * as_int8(blocks[..., 192:208]).astype(np.float32), None


def _iq2_xxs(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
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


def _mxfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """qs byte j: element j (low nibble), element j + 16 (high); scale 2^(e - 128)."""
    return nibble_lookup(FP4_CODES, blocks[..., 1:17]), E8M0_HALF[blocks[..., 0]], None


def _nvfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, None]:
    """Group s of a superblock: qs[8 s + j] holds its element j (low) and j + 8 (high)."""
    lead = blocks.shape[:-1]
    codes = nibble_lookup(FP4_CODES, blocks[..., 4:36].reshape(*lead, 4, 8))  # [..., 4, 16]
    return codes, UE4M3_HALF[blocks[..., 0:4]], None


_CODERS = {
    "Q4_0": _q4_0,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q6_K": _q6_k,
    "IQ2_XXS": _iq2_xxs,
    "MXFP4": _mxfp4,
    "NVFP4": _nvfp4,
}


def exact_codes(type_name: str, data: np.ndarray) -> ExactCodes:
    """ggml rows uint8 [..., row_bytes] -> their exact code form (module table).

    ValueError naming the type when it has none.
    """
    form = code_form(type_name)
    if form is None:
        raise ValueError(
            f"ggml {type_name} has no exact integer-code form; types with one: "
            f"{', '.join(EXACT_CODE_TYPES)}"
        )
    blocks = as_blocks(data, GGML_TYPES[type_name])  # [..., n_blocks, block_bytes]
    codes, scales, mins = _CODERS[type_name](blocks)
    lead = blocks.shape[:-2]
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(*lead, -1, form.block_size)
    scales = np.ascontiguousarray(scales, dtype=np.float32).reshape(*lead, -1)
    if mins is not None:
        mins = np.ascontiguousarray(mins, dtype=np.float32).reshape(*lead, -1)
    return ExactCodes(codes, scales, form.zero_point, form.bits, mins)
