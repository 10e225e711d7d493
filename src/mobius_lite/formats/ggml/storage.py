"""ggml block types as storage: how a GGUF tensor's packed rows become initializer bytes.

A quantized GGUF tensor is stored row by row as whole blocks, viewed as uint8 [..., row_bytes].
`GGMLStorage` converts it to
- uint8 (or its own type): verbatim, the packed rows as they are (the packed routes);
- a dense float type: `Dequantize`, the numpy reference decode block by block (--dequantize);
  verify recomputes it with gguf-py's own `gguf.quants.dequantize` (Q1_0, which gguf-py 0.19
  cannot decode: with ggml's definition, written apart from the codec).
`RowPermutation` wraps a conversion without touching values, reordering whole rows inside
fixed groups (undoing the converter's per-head q/k permutation). Asked for one part of a
re-layout (`part_conversion`, formats/parts.py), it cuts it losslessly: `RelayoutPart`, one of
MatMulNBits' inputs (B or scales) out of Q8_0 / Q4_0 blocks, or a part of an exact code layout
(relayout/exact_parts.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.dense import DenseStorage, Verbatim, cast_array
from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import (
    BLOCK_SIZE,
    RELAYOUT_TYPES,
    MatMulNBitsBlocks,
    to_matmulnbits,
)
from mobius_lite.formats.ggml.relayout.exact_parts import ExactRelayoutPart, MinTermRelayoutPart
from mobius_lite.formats.ggml.relayout.qmoe_min_term import MinTermOperand
from mobius_lite.formats.ggml.types import GGMLType
from mobius_lite.formats.ggml.weight import GGMLWeight
from mobius_lite.formats.parts import CodeLayout, PartOf
from mobius_lite.formats.storage import Bytes, Conversion, Storage

UINT8 = np.dtype(np.uint8)
RELAYOUT_PARTS = ("b", "scales")


def _blocks(raw: Bytes, block_bytes: int) -> np.ndarray:
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size % block_bytes:
        raise ValueError(f"{data.size} bytes are not whole {block_bytes}-byte blocks")
    return data.reshape(-1, block_bytes)


def _row_elements(ggml: GGMLType, stored_shape: tuple[int, ...]) -> tuple[int, ...]:
    """uint8 [..., row_bytes] -> the logical element shape [..., row_elements]."""
    row_bytes = stored_shape[-1]
    if row_bytes % ggml.block_bytes:
        raise ValueError(f"a {ggml.name} row of {row_bytes} bytes is not whole blocks")
    return (*stored_shape[:-1], row_bytes // ggml.block_bytes * ggml.block_elements)


@cache
def _gguf_type(type_id: int) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(type_id)


class _BlockwiseConversion:
    """A conversion that works block by block on a ggml type's blocks (never verbatim)."""

    type: GGMLType

    @property
    def unit_bytes(self) -> int:
        return self.type.block_bytes

    @property
    def verbatim(self) -> bool:
        return False


def _q1_0_by_definition(blocks: np.ndarray) -> np.ndarray:
    """Q1_0 blocks [n, 18] -> float32 [n, 128] as ggml's dequantize_row_q1_0 states it (d at
    byte 0, element j = bit j % 8 of byte 2 + j // 8, set: +d, clear: -d); written apart from
    the codec (q1_0.py) so that verify stays an independent recomputation."""
    d = np.ascontiguousarray(blocks[:, :2]).view("<f2").astype(np.float32)  # [n, 1]
    bits = np.unpackbits(blocks[:, 2:], axis=1, bitorder="little").astype(bool)
    return np.where(bits, d, -d)


@dataclass(frozen=True)
class Dequantize(_BlockwiseConversion):
    """Packed blocks -> dense float values (the numpy reference decode), block by block."""

    type: GGMLType
    target: np.dtype
    name: str = "dequantize"

    @property
    def part(self) -> str | None:
        return None

    def convert(self, raw: Bytes) -> Bytes:
        values = self.type.codec.dequantize(_blocks(raw, self.type.block_bytes))
        flat = np.ascontiguousarray(cast_array(values, self.target)).reshape(-1)
        return memoryview(flat.view(np.uint8))  # 1-D: len() is the byte count

    def recompute(self, raw: Bytes) -> bytes:
        # gguf-py's own dequantize: written independently of this library's codecs.
        from gguf.quants import dequantize

        blocks = np.array(_blocks(raw, self.type.block_bytes))
        if self.type.name == "Q1_0":  # gguf-py 0.19 has no Q1_0 decode
            values = _q1_0_by_definition(blocks)
        else:
            values = np.asarray(dequantize(blocks, _gguf_type(self.type.type_id)), np.float32)
        with np.errstate(over="ignore"):
            return np.array(values.reshape(-1), dtype=self.target).tobytes()

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return _row_elements(self.type, stored)


