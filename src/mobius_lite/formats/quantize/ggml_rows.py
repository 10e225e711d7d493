"""ggml's reference quantizers for Q8_0 and Q4_0 (ggml-quants.c: quantize_row_q8_0_ref,
quantize_row_q4_0_ref), in numpy float32 with ggml's roundings, block by block.

Q8_0 block (34 bytes): d = amax / 127 as fp16, then 32 int8 codes roundf(x / d) (round half
away from zero), computed with id = 1 / d in float32 (0 when d is 0).
Q4_0 block (18 bytes): max = the element of largest magnitude (the first of ties, sign kept),
d = max / -8 as fp16; code = min(15, (int8)(x * id + 8.5)) (truncation toward zero); byte j
holds element j in its low nibble and element j + 16 in its high nibble.
The fp16 scale is rounded to nearest even from the float32 d, which the codes also use.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mobius_lite.formats.quantize.rounding import round_half_away

BLOCK = 32


def _inverse(d: np.ndarray) -> np.ndarray:
    """1 / d in float32, 0 where d is 0 (ggml: `d ? 1.0f/d : 0.0f`)."""
    out = np.zeros_like(d)
    nonzero = d != 0
    np.divide(np.float32(1), d, out=out, where=nonzero)
    return out


def quantize_q8_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 32] -> Q8_0 blocks uint8 [n, 34]."""
    x = np.asarray(blocks, dtype=np.float32)
    d = (np.max(np.abs(x), axis=1, keepdims=True) / np.float32(127)).astype(np.float32)
    codes = round_half_away(x * _inverse(d)).astype(np.int8)
    out = np.empty((len(x), 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = codes.view(np.uint8)
    return out


def quantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """float32 [n, 32] -> Q4_0 blocks uint8 [n, 18]."""
    x = np.asarray(blocks, dtype=np.float32)
    first_largest = np.argmax(np.abs(x), axis=1)[:, None]
    d = (np.take_along_axis(x, first_largest, axis=1) / np.float32(-8)).astype(np.float32)
    shifted = x * _inverse(d) + np.float32(8.5)
    codes = np.minimum(np.trunc(shifted), 15).astype(np.uint8)
    out = np.empty((len(x), 18), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8)
    out[:, 2:] = codes[:, :16] | (codes[:, 16:] << 4)
    return out


QUANTIZERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": quantize_q8_0,
    "Q4_0": quantize_q4_0,
}
