"""One part of an exact block-wise layout (exact_layout.py) as a storage Conversion.

A ggml tensor re-laid for MatMulNBits or QMoE feeds several initializers, one per part
("b", "scales", "zero_points", "mins"), each a PartParameter of a `CodeLayout` (formats/
parts.py) for its operand: MatMulNBits' B [N, K / block, blob], or QMoE's B [E, N, K * bits /
8] (fc1 gives every row twice, the SwiGLU form of ReLU^2). `verify`
recomputes a part by decoding the whole layout with the kernels' definition
(code - zero_point) * scale [- min] and requiring gguf-py's `dequantize` bit for bit.
MatMulNBits layouts ("nbx") center a min term into per-block zero points (exact_layout.py,
center_mins: Q4_K's int8-activation error); the QMoE kinds keep their uncentered form.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_lite.errors import RouteError
from mobius_lite.formats.ggml.relayout.exact_codes import CODE_FORMS, code_form
from mobius_lite.formats.ggml.relayout.exact_layout import (
    NBitsLayout,
    layout_parts,
    to_nbits_layout,
)
from mobius_lite.formats.ggml.relayout.qmoe_min_term import (
    MinTermOperand,
    logical_weight,
    min_term_layout,
    operand_shapes,
)
from mobius_lite.formats.ggml.types import GGMLType
from mobius_lite.formats.parts import CodeLayout, Operand, part_parameters
from mobius_lite.formats.storage import Bytes

PARTS = ("b", "scales", "zero_points", "mins")


def exact_layout_parameters(
    type_name: str, operand: Operand, shape: tuple[int, ...]
) -> dict[str, nn.Parameter]:
    """The parameters of the exact code layout of `type_name` for `operand` (a logical weight
    [..., N, K]), each carrying its part (formats/parts.py); fc1 repeats every row."""
    form = code_form(type_name)
    assert form is not None
    *lead, n, k = shape
    n, k_blocks = n * operand.repeat, k // form.block_size
    blob = form.block_size * form.bits // 8
    b_shape = (
        [*lead, n, k_blocks, blob] if operand is Operand.MATMUL else [*lead, n, k_blocks * blob]
    )
    shapes = {
        "b": (b_shape, ir.DataType.UINT8),
        "scales": ([*lead, n, k_blocks], ir.DataType.FLOAT),
        "zero_points": ([*lead, n, (k_blocks * form.bits + 7) // 8], ir.DataType.UINT8),
        "mins": ([*lead, n, k // 32], ir.DataType.FLOAT),
    }
    layout = CodeLayout(operand)
    return part_parameters({layout.part(p): shapes[p] for p in layout_parts(type_name)})


def exact_layout_values(
    type_name: str, operand: Operand, params: dict[str, ir.Value]
) -> dict[str, ir.Value]:
    """The exact layout's parameters among a slot's `params`, by part."""
    layout = CodeLayout(operand)
    return {p: params[layout.part(p).suffix] for p in layout_parts(type_name)}


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
    part: str
    row_bytes: int

    @property
    def name(self) -> str:
        return f"relayout-{self.tag}"

    @property
    def tag(self) -> str:
        raise NotImplementedError

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
    """Part `part` of the exact code layout of a ggml tensor for `operand` (module doc);
    `row_bytes` is one source row (the unit when rows repeat)."""

    operand: Operand

    @property
    def tag(self) -> str:
        return self.operand.value

    def __post_init__(self) -> None:
        if self.type.name not in CODE_FORMS:
            raise RouteError(f"no exact {self.tag} layout for ggml {self.type.name}")
        if self.part not in layout_parts(self.type.name):
            raise RouteError(f"ggml {self.type.name}'s exact layout has no part {self.part!r}")

    @property
    def unit_bytes(self) -> int:
        return self.row_bytes

    @property
    def repeat(self) -> int:
        return self.operand.repeat

    def _layout(self, raw: Bytes) -> tuple[np.ndarray, NBitsLayout]:
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.row_bytes)
        center = self.operand is Operand.MATMUL
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
            if self.operand is Operand.MATMUL:
                return (*lead, n, k_blocks, blob)
            return (*lead, n, k_blocks * blob)
        if self.part == "zero_points":
            return (*lead, n, (k_blocks * form.bits + 7) // 8)
        if self.part == "mins":
            return (*lead, n, k // 32)
        return (*lead, n, k_blocks)


@dataclass(frozen=True)
class MinTermRelayoutPart(_LayoutPart):
    """Part `part` of a min-term QMoE operand (qmoe_min_term.py: `layout` names the slot and the
    layer's plan) of a ggml expert tensor; the unit is one expert (`rows` rows), since the
    operand tiles and pads whole experts. `verify` folds the decoded operand back to the
    expert weight (logical_weight) and requires gguf-py's values exactly (value for value: a
    zero may carry the other sign, which no sum the kernel computes can see)."""

    layout: MinTermOperand
    rows: int

    def __post_init__(self) -> None:
        if self.type.name not in CODE_FORMS:
            raise RouteError(f"no min-term QMoE layout {self.tag} for ggml {self.type.name}")

    @property
    def tag(self) -> str:
        return self.layout.tag

    @property
    def unit_bytes(self) -> int:
        return self.rows * self.row_bytes

    def _layout(self, raw: Bytes) -> tuple[np.ndarray, NBitsLayout]:
        slot, plan = self.layout.operand.value, self.layout.plan
        experts = np.frombuffer(raw, dtype=np.uint8).reshape(-1, self.rows, self.row_bytes)
        return experts, min_term_layout(self.type.name, slot, experts, plan)

    def recompute(self, raw: Bytes) -> bytes:
        """The part, once the operand is shown to stand for gguf-py's dequantized experts bit
        for bit; an operand that does not is a mismatch."""
        from gguf.quants import dequantize

        slot, plan = self.layout.operand.value, self.layout.plan
        experts, layout = self._layout(raw)
        expected = np.asarray(dequantize(np.array(experts), _gguf_type(self.type.type_id)))
        expected = expected.astype(np.float32)
        weight = logical_weight(layout_decode(layout), slot, plan, self.rows, expected.shape[-1])
        if weight is None or not np.array_equal(weight, expected, equal_nan=True):
            return b"layout does not decode to gguf-py's values"
        return self._bytes(layout)

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        slot, plan = self.layout.operand.value, self.layout.plan
        *lead, n, row_bytes = stored
        k = row_bytes // self.type.block_bytes * self.type.block_elements
        return operand_shapes(self.type.name, slot, plan, (*lead, n, k))[self.part]
