"""One part of an exact block-wise layout (nbits_layout.py) as a storage Conversion.

A ggml tensor re-laid for MatMulNBits or QMoE feeds several initializers, one per part
("b", "scales", "zero_points", "mins"). Parameter suffixes name the kernel and the part:
"<slot>_nbx_b" (MatMulNBits: B [N, K / block, blob]), "<slot>_fc1_b" / "<slot>_fc2_b" (QMoE:
B [E, N, K * bits / 8]; fc1 gives every row twice, the SwiGLU form of ReLU^2). `verify`
recomputes a part by decoding the whole layout with the kernels' definition
(code - zero_point) * scale [- min] and requiring gguf-py's `dequantize` bit for bit.
MatMulNBits layouts ("nbx") center a min term into per-block zero points (nbits_layout.py,
center_mins: Q4_K's int8-activation error); the QMoE kinds keep their uncentered form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from mobius_lite.errors import RouteError
from mobius_lite.formats.ggml.exact_codes import CODE_FORMS
from mobius_lite.formats.ggml.nbits_layout import NBitsLayout, layout_parts, to_nbits_layout
from mobius_lite.formats.ggml.qmoe_mins import (
    logical_weight,
    min_term_layout,
    operand_shapes,
    parse_kind,
)
from mobius_lite.formats.ggml.types import GGMLType
from mobius_lite.formats.storage import Bytes

NBITS_KIND, FC1_KIND, FC2_KIND = "nbx", "fc1", "fc2"
KINDS = (NBITS_KIND, FC1_KIND, FC2_KIND)
PARTS = ("b", "scales", "zero_points", "mins")
ROW_REPEAT = {NBITS_KIND: 1, FC1_KIND: 2, FC2_KIND: 1}


def part_suffix(kind: str, part: str) -> str:
    return f"_{kind}_{part}"


# "<slot>_<kind>_<part>" -> (kind, part), for the name maps
EXACT_SUFFIXES: dict[str, tuple[str, str]] = {
    part_suffix(kind, part): (kind, part) for kind in KINDS for part in PARTS
}


# "<slot>_<min-term kind>_<part>" (qmoe_mins.py: the QMoE layouts of layers with Q4_K experts)
MIN_TERM_SUFFIX = re.compile(r"_(fc[12]q\d+b\d+c\d[sn])_(b|scales|zero_points)$")


def split_suffix(target: str) -> tuple[str, str, str] | None:
    """(slot name, kind, part) of an exact-layout parameter name, None for others."""
    for suffix, (kind, part) in EXACT_SUFFIXES.items():
        if target.endswith(suffix):
            return target.removesuffix(suffix), kind, part
    match = MIN_TERM_SUFFIX.search(target)
    if match is not None and parse_kind(match.group(1)) is not None:
        return target[: match.start()], match.group(1), match.group(2)
    return None


def exact_relayout(
    type: GGMLType, kind: str, part: str, row_bytes: int, shape: tuple[int, ...]
) -> ExactRelayoutPart | MinTermRelayoutPart:
    """The Conversion for one part of kind `kind` of a ggml tensor of logical shape `shape`."""
    if parse_kind(kind) is not None:
        return MinTermRelayoutPart(type, kind, part, row_bytes, int(shape[-2]))
    return ExactRelayoutPart(type, kind, part, row_bytes)


def layout_decode(layout: NBitsLayout) -> np.ndarray:
    """The weight [..., N, K] a layout stands for, by the kernels' definition, float32."""
    b, bits, bs = layout.b, layout.bits, layout.block_size
    codes = b if bits == 8 else np.stack([b & 0xF, b >> 4], axis=-1)
    lead = layout.scales.shape  # [..., N, k_blocks]
    codes = codes.reshape(*lead, bs).astype(np.float32)
    zp = np.float32(1 << (bits - 1))
    if layout.zero_points is not None:
        z = layout.zero_points
        z = z if bits == 8 else np.stack([z & 0xF, z >> 4], axis=-1).reshape(*lead[:-1], -1)
        zp = z[..., : lead[-1], None].astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        values = ((codes - zp) * layout.scales[..., None]).reshape(*lead[:-1], -1)
        if layout.mins is not None:
            k = values.shape[-1]
            per32 = values.reshape(*lead[:-1], k // 32, 32) - layout.mins[..., None]
            values = per32.reshape(*lead[:-1], k)
    return values


@cache
def _gguf_type(type_id: int) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(type_id)


@dataclass(frozen=True)
class _LayoutPart:
    """What both layout-part Conversions share: one part of a layout the subclass's
    `_layout` makes from the raw ggml bytes."""

    type: GGMLType
    kind: str
    part: str
    row_bytes: int

    @property
    def name(self) -> str:
        return f"relayout-{self.kind}"

    @property
    def verbatim(self) -> bool:
        return False

    def _layout(self, raw: Bytes) -> tuple[np.ndarray, NBitsLayout]:
        raise NotImplementedError

    def _bytes(self, layout: NBitsLayout) -> bytes:
        return np.ascontiguousarray(layout.arrays()[self.part]).tobytes()

    def convert(self, raw: Bytes) -> Bytes:
        return memoryview(self._bytes(self._layout(raw)[1]))


@dataclass(frozen=True)
class ExactRelayoutPart(_LayoutPart):
    """Part `part` of the `kind` layout of a ggml tensor (module doc); `row_bytes` is one
    source row (the unit when rows repeat)."""

    def __post_init__(self) -> None:
        if self.type.name not in CODE_FORMS or self.kind not in KINDS:
            raise RouteError(f"no exact {self.kind} layout for ggml {self.type.name}")
        if self.part not in layout_parts(self.type.name):
            raise RouteError(f"ggml {self.type.name}'s exact layout has no part {self.part!r}")

    @property
    def unit_bytes(self) -> int:
        return self.row_bytes

    @property
    def repeat(self) -> int:
        return ROW_REPEAT[self.kind]

    def _layout(self, raw: Bytes) -> tuple[np.ndarray, NBitsLayout]:
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.row_bytes)
        center = self.kind == NBITS_KIND
        return rows, to_nbits_layout(self.type.name, rows, repeat=self.repeat, center_mins=center)

    def recompute(self, raw: Bytes) -> bytes:
        """The part, once the whole layout is shown to decode (kernel definition) to gguf-py's
        own dequantized values bit for bit; a layout that does not is a mismatch."""
        from gguf.quants import dequantize

        rows, layout = self._layout(raw)
        expected = np.asarray(dequantize(np.array(rows), _gguf_type(self.type.type_id)))
        expected = np.repeat(expected.astype(np.float32), self.repeat, axis=0)
        decoded = layout_decode(layout).reshape(expected.shape)
        if not np.array_equal(decoded.view(np.uint32), expected.view(np.uint32)):
            return b"layout does not decode to gguf-py's values"
        return self._bytes(layout)

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        form = CODE_FORMS[self.type.name]
        *lead, n, row_bytes = stored
        k = row_bytes // self.type.block_bytes * self.type.block_elements
        n, k_blocks = n * self.repeat, k // form.block_size
        if self.part == "b":
            blob = form.block_size * form.bits // 8
            if self.kind == NBITS_KIND:
                return (*lead, n, k_blocks, blob)
            return (*lead, n, k_blocks * blob)
        if self.part == "zero_points":
            return (*lead, n, (k_blocks * form.bits + 7) // 8)
        if self.part == "mins":
            return (*lead, n, k // 32)
        return (*lead, n, k_blocks)


@dataclass(frozen=True)
class MinTermRelayoutPart(_LayoutPart):
    """Part `part` of a min-term QMoE operand (qmoe_mins.py; `kind` names the slot and the
    layer's plan) of a ggml expert tensor; the unit is one expert (`rows` rows), since the
    operand tiles and pads whole experts. `verify` folds the decoded operand back to the
    expert weight (logical_weight) and requires gguf-py's values exactly (value for value: a
    zero may carry the other sign, which no sum the kernel computes can see)."""

    rows: int

    def __post_init__(self) -> None:
        parsed = parse_kind(self.kind)
        if parsed is None or self.type.name not in CODE_FORMS:
            raise RouteError(f"no min-term QMoE layout {self.kind} for ggml {self.type.name}")

    @property
    def unit_bytes(self) -> int:
        return self.rows * self.row_bytes

    def _plan(self):
        parsed = parse_kind(self.kind)
        assert parsed is not None
        return parsed

    def _layout(self, raw: Bytes) -> tuple[np.ndarray, NBitsLayout]:
        slot, plan = self._plan()
        experts = np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.rows, self.row_bytes)
        return experts, min_term_layout(self.type.name, slot, experts, plan)

    def recompute(self, raw: Bytes) -> bytes:
        """The part, once the operand is shown to stand for gguf-py's dequantized experts bit
        for bit; an operand that does not is a mismatch."""
        from gguf.quants import dequantize

        slot, plan = self._plan()
        experts, layout = self._layout(raw)
        expected = np.asarray(dequantize(np.array(experts), _gguf_type(self.type.type_id)))
        expected = expected.astype(np.float32)
        weight = logical_weight(layout_decode(layout), slot, plan, self.rows, expected.shape[-1])
        if weight is None or not np.array_equal(weight, expected, equal_nan=True):
            return b"layout does not decode to gguf-py's values"
        return self._bytes(layout)

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        slot, plan = self._plan()
        *lead, n, row_bytes = stored
        k = row_bytes // self.type.block_bytes * self.type.block_elements
        return operand_shapes(self.type.name, slot, plan, (*lead, n, k))[self.part]
