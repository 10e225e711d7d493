"""What a quantization is asked to be: a typed recipe, recorded per tensor in the manifest."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from mobius_lite.errors import RouteError, parse_choice
from mobius_lite.formats.ggml.types import GGML_TYPES, GGMLType


class QuantType(str, enum.Enum):
    """A quantization `mobius build --quantize` writes."""

    Q8_0 = "q8_0"  # llama.cpp's Q8_0: blocks of 32, one fp16 scale, int8 codes
    Q4_0 = "q4_0"  # llama.cpp's Q4_0: blocks of 32, one fp16 scale, 4-bit codes offset by 8
    INT4 = "int4"  # onnxruntime-genai's builder: MatMulNBits 4-bit blocks (nbits.py)
    INT8 = "int8"  # the same with 8-bit codes

    @property
    def is_ggml(self) -> bool:
        """True for llama.cpp's types (stored as ggml blocks), False for MatMulNBits blocks."""
        return self in (QuantType.Q8_0, QuantType.Q4_0)

    @property
    def bits(self) -> int:
        return 8 if self in (QuantType.Q8_0, QuantType.INT8) else 4

    @property
    def ggml(self) -> GGMLType:
        """The ggml block type the quantized tensor is stored as (llama.cpp's types only)."""
        if not self.is_ggml:
            raise RouteError(f"{self.value} is not a ggml block type")
        return GGML_TYPES[self.value.upper()]

    @classmethod
    def parse(cls, value: QuantType | str) -> QuantType:
        return parse_choice(cls, value, "quantization")


BLOCK_SIZES = (16, 32, 64, 128, 256)  # MatMulNBits block sizes the builder offers


@dataclass(frozen=True)
class Recipe:
    """One tensor's quantization: its type, block length and symmetry (ggml's Q8_0 / Q4_0 are
    symmetric blocks of 32 by definition; int4 / int8 take a block of 16 to 256 elements and
    are symmetric unless asked otherwise, with uint8 zero points then)."""

    type: QuantType
    block: int = 32
    symmetric: bool = True

    def __post_init__(self) -> None:
        if not self.type.is_ggml:
            if self.block not in BLOCK_SIZES:
                raise RouteError(
                    f"{self.type.value} block size {self.block} is not one of "
                    f"{', '.join(map(str, BLOCK_SIZES))}"
                )
            return
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
    """What `--quantize` / `--quantize-output` ask of a build: the type of every tensor
    llama.cpp quantizes, and optionally another for the output projection (lm_head), as
    llama-quantize's --pure and --output-tensor-type do. An output-only plan (`weights`
    None: `--quantize-output` alone) quantizes lm_head only and keeps every other tensor as
    the checkpoint stores it (a ModelOpt checkpoint's packed weights, bytes unchanged)."""

    weights: Recipe | None
    output: Recipe | None = None  # None: lm_head takes `weights`

    def __post_init__(self) -> None:
        if self.weights is None and self.output is None:
            raise RouteError("a quantization plan quantizes the weights, lm_head or both")

    @classmethod
    def of(
        cls,
        weights: QuantType | str | None,
        output: QuantType | str | None = None,
        block: int | None = None,
        symmetric: bool = True,
    ) -> QuantizePlan:
        """The plan of `[--quantize weights] [--quantize-output output]` (at least one);
        `block` and `symmetric` apply to int4 / int8 (llama.cpp's types have their own)."""
        main = None if weights is None else _recipe(QuantType.parse(weights), block, symmetric)
        head = None if output is None else _recipe(QuantType.parse(output), block, symmetric)
        if main is not None and head is not None and head.type.is_ggml != main.type.is_ggml:
            raise RouteError(
                f"lm_head as {head.type.value} with weights as {main.type.value}: choose an "
                "output type of the same family (q8_0 / q4_0, or int8 / int4)"
            )
        return cls(main, head)

    @property
    def output_only(self) -> bool:
        """True when only lm_head is quantized (every other tensor kept as stored)."""
        return self.weights is None

    @property
    def output_recipe(self) -> Recipe:
        recipe = self.output or self.weights
        assert recipe is not None  # __post_init__: one of them is set
        return recipe

    @property
    def matmulnbits(self) -> bool:
        """True when a recipe of the plan is int4 / int8 (MatMulNBits blocks, whose scales
        are f32 or f16) rather than llama.cpp's ggml blocks."""
        return not self.output_recipe.type.is_ggml

    def recipe_of(self, output: bool) -> Recipe | None:
        """The recipe of lm_head (`output`) or of any other tensor llama.cpp quantizes; None
        for the latter under an output-only plan."""
        return self.output_recipe if output else self.weights

    def record(self) -> dict[str, Any]:
        """The manifest's record: `weights` null for an output-only plan."""
        weights = None if self.weights is None else self.weights.record()
        return {"weights": weights, "output": self.output_recipe.record()}


def _recipe(qtype: QuantType, block: int | None, symmetric: bool) -> Recipe:
    if qtype.is_ggml:
        if block not in (None, 32) or not symmetric:
            raise RouteError(
                f"{qtype.value} is llama.cpp's symmetric 32-element block type; the block size "
                "and asymmetry options apply to int4 / int8"
            )
        return Recipe(qtype)
    return Recipe(qtype, 32 if block is None else block, symmetric)
