"""Q4_K experts on onnxruntime's QMoE exactly: its min term as more kernel columns and rows.

Q4_K's value is d*sc*q - dmin*m per 32-block (q 0..15; sc, m 6-bit; d, dmin fp16 per 256).
QMoE computes (code - zero_point) * scale per block only, so the min goes in by two identities
(every stored value exact in float32; no weight re-quantized):

- **Q4_K up (fc1): augmented input.** W x = sum_k d*sc*q*x_k - sum_j dmin*m_j * S_j(x), S_j
  the sum of x over 32-block j. The graph appends the sums to the input (`augment_input`:
  each super-block's 8 sums padded to one kernel block of zeros), and every fc1 row gets those
  columns valued -dmin*m: code zp - m with scale dmin (8 bits: zp 128; 4 bits: m = lo + 16*hi
  does not fit a nibble, so two column sets, scales dmin and 16*dmin, zp 15, and the sums
  twice). QMoE's output width is its input's, so fc2 gets zero rows there (sliced off).
- **Q4_K down (fc2): doubled intermediate.** W2 h = A2 h - B2 h with B2[n, i] = dmin*m of i's
  32-block, constant per block: fc1 gives h `copies` times (its rows tiled) and fc2 is
  [A2 | -B2] over them, -B2 being block-constant codes zp - m (8 bits: one copy of -B2, two
  of h; 4 bits: lo and hi, three of h).

The main part is the type's exact code (exact_codes.py), at 8 bits code - zp + 128. One layer
has one bit width and block size (onnxruntime 1.32 CPU refuses mixed widths): 8 bits and
block 16 when Q6_K is in the layer, else the wider of the types, or `Q4_K_ONLY_BITS` for an
all-4-bit layer under int8 (4 without: 4-bit experts keep f32 activations at accuracy 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mobius_lite.formats.ggml.blocks import as_blocks, f16_at
from mobius_lite.formats.ggml.kquants import _scale_min_k4
from mobius_lite.formats.ggml.relayout.exact_codes import code_form, exact_codes
from mobius_lite.formats.ggml.relayout.exact_layout import NBitsLayout, pack_codes
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.parts import Operand

SUPER, SUB = 256, 32  # Q4_K: 256 values per fp16 (d, dmin), 8 sub-blocks of 32 per super-block
SUMS_PER_SUPER = SUPER // SUB
MIN_TYPE = "Q4_K"
# An all-4-bit layer (Q4_K with Q4_K / Q4_0) under int8: 8-bit QMoE ran faster than 4-bit at
# accuracy 4 on the mid model's experts at one row, 2 threads (0.93 vs 1.03, 1.52 vs 1.87
# and 1.79 vs 2.06 ms in three runs on a shared machine:
# benchmarks/investigations/qmoe_min_layouts.py), and needs no zero points. Without int8 such a
# layer is 4-bit (accuracy 0, f32 activations, exact).
Q4_K_ONLY_BITS = 8


@dataclass(frozen=True)
class MinTermPlan:
    """One MoE layer's QMoE layout: `bits`, `block` (kernel block along K), whether fc1's
    input carries Q4_K up's block sums (`augmented`), how many copies of the intermediate
    (`copies` > 1 for Q4_K down)."""

    bits: int
    block: int
    augmented: bool
    copies: int

    @property
    def min_parts(self) -> int:
        """Column / copy sets one Q4_K min takes: 1 at 8 bits, 2 (lo, hi nibble) at 4."""
        return 1 if self.bits == 8 else 2

    @property
    def min_zero_point(self) -> int:
        return 128 if self.bits == 8 else 15

    def kind(self, slot: str) -> str:
        """The parameter-name tag of slot "fc1" / "fc2" under this plan (MinTermOperand's)."""
        return f"{slot}q{self.bits}b{self.block}c{self.copies}{'s' if self.augmented else 'n'}"

    def extra_columns(self, hidden: int) -> int:
        """Columns the block sums add to fc1's input of width `hidden`."""
        return hidden // SUPER * self.block * self.min_parts if self.augmented else 0


@dataclass(frozen=True)
class MinTermOperand:
    """The min-term layout of one expert slot (fc1 or fc2) under a layer's `plan`: a re-layout
    whose parts (formats/parts.py) are the slot's QMoE operand."""

    operand: Operand
    plan: MinTermPlan

    @property
    def tag(self) -> str:
        return self.plan.kind(self.operand.value)


def min_term_plan(up_type: str, down_type: str, int8: bool) -> MinTermPlan | str:
    """The layer's plan when up or down is Q4_K, or why none fits exactly (a sentence)."""
    forms = {t: code_form(t) for t in (up_type, down_type)}
    missing = [t for t, f in forms.items() if f is None]
    if missing:
        return f"ggml {missing[0]} experts have no exact QMoE layout"
    widest = max(f.bits for f in forms.values())  # type: ignore[union-attr]
    bits = widest if widest == 8 or not int8 else Q4_K_ONLY_BITS
    if bits == 8 and not int8:
        return (
            f"ggml {up_type} / {down_type} experts need an 8-bit QMoE layout: QMoE computes "
            "8-bit experts with int8 activations only"
        )
    block = min(f.block_size for f in forms.values())  # type: ignore[union-attr]
    copies = 1 + (1 if bits == 8 else 2) if down_type == MIN_TYPE else 1
    return MinTermPlan(bits, block, up_type == MIN_TYPE, copies)


# ----------------------------------------------------------------------------- codes
@dataclass(frozen=True)
class BlockCodes:
    """codes uint8 [..., N, n_blocks, block], scales float32 [..., N, n_blocks], zero points
    uint8 [..., N, n_blocks]: value = (code - zero point) * scale per block."""

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray

    @staticmethod
    def concat(parts: list[BlockCodes], axis: int) -> BlockCodes:
        """Along the block axis (-2 of codes, -1 of scales) or the row axis (-3 / -2)."""
        codes = np.concatenate([p.codes for p in parts], axis=axis)
        scales = np.concatenate([p.scales for p in parts], axis=axis + 1)
        zero_points = np.concatenate([p.zero_points for p in parts], axis=axis + 1)
        return BlockCodes(codes, scales, zero_points)


def q4_k_mins(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K rows [..., N, row_bytes] -> (m uint8 [..., N, K / 32], dmin f32 [..., N, K / 256])."""
    blocks = as_blocks(rows, GGML_TYPES[MIN_TYPE])  # [..., N, K / 256, 144]
    _, m = _scale_min_k4(blocks[..., 4:16])
    return m.reshape(*m.shape[:-2], -1), f16_at(blocks, 2)[..., 0]


def main_codes(type_name: str, rows: np.ndarray, plan: MinTermPlan) -> BlockCodes:
    """The type's exact codes (without Q4_K's min) at the plan's bits and block."""
    code = exact_codes(type_name, rows)
    codes, zero_point = code.codes, code.zero_point
    if plan.bits == 8 and code.bits == 4:  # same value with the 8-bit default zero point
        codes, zero_point = codes + np.uint8(128 - zero_point), 128
    split = code.block_size // plan.block
    lead = codes.shape[:-2]
    codes = codes.reshape(*lead, -1, plan.block)
    scales = np.repeat(code.scales, split, axis=-1) if split > 1 else code.scales
    return BlockCodes(codes, scales, np.full(scales.shape, zero_point, dtype=np.uint8))


def _min_parts(m: np.ndarray, dmin: np.ndarray, plan: MinTermPlan):
    """(m part, its scale) pairs summing to m * dmin: m itself, or its nibbles lo, 16 * hi."""
    if plan.min_parts == 1:
        return [(m, dmin)]
    return [(m & np.uint8(15), dmin), (m >> np.uint8(4), dmin * np.float32(16))]


def sum_columns(rows: np.ndarray, plan: MinTermPlan) -> BlockCodes:
    """fc1's columns for the input's block sums: per min part and super-block one kernel
    block, codes zp - m for its 8 sums then zp (value 0) for the padding; scale dmin (x16)."""
    m, dmin = q4_k_mins(rows)
    z = plan.min_zero_point
    parts = []
    for part, scale in _min_parts(m, dmin, plan):
        per_super = part.reshape(*part.shape[:-1], -1, SUMS_PER_SUPER)  # [..., N, K/256, 8]
        codes = np.full((*per_super.shape[:-1], plan.block), z, dtype=np.uint8)
        codes[..., :SUMS_PER_SUPER] = np.uint8(z) - per_super
        parts.append(BlockCodes(codes, scale, np.full(scale.shape, z, dtype=np.uint8)))
    return BlockCodes.concat(parts, axis=-2)


def min_copies(rows: np.ndarray, plan: MinTermPlan) -> BlockCodes:
    """fc2's -B2 over the intermediate's extra copies: block-constant codes zp - m, scale
    dmin (x16), per min part one copy of the intermediate's width."""
    m, dmin = q4_k_mins(rows)
    z = plan.min_zero_point
    per_sub = SUB // plan.block  # kernel blocks per 32-block
    parts = []
    for part, scale in _min_parts(m, dmin, plan):
        block_m = np.repeat(part, per_sub, axis=-1)  # [..., N, I / block]
        codes = np.repeat((np.uint8(z) - block_m)[..., None], plan.block, axis=-1)
        scales = np.repeat(scale, SUPER // plan.block, axis=-1)
        parts.append(BlockCodes(codes, scales, np.full(scales.shape, z, dtype=np.uint8)))
    return BlockCodes.concat(parts, axis=-2)


def fc1_codes(type_name: str, rows: np.ndarray, plan: MinTermPlan) -> BlockCodes:
    """Up [..., I, row_bytes] -> fc1 [..., 2 * copies * I, K' / block, block]: every row twice
    (the SwiGLU form), the whole tiled `copies` times, with the sum columns for Q4_K."""
    main = main_codes(type_name, rows, plan)
    if plan.augmented:
        main = BlockCodes.concat([main, sum_columns(rows, plan)], axis=-2)
    twice = BlockCodes(
        np.repeat(main.codes, 2, axis=-3),
        np.repeat(main.scales, 2, axis=-2),
        np.repeat(main.zero_points, 2, axis=-2),
    )
    return BlockCodes.concat([twice] * plan.copies, axis=-3)


def fc2_codes(type_name: str, rows: np.ndarray, plan: MinTermPlan) -> BlockCodes:
    """Down [..., H, row_bytes] -> fc2 [..., H', copies * I / block, block]: [A2 | -B2] for
    Q4_K, with zero rows (scale 0) for fc1's sum columns."""
    out = main_codes(type_name, rows, plan)
    if plan.copies > 1:
        out = BlockCodes.concat([out, min_copies(rows, plan)], axis=-2)
    hidden = out.codes.shape[-3]
    extra = plan.extra_columns(hidden)
    if extra:
        lead, (n_blocks, block) = out.codes.shape[:-3], out.codes.shape[-2:]
        z = 1 << (plan.bits - 1)  # the default zero point, so the rows add no zero points
        zero = BlockCodes(
            np.full((*lead, extra, n_blocks, block), z, dtype=np.uint8),
            np.zeros((*lead, extra, n_blocks), dtype=np.float32),
            np.full((*lead, extra, n_blocks), z, dtype=np.uint8),
        )
        out = BlockCodes.concat([out, zero], axis=-3)
    return out


def pack_zero_points(zero_points: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [..., n_blocks] -> the kernels' packed form (4 bits: two per byte, low first; an
    odd count's last high nibble repeats the last value)."""
    if bits == 4 and zero_points.shape[-1] % 2:
        zero_points = np.concatenate([zero_points, zero_points[..., -1:]], axis=-1)
    return pack_codes(zero_points, bits)


def min_term_layout(type_name: str, slot: str, rows: np.ndarray, plan: MinTermPlan) -> NBitsLayout:
    """ggml expert rows [..., N, row_bytes] -> the plan's QMoE operand for `slot`: B [..., N',
    K' * bits / 8], scales, zero points (None when all are the default 2^(bits-1))."""
    blocks = (fc1_codes if slot == "fc1" else fc2_codes)(type_name, rows, plan)
    lead = blocks.codes.shape[:-2]
    b = pack_codes(blocks.codes, plan.bits).reshape(*lead, -1)
    zero_points = None
    if has_zero_points(type_name, slot, plan):
        zero_points = pack_zero_points(blocks.zero_points, plan.bits)
    return NBitsLayout(
        b=np.ascontiguousarray(b),
        scales=np.ascontiguousarray(blocks.scales, dtype=np.float32),
        zero_points=None if zero_points is None else np.ascontiguousarray(zero_points),
        mins=None,
        bits=plan.bits,
        block_size=plan.block,
    )


def has_zero_points(type_name: str, slot: str, plan: MinTermPlan) -> bool:
    """Whether the plan's operand for this slot has a zero-point part (known without data)."""
    if plan.bits == 8:
        return False
    form = code_form(type_name)
    assert form is not None
    sums_or_copies = plan.augmented if slot == "fc1" else plan.copies > 1
    return form.zero_point != 8 or sums_or_copies


def operand_shapes(
    type_name: str, slot: str, plan: MinTermPlan, shape: tuple[int, ...]
) -> dict[str, tuple[int, ...]]:
    """The operand's parts and shapes for a logical expert slot [..., N, K] (no data read)."""
    *lead, n, k = shape
    if slot == "fc1":
        n_out, k_in = 2 * plan.copies * n, k + plan.extra_columns(k)
    else:
        n_out, k_in = n + plan.extra_columns(n), plan.copies * k
    n_blocks = k_in // plan.block
    shapes = {
        "b": (*lead, n_out, k_in * plan.bits // 8),
        "scales": (*lead, n_out, n_blocks),
    }
    if has_zero_points(type_name, slot, plan):
        shapes["zero_points"] = (*lead, n_out, (n_blocks * plan.bits + 7) // 8)
    return shapes


def logical_weight(
    decoded: np.ndarray, slot: str, plan: MinTermPlan, n: int, k: int
) -> np.ndarray | None:
    """The expert weight [..., n, k] an operand stands for, from the operand [..., N', K']
    decoded by the kernel's definition (exact_parts.layout_decode): its row copies and sum
    columns folded back, float32; None when its structure is not the plan's (repeated rows
    differ, padding not zero). A zero's sign may differ from ggml's own dequantization (0 * -d,
    the min added as -dmin*m): compare values, not bits."""
    with np.errstate(over="ignore", invalid="ignore"):
        if slot == "fc1":
            rows = decoded.reshape(*decoded.shape[:-2], plan.copies * n, 2, -1)
            if not (_same(rows[..., 0, :], rows[..., 1, :])):
                return None
            tiled = rows[..., 0, :].reshape(*decoded.shape[:-2], plan.copies, n, -1)
            first = tiled[..., 0, :, :]
            if not all(_same(first, tiled[..., c, :, :]) for c in range(1, plan.copies)):
                return None
            weight, sums = tiled[..., 0, :, :k], tiled[..., 0, :, k:]
            if not plan.augmented:
                return weight
            per_part = sums.reshape(*sums.shape[:-1], plan.min_parts, k // SUPER, plan.block)
            if np.any(per_part[..., SUMS_PER_SUPER:] != 0):
                return None
            mins = per_part[..., :SUMS_PER_SUPER].sum(axis=-3, dtype=np.float32)
            mins = mins.reshape(*mins.shape[:-2], -1)  # [..., n, k / 32]
            per32 = weight.reshape(*weight.shape[:-1], k // SUB, SUB) + mins[..., None]
            return per32.reshape(weight.shape)
        if np.any(decoded[..., n:, :] != 0):
            return None
        copies = decoded[..., :n, :].reshape(*decoded.shape[:-2], n, plan.copies, k)
        if plan.copies == 1:
            return copies[..., 0, :]
        # the min parts first: their sum is exact, so one rounding as ggml's d*sc*q - dmin*m
        return copies[..., 0, :] + copies[..., 1:, :].sum(axis=-2, dtype=np.float32)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def min_term_bytes(type_name: str, slot: str, plan: MinTermPlan, shape: tuple[int, ...]) -> int:
    """Bytes the operand stores for a logical expert slot (all parts)."""
    sizes = {"b": 1, "scales": 4, "zero_points": 1}
    return sum(
        int(np.prod(s)) * sizes[p] for p, s in operand_shapes(type_name, slot, plan, shape).items()
    )


def ggml_bytes(type_name: str, shape: tuple[int, ...]) -> int:
    t = GGML_TYPES[type_name]
    return int(np.prod(shape)) // t.block_elements * t.block_bytes
