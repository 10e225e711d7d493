"""The typed re-layout plan: which part of which lossless re-layout of its weight slot's source
tensor a parameter holds.

Some weight formats split a slot's one source tensor into several parameters (MatMulNBits' B
and scales, a QMoE operand's codes, scales and zero points). The format says so when it
creates them: each such parameter is a `PartParameter` carrying its `PartOf` (the re-layout
and the part), and binding asks the source tensor's storage for that part's Conversion
(`Storage.part_conversion`). The parameter's name is the slot's with `PartOf.suffix`
appended, a name made from the plan and never read back into one; the name map knows only
checkpoint names.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import onnx_ir as ir
from onnxscript import nn

from mobius_lite.errors import RouteError


class Relayout(Protocol):
    """A lossless re-layout of one source tensor into several parameters."""

    @property
    def tag(self) -> str:
        """The re-layout's word in its parameters' names: `<slot>_<tag>_<part>`."""
        ...


@dataclass(frozen=True)
class PartOf:
    """Part `part` ("b", "scales", "zero_points", "mins") of re-layout `layout`."""

    layout: Relayout
    part: str

    @property
    def suffix(self) -> str:
        """What the part's parameter name adds to its slot's name."""
        return f"_{self.layout.tag}_{self.part}"


class Operand(enum.Enum):
    """The kernel input a code layout is cut for: MatMulNBits' B [N, K / block, blob], or
    QMoE's fc1 (every row twice: the SwiGLU form of ReLU^2) or fc2 ([E, N, K * bits / 8])."""

    MATMUL = "nbx"
    FC1 = "fc1"
    FC2 = "fc2"

    @property
    def repeat(self) -> int:
        """How many times the layout gives each source row."""
        return 2 if self is Operand.FC1 else 1

    @classmethod
    def of_experts(cls, kind: str) -> Operand:
        """The operand of a fused-experts slot kind ("fc1" / "fc2", WeightFormat's)."""
        return {"fc1": cls.FC1, "fc2": cls.FC2}[kind]


@dataclass(frozen=True)
class CodeLayout:
    """A block-wise code layout of a weight for `operand`: the exact re-layout of ggml codes
    (formats/ggml/relayout/exact_codes.py) or int4 / int8 blocks quantized at export."""

    operand: Operand

    @property
    def tag(self) -> str:
        return self.operand.value

    def part(self, part: str) -> PartOf:
        return PartOf(self, part)


def no_relayout(what: str, part: PartOf) -> RouteError:
    """The error of a storage (`what`) that has no re-layout into `part`."""
    return RouteError(f"{what} tensors have no re-layout into {part.layout.tag} {part.part}")


class PartParameter(nn.Parameter):
    """A parameter holding one part (`part_of`) of its slot's source tensor re-laid out."""

    def __init__(self, shape: Sequence[int], dtype: ir.DataType, part_of: PartOf) -> None:
        super().__init__(shape, dtype=dtype)
        self.part_of = part_of


def part_parameters(
    parts: dict[PartOf, tuple[Sequence[int], ir.DataType]],
) -> dict[str, nn.Parameter]:
    """A weight format's parameters (by name suffix) for `parts` (part -> shape, dtype)."""
    return {p.suffix: PartParameter(list(s), d, p) for p, (s, d) in parts.items()}


def parameter_parts(model: ir.Model) -> dict[str, PartOf]:
    """The graph's parameters that hold a re-layout part, with the part (what binding asks
    their source's storage to convert)."""
    return {
        name: value.part_of
        for name, value in model.graph.initializers.items()
        if isinstance(value, PartParameter)
    }
