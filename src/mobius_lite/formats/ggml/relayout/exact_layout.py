"""Exact codes (exact_codes.py) packed as onnxruntime's block-wise kernel inputs.

MatMulNBits and QMoE share one layout per [N, K] weight: B uint8 [N, K / block, block * bits
/ 8] (4 bits: element 2i in the low nibble of byte i, 2i + 1 in the high one), scales of the
activations' type [N, K / block], and uint8 zero points [N, ceil(K / block * bits / 8)]
(4 bits: two per byte, low nibble first). Zero points are given only where they differ from
the schema default 2^(bits - 1); both fast kernels need them uint8 (a float zero point
takes a dequantize-per-call path). Q4_K's mins are the extra [N, K / 32] float32 term.

`center_mins` (Q4_K) moves each block's min into an integer zero point: z = clip(round(b / a),
0, 2^bits - 1) per block, the min term keeping only the residual r = b - a * z, so value =
a * (code - z) - r. Where the kernel quantizes x to int8 per block (accuracy 4) its error is
then sum a * (code - z) * (x~ - x), over a centered weight as llama.cpp's Q4_K x Q8_K dot
has, instead of sum a * code * (x~ - x) over codes spanning [0, 15 a]. A block keeps z = 0
(r = b) unless every code's a * (code - z) - r is ggml's float32 value bit for bit.

`block_size` may be smaller than the type's own block (a power of two dividing it): each
scale then repeats over its sub-blocks, still exact. `repeat` gives every row (N axis)
`repeat` times in a row, as the SwiGLU form of the fused experts wants for fc1
([u0, u0, u1, u1, ...]: codes, scales and zero points alike).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mobius_lite.formats.ggml.relayout.exact_codes import (
    CODE_FORMS,
    ExactCodes,
    code_form,
    exact_codes,
)
from mobius_lite.formats.ggml.types import GGML_TYPES


@dataclass(frozen=True)
class NBitsLayout:
    """Block-wise kernel inputs for one weight [..., N, K] (module doc)."""

    b: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    mins: np.ndarray | None
    bits: int
    block_size: int

    def arrays(self) -> dict[str, np.ndarray]:
        """The present inputs by part name ("b", "scales", "zero_points", "mins")."""
        out = {"b": self.b, "scales": self.scales}
        if self.zero_points is not None:
            out["zero_points"] = self.zero_points
        if self.mins is not None:
            out["mins"] = self.mins
        return out


def default_zero_point(bits: int) -> int:
    return 1 << (bits - 1)


def layout_parts(type_name: str) -> tuple[str, ...]:
    """The parts a type's layout has (zero points only where not the default)."""
    form = CODE_FORMS[type_name]
    parts = ["b", "scales"]
    if form.zero_point != default_zero_point(form.bits):
        parts.append("zero_points")
    if form.has_mins:
        parts.append("mins")
    return tuple(parts)


