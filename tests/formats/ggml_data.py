"""Random valid ggml blocks for codec tests: every code byte value, finite fp16 scales."""

from __future__ import annotations

import numpy as np

from mobius_lite.formats.ggml.types import GGML_TYPES

# Byte offsets of the fp16 fields inside one block (ggml-common.h block_* structs): d, and
# m / dmin where the type has one. Every other byte is codes or packed sub-scales, for which
# any value is valid.
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}

# fp16 bit patterns every scale field set should contain: +0, -0, smallest subnormal, largest
# negative subnormal, smallest normal, +-max finite, +-1, a negative tiny normal.
SPECIAL_F16 = np.array(
    [0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00, 0x8400],
    dtype=np.uint16,
)


def random_finite_f16_bits(rng: np.random.Generator, count: int) -> np.ndarray:
    """`count` fp16 bit patterns: SPECIAL_F16 first (as far as they fit), then uniform random
    finite patterns (any sign, subnormal to 65504), shuffled."""
    bits = rng.integers(0, 1 << 16, size=count, dtype=np.uint16)
    inf_or_nan = ((bits >> 10) & 0x1F) == 0x1F
    bits[inf_or_nan] &= np.uint16(0xBFFF)  # clear the exponent's top bit: finite
    k = min(count, SPECIAL_F16.size)
    bits[:k] = SPECIAL_F16[:k]
    return rng.permutation(bits)


def random_rows(
    rng: np.random.Generator, type_name: str, lead: tuple[int, ...], n_blocks: int
) -> np.ndarray:
    """uint8 [*lead, n_blocks * block_bytes] of valid blocks.

    Code bytes are a shuffled tiling of 0..255 (all values present once there are >= 256 of
    them, hence every nibble / 2-bit / high-bit value); fp16 fields are finite.
    """
    t = GGML_TYPES[type_name]
    blocks = np.zeros((*lead, n_blocks, t.block_bytes), dtype=np.uint8)
    fields = F16_FIELDS[type_name]
    is_code = np.ones(t.block_bytes, dtype=bool)
    for offset in fields:
        is_code[offset : offset + 2] = False
    n_code = int(np.prod(lead, dtype=np.int64)) * n_blocks * int(is_code.sum())
    blocks[..., is_code] = rng.permutation(
        np.resize(np.arange(256, dtype=np.uint8), n_code)
    ).reshape(blocks[..., is_code].shape)
    n_scales = int(np.prod(lead, dtype=np.int64)) * n_blocks * len(fields)
    scales = random_finite_f16_bits(rng, n_scales).view(np.uint8).reshape(-1, len(fields), 2)
    for i, offset in enumerate(fields):
        blocks[..., offset : offset + 2] = scales[:, i].reshape(*lead, n_blocks, 2)
    return blocks.reshape(*lead, n_blocks * t.block_bytes)


def code_bytes_cover_all_values(type_name: str, data: np.ndarray) -> bool:
    """Whether the non-fp16 bytes of `data` take every value 0..255."""
    t = GGML_TYPES[type_name]
    blocks = data.reshape(-1, t.block_bytes)
    is_code = np.ones(t.block_bytes, dtype=bool)
    for offset in F16_FIELDS[type_name]:
        is_code[offset : offset + 2] = False
    return np.unique(blocks[:, is_code]).size == 256