@dataclass(frozen=True)
class RelayoutPart(_BlockwiseConversion):
    """One MatMulNBits input cut losslessly out of Q8_0 / Q4_0 blocks (relayout/
    blocks_matmulnbits.py): "b" (uint8 [N, k_blocks, blob]) or "scales" (ggml's fp16 scale
    bits, [N, k_blocks])."""

    type: GGMLType
    part: str
    name: str = "relayout"

    def __post_init__(self) -> None:
        if self.type.name not in RELAYOUT_TYPES or self.part not in RELAYOUT_PARTS:
            raise RouteError(f"no MatMulNBits part {self.part!r} for ggml {self.type.name}")

    def convert(self, raw: Bytes) -> Bytes:
        # each block is a one-block row of K = 32: the re-layout is per block
        weights = to_matmulnbits(self.type.name, _blocks(raw, self.type.block_bytes), BLOCK_SIZE)
        array = weights.b if self.part == "b" else weights.scales
        return memoryview(np.ascontiguousarray(array).view(np.uint8).reshape(-1))

    def recompute(self, raw: Bytes) -> bytes:
        """From the block definitions directly: Q8_0 = fp16 d | 32 x int8; Q4_0 = fp16 d |
        16 bytes whose low nibbles are elements 0..15 and high nibbles 16..31."""
        blocks = np.array(_blocks(raw, self.type.block_bytes))
        if self.part == "scales":
            return blocks[:, :2].tobytes()
        if self.type.name == "Q8_0":
            return (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8).tobytes()
        qs = blocks[:, 2:].astype(np.int32)
        element = np.empty((len(blocks), 32), dtype=np.int32)
        for j in range(16):
            element[:, j] = qs[:, j] % 16
            element[:, 16 + j] = qs[:, j] // 16
        # MatMulNBits 4-bit: element 2i in the low nibble of byte i, 2i + 1 in the high one
        return (element[:, 0::2] + 16 * element[:, 1::2]).astype(np.uint8).tobytes()

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        n_blocks = stored[-1] // self.type.block_bytes
        if self.part == "scales":
            return (*stored[:-1], n_blocks)
        return (*stored[:-1], n_blocks, self.type.block_bytes - 2)


@dataclass(frozen=True)
class RowPermutation:
    """Whole rows reordered inside groups of len(order) rows (destination row r of a group is
    source row order[r]), then `inner` applied: bytes inside each row move unchanged. The unit
    is one group, so any chunk of whole groups converts on its own."""

    inner: Conversion
    row_bytes: int  # source bytes of one row
    order: tuple[int, ...]

    def __post_init__(self) -> None:
        if sorted(self.order) != list(range(len(self.order))):
            raise ValueError(f"{self.order} is not a permutation")
        if self.row_bytes % self.inner.unit_bytes:
            raise ValueError(
                f"rows of {self.row_bytes} bytes are not whole {self.inner.unit_bytes}-byte units"
            )

    @property
    def name(self) -> str:
        return "row-permute" if self.inner.verbatim else f"row-permute+{self.inner.name}"

    @property
    def part(self) -> str | None:
        return self.inner.part

    @property
    def unit_bytes(self) -> int:
        return self.row_bytes * len(self.order)

    @property
    def verbatim(self) -> bool:
        return False

    def convert(self, raw: Bytes) -> Bytes:
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, len(self.order), self.row_bytes)
        moved = np.ascontiguousarray(rows[:, list(self.order)])
        return self.inner.convert(memoryview(moved.reshape(-1)))

    def recompute(self, raw: Bytes) -> bytes:
        # scatter each source row to its destination (the inverse view of convert's gather)
        data = bytes(raw)
        group, out = self.unit_bytes, bytearray(len(data))
        for start in range(0, len(data), group):
            for destination, source in enumerate(self.order):
                at = start + source * self.row_bytes
                to = start + destination * self.row_bytes
                out[to : to + self.row_bytes] = data[at : at + self.row_bytes]
        return self.inner.recompute(bytes(out))

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return self.inner.converted_shape(stored)


@dataclass(frozen=True)
class GGMLStorage:
    """A tensor of one quantized ggml type, stored as uint8 [..., row_bytes] whole blocks."""

    type: GGMLType

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def numpy_dtype(self) -> np.dtype:
        return UINT8

    def nbytes(self, shape: tuple[int, ...]) -> int:
        """Bytes of a tensor of logical element shape [..., row_elements]."""
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        return rows * self.type.row_bytes(shape[-1])

    def conversion_to(self, target: Storage) -> Conversion:
        if target == self or (isinstance(target, DenseStorage) and target.dtype == UINT8):
            return Verbatim(self.type.block_bytes)
        if isinstance(target, DenseStorage) and target.floating:
            return Dequantize(self.type, target.dtype)
        raise RouteError(f"no conversion from ggml {self.name} to {target.name} storage")

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> GGMLWeight:
        """The GGMLWeight a weight slot of this storage computes with (see weight.py)."""
        return GGMLWeight.choose(self.type, dtype, backend, tuple(shape))

    def part_conversion(self, part: PartOf, shape: tuple[int, ...], dtype: np.dtype) -> Conversion:
        """One part of a re-layout of a tensor stored as `shape` (uint8 [..., rows, row_bytes]):
        MatMulNBits' B / scales cut from Q8_0 / Q4_0 blocks, or a part of an exact code layout
        (plain, or a min-term QMoE operand)."""
        layout = part.layout
        if isinstance(layout, MatMulNBitsBlocks):
            return RelayoutPart(self.type, part.part)
        if isinstance(layout, CodeLayout):
            return ExactRelayoutPart(self.type, part.part, shape[-1], layout.operand)
        if isinstance(layout, MinTermOperand):
            return MinTermRelayoutPart(self.type, part.part, shape[-1], layout, shape[-2])
        raise RouteError(f"ggml {self.name} has no re-layout {layout.tag!r}")