def check_block_size(type_name: str, block_size: int) -> None:
    form = code_form(type_name)
    if form is None:
        raise ValueError(f"ggml {type_name} has no exact block-wise layout")
    if block_size < 16 or block_size & (block_size - 1) or form.block_size % block_size:
        raise ValueError(
            f"block_size {block_size} must be a power of two >= 16 dividing {type_name}'s "
            f"block of {form.block_size}"
        )


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., block] -> B bytes [..., block * bits / 8]."""
    if bits == 8:
        return codes
    return codes[..., 0::2] | (codes[..., 1::2] << np.uint8(4))


def packed_zero_points(lead: tuple[int, ...], n_blocks: int, value: int, bits: int) -> np.ndarray:
    """A constant zero point in the kernels' packed uint8 form [*lead, ceil(n_blocks*bits/8)]
    (4 bits: an odd count's last high nibble is padding, set to the same value)."""
    if bits == 8:
        return np.full((*lead, n_blocks), value, dtype=np.uint8)
    return np.full((*lead, (n_blocks + 1) // 2), value | (value << 4), dtype=np.uint8)


def pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """uint8 zero points [..., n_blocks] -> the kernels' packed form [..., ceil(n_blocks *
    bits / 8)] (4 bits: low nibble first; an odd count's last high nibble is 0)."""
    if bits == 8:
        return np.ascontiguousarray(zero_points, dtype=np.uint8)
    if zero_points.shape[-1] % 2:
        pad = np.zeros((*zero_points.shape[:-1], 1), dtype=np.uint8)
        zero_points = np.concatenate([zero_points, pad], axis=-1)
    return pack_codes(zero_points.astype(np.uint8), bits)


def centered_mins(code: ExactCodes) -> tuple[np.ndarray, np.ndarray]:
    """(zero points uint8 [..., N, K / block], residual mins float32 [..., N, K / block]) of
    codes whose min shares the scale's block (module doc: center_mins)."""
    assert code.mins is not None and code.mins.shape == code.scales.shape
    a, b, zp = code.scales, code.mins, code.zero_point
    top = (1 << code.bits) - 1
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = b.astype(np.float64) / a.astype(np.float64)
        usable = np.isfinite(a) & np.isfinite(b) & (a != 0) & np.isfinite(ratio)
        z = np.clip(zp + np.rint(np.where(usable, ratio, 0)), 0, top).astype(np.float32)
        z = np.where(usable, z, np.float32(zp))
        r = b - a * (z - np.float32(zp))  # exact for Q4_K: a = d * sc has <= 17 bits
        r = np.where(r == 0, np.float32(-0.0), r)  # (+-0) - (-0) is +0, as ggml's a*q - b
        same = np.ones(a.shape, dtype=bool)
        for q in np.arange(top + 1, dtype=np.float32):  # each code's float32, both forms
            ggml = a * (q - np.float32(zp)) - b
            ours = a * (q - z) - r
            same &= ggml.view(np.uint32) == ours.view(np.uint32)
    keep = same & (z != zp)
    return np.where(keep, z, zp).astype(np.uint8), np.where(keep, r, b).astype(np.float32)


def layout_from_codes(
    code: ExactCodes, block_size: int | None = None, repeat: int = 1, center_mins: bool = False
) -> NBitsLayout:
    """Pack exact codes (module doc for block_size, repeat and center_mins)."""
    block = block_size or code.block_size
    if code.block_size % block:
        raise ValueError(f"block_size {block} does not divide the codes' {code.block_size}")
    split = code.block_size // block
    lead = code.codes.shape[:-2]
    codes = code.codes.reshape(*lead, -1, block)
    scales = np.repeat(code.scales, split, axis=-1) if split > 1 else code.scales
    mins, block_zero_points = code.mins, None
    if center_mins and mins is not None:
        block_zero_points, mins = centered_mins(code)
        block_zero_points = np.repeat(block_zero_points, split, axis=-1)
    if repeat > 1:  # along the N axis: the axis before the blocks
        codes, scales = np.repeat(codes, repeat, axis=-3), np.repeat(scales, repeat, axis=-2)
        if mins is not None:
            mins = np.repeat(mins, repeat, axis=-2)
        if block_zero_points is not None:
            block_zero_points = np.repeat(block_zero_points, repeat, axis=-2)
    zero_points = None
    if block_zero_points is not None:
        zero_points = pack_zero_points(block_zero_points, code.bits)
    elif code.zero_point != default_zero_point(code.bits):
        zero_points = packed_zero_points(
            scales.shape[:-1], scales.shape[-1], code.zero_point, code.bits
        )
    return NBitsLayout(
        b=np.ascontiguousarray(pack_codes(codes, code.bits)),
        scales=np.ascontiguousarray(scales),
        zero_points=zero_points,
        mins=mins,
        bits=code.bits,
        block_size=block,
    )


def to_nbits_layout(
    type_name: str,
    data: np.ndarray,
    block_size: int | None = None,
    repeat: int = 1,
    center_mins: bool = False,
) -> NBitsLayout:
    """ggml rows uint8 [..., N, row_bytes] -> their exact block-wise layout."""
    if block_size is not None:
        check_block_size(type_name, block_size)
    return layout_from_codes(exact_codes(type_name, data), block_size, repeat, center_mins)


def layout_bytes_per_element(
    type_name: str, block_size: int | None = None, repeat: int = 1
) -> float:
    """Bytes the layout stores per weight element (all parts), for the cost lines and docs."""
    form = CODE_FORMS[type_name]
    block = block_size or form.block_size
    per_block = block * form.bits / 8 + 4  # codes + float32 scale
    if "zero_points" in layout_parts(type_name):
        per_block += form.bits / 8
    if form.has_mins:
        per_block += 4 * block / 32
    return repeat * per_block / block


def layout_cost(type_name: str, block_size: int | None = None, repeat: int = 1) -> float:
    """The layout's bytes over the ggml blocks' bytes (e.g. 1.36 for Q4_K)."""
    t = GGML_TYPES[type_name]
    return layout_bytes_per_element(type_name, block_size, repeat) / (
        t.block_bytes / t.block_elements
    )
