"""What a quantization is asked to be: a typed recipe, recorded per tensor in the manifest."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from mobius_lite.errors import RouteError
from mobius_lite.formats.ggml.types import GGML_TYPES, GGMLType


class QuantType(str, enum.Enum):
    """A quantization `mobius build --quantize` writes."""

    Q8_0 = "q8_0"  # llama.cpp's Q8_0: blocks of 32, one fp16 scale, int8 codes
    Q4_0 = "q4_0"  # llama.cpp's Q4_0: blocks of 32, one fp16 scale, 4-bit codes offset by 8

    @property
    def ggml(self) -> GGMLType:
        """The ggml block type the quantized tensor is stored as."""
        return GGML_TYPES[self.value.upper()]

    @classmethod
    def parse(cls, value: QuantType | str) -> QuantType:
        if isinstance(value, QuantType):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise RouteError(
                f"quantization {value!r} is not supported; choose one of "
                f"{', '.join(t.value for t in cls)}"
            ) from None


@dataclass(frozen=True)
class Recipe:
    """One tensor's quantization: its type, block length and symmetry (ggml's Q8_0 / Q4_0 are
    symmetric blocks of 32 by definition)."""

    type: QuantType
    block: int = 32
    symmetric: bool = True

    def __post_init__(self) -> None:
        ggml = self.type.ggml
        if self.block != ggml.block_elements or not self.symmetric:
            raise RouteError(
                f"{self.type.value} is llama.cpp's symmetric {ggml.block_elements}-element block "
                f"type; block {self.block}, symmetric={self.symmetric} is not it"
            )

    @property
    def ggml(self) -> GGMLType:
        return self.type.ggml

    def record(self) -> dict[str, Any]:
        """The manifest's record of this recipe."""
        return {"type": self.type.value, "block": self.block, "symmetric": self.symmetric}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Recipe:
        """The recipe a manifest recorded (RouteError for one this version cannot redo)."""
        return cls(QuantType.parse(record["type"]), int(record["block"]), bool(record["symmetric"]))


@dataclass(frozen=True)
class QuantizePlan:
    """What `--quantize` asks of a build: the type of every tensor llama.cpp quantizes, and
    optionally another for the output projection (lm_head), as llama-quantize's --pure and
    --output-tensor-type do."""

    weights: Recipe
    output: Recipe | None = None  # None: lm_head takes `weights`

    @classmethod
    def of(cls, weights: QuantType | str, output: QuantType | str | None = None) -> QuantizePlan:
        head = None if output is None else Recipe(QuantType.parse(output))
        return cls(Recipe(QuantType.parse(weights)), head)

    @property
    def output_recipe(self) -> Recipe:
        return self.output or self.weights

    def record(self) -> dict[str, Any]:
        return {"weights": self.weights.record(), "output": self.output_recipe.record()}
