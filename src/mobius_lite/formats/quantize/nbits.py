"""int4 / int8: onnxruntime-genai's builder convention, MatMulNBits blocks along K.

The builder quantizes each MatMul weight with onnxruntime's `quantize_matmul_4bits` /
`quantize_matmul_8bits` (MLAS' block-wise quantizer). Per block of `block` elements of a row:
- symmetric: m = the block's max if |max| > |min|, else its min; scale = m / -2^(bits-1);
  zero point 2^(bits-1) (the schema default: not stored);
- asymmetric: lo = min(min, 0), hi = max(max, 0); scale = (hi - lo) / (2^bits - 1); zero point
  = clip(roundf(-lo / scale), 0, 2^bits - 1), stored as uint8 (4 bits: two per byte, low nibble
  first, a last odd nibble 8);
- code = clip(roundf(x * (1 / scale) + zero point), 0, 2^bits - 1) (roundf: halves away from
  zero; 1 / scale taken as 0 when the scale is 0).
Packed as MatMulNBits reads it: B uint8 [N, K / block, block * bits / 8] (4 bits: element 2i
in the low nibble of byte i), scales [N, K / block] in the activations' type.

`NBitsQuantize` is the conversion of one part ("b", "scales", "zero_points") of a dense row-
major [.., N, K] tensor, row by row; verify recomputes it with onnxruntime's own quantizer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.dense import DenseStorage
from mobius_lite.formats.parts import CodeLayout, Operand, PartOf
from mobius_lite.formats.quantize.nbits_weight import NBitsBlocks, NBitsWeight
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.formats.quantize.rounding import round_half_away
from mobius_lite.formats.storage import Bytes, Conversion, Storage
from mobius_lite.formats.weight import WeightFormat

PARTS = ("b", "scales", "zero_points")


def quantize_blocks(
    rows: np.ndarray, bits: int, block: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 [n, K] -> (codes uint8 [n, K / block, block], scales float32 [n, K / block],
    zero points uint8 [n, K / block]) by the module's definition."""
    x = np.asarray(rows, dtype=np.float32).reshape(len(rows), -1, block)
    top = np.float32((1 << bits) - 1)
    low, high = x.min(axis=-1), x.max(axis=-1)
    if symmetric:
        extreme = np.where(np.abs(high) > np.abs(low), high, low)
        scale = (extreme / np.float32(-(1 << (bits - 1)))).astype(np.float32)
        zero = np.full(scale.shape, np.float32(1 << (bits - 1)))
    else:
        low, high = np.minimum(low, np.float32(0)), np.maximum(high, np.float32(0))
        scale = ((high - low) / top).astype(np.float32)
    inverse = np.zeros_like(scale)
    np.divide(np.float32(1), scale, out=inverse, where=scale != 0)
    if not symmetric:
        zero = np.clip(round_half_away(-low * inverse), 0, top).astype(np.float32)
    codes = np.clip(round_half_away(x * inverse[..., None] + zero[..., None]), 0, top)
    return codes.astype(np.uint8), scale, zero.astype(np.uint8)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., m] -> MatMulNBits bytes (4 bits: two per byte, low nibble first)."""
    if bits == 8:
        return codes
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def pack_zero_points(zero: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [n, k_blocks] -> [n, ceil(k_blocks * bits / 8)] (an odd last nibble is 8)."""
    if bits == 8:
        return zero
    if zero.shape[-1] % 2:
        zero = np.concatenate([zero, np.full((*zero.shape[:-1], 1), 8, np.uint8)], axis=-1)
    return pack_codes(zero, 4)


def part_shape(
    recipe: Recipe, part: str, stored: tuple[int, ...], repeat: int = 1, flat: bool = False
) -> tuple[int, ...]:
    """The shape of one part for a dense weight stored [..., N, K]: MatMulNBits' (B [..., N,
    K / block, blob]) or, `flat`, QMoE's (B [..., N * repeat, K / block * blob])."""
    *lead, n, k = stored
    k_blocks = k // recipe.block
    rows = (*lead, n * repeat)
    if part == "b":
        blob = recipe.block * recipe.type.bits // 8
        return (*rows, k_blocks * blob) if flat else (*rows, k_blocks, blob)
    if part == "scales":
        return (*rows, k_blocks)
    return (*rows, (k_blocks * recipe.type.bits + 7) // 8)


@dataclass(frozen=True)
class NBitsQuantize:
    """Dense rows of `row` elements -> one MatMulNBits part (`part`; None until a name map's
    layout picks it), scales in `out` (the activations' type)."""

    source: np.dtype
    recipe: Recipe
    row: int
    out: np.dtype
    part: str | None = None
    repeat: int = 1  # each row given this many times in a row (QMoE's fc1: 2)
    flat: bool = False  # QMoE's 2-D B per expert instead of MatMulNBits' blocks
    name: str = "quantize"

    @property
    def unit_bytes(self) -> int:
        return self.row * self.source.itemsize

    @property
    def verbatim(self) -> bool:
        return False

    def with_part(self, part: str, repeat: int = 1, flat: bool = False) -> NBitsQuantize:
        if part not in PARTS:
            raise RouteError(f"no MatMulNBits part {part!r}")
        return replace(self, part=part, repeat=repeat, flat=flat)

    def _rows(self, raw: Bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=self.source).astype(np.float32).reshape(-1, self.row)

    def _select(self, b: np.ndarray, scales: np.ndarray, zero: np.ndarray) -> np.ndarray:
        if self.part == "b":
            chosen = b
        elif self.part == "scales":
            chosen = scales.astype(self.out)
        elif self.part == "zero_points":
            chosen = zero
        else:
            raise RouteError(f"{self.recipe.type.value} weights are written as parts; none chosen")
        return np.repeat(chosen, self.repeat, axis=0) if self.repeat > 1 else chosen

    def convert(self, raw: Bytes) -> Bytes:
        bits = self.recipe.type.bits
        codes, scales, zero = quantize_blocks(
            self._rows(raw), bits, self.recipe.block, self.recipe.symmetric
        )
        chosen = self._select(pack_codes(codes, bits), scales, pack_zero_points(zero, bits))
        return memoryview(np.ascontiguousarray(chosen).reshape(-1).view(np.uint8))

    def recompute(self, raw: Bytes) -> bytes:
        """onnxruntime's own quantizer (the one onnxruntime-genai's builder calls)."""
        from onnxruntime.capi import _pybind_state as ort_c

        rows = np.array(self._rows(bytes(raw)))
        n, k = rows.shape
        bits, block = self.recipe.type.bits, self.recipe.block
        k_blocks = k // block
        b = np.zeros((n, k_blocks, block * bits // 8), np.uint8)
        zero = np.zeros((n, (k_blocks * bits + 7) // 8), np.uint8)
        scales = np.zeros((n, k_blocks), np.float32)
        quantize = ort_c.quantize_matmul_8bits if bits == 8 else ort_c.quantize_matmul_4bits
        quantize(b, np.ascontiguousarray(rows.T), scales, zero, block, n, k, self.recipe.symmetric)
        return np.ascontiguousarray(self._select(b, scales, zero)).tobytes()

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return part_shape(self.recipe, self.part or "b", stored, self.repeat, self.flat)


@dataclass(frozen=True)
class NBitsStorage:
    """A dense float tensor (`source`) exported as int4 / int8 MatMulNBits blocks."""

    source: DenseStorage
    recipe: Recipe
    row: int  # elements per row (K)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def numpy_dtype(self) -> np.dtype:
        return self.source.dtype

    def nbytes(self, shape: tuple[int, ...]) -> int:
        return self.source.nbytes(shape)

    def conversion_to(self, target: Storage) -> Conversion:
        if not isinstance(target, DenseStorage):
            raise RouteError(f"no conversion from {self.recipe.type.value} to {target.name}")
        return NBitsQuantize(self.source.dtype, self.recipe, self.row, target.dtype)

    def part_conversion(self, part: PartOf, shape: tuple[int, ...], dtype: np.dtype) -> Conversion:
        """One part of the blocks, scales in `dtype`: MatMulNBits' (nbits_weight.NBitsBlocks)
        or a QMoE operand's (a CodeLayout for fc1 / fc2: 2-D B per expert, fc1 rows twice)."""
        quantize = NBitsQuantize(self.source.dtype, self.recipe, self.row, dtype)
        layout = part.layout
        if isinstance(layout, NBitsBlocks):
            return quantize.with_part(part.part)
        if isinstance(layout, CodeLayout) and layout.operand is not Operand.MATMUL:
            return quantize.with_part(part.part, layout.operand.repeat, flat=True)
        raise RouteError(f"{self.recipe.type.value} weights have no re-layout {layout.tag!r}")

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> WeightFormat | None:
        return NBitsWeight.choose(self.recipe, dtype, backend, tuple(shape))
