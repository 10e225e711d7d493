"""The storage of a dense source tensor that the export quantizes (`--quantize`).

Its bytes are the checkpoint's (so the manifest's source sha256 is the checkpoint tensor's).
A `QuantizedStorage` (q8_0 / q4_0) becomes its recipe's ggml block type: `conversion_to`
uint8 quantizes (the writer streams it block by block; to a float type: the values the blocks
stand for), and `weight_format` is that ggml type's, so the graph computes with it exactly as
with a GGUF tensor of the same type and bytes. int4 / int8 take `NBitsStorage` (nbits.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.dense import DenseStorage
from mobius_lite.formats.ggml.storage import Dequantize, GGMLStorage
from mobius_lite.formats.parts import PartOf
from mobius_lite.formats.quantize.conversion import QuantizeBlocks, ThenPart
from mobius_lite.formats.quantize.nbits import NBitsStorage
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.formats.storage import Conversion, Storage
from mobius_lite.formats.weight import WeightFormat

UINT8 = np.dtype(np.uint8)


@dataclass(frozen=True)
class QuantizedStorage:
    """A dense float tensor (`source`) exported as `recipe`'s ggml blocks."""

    source: DenseStorage
    recipe: Recipe

    @property
    def name(self) -> str:
        """The stored bytes' own type (the checkpoint's); the recipe is recorded beside it."""
        return self.source.name

    @property
    def numpy_dtype(self) -> np.dtype:
        return self.source.dtype

    @property
    def blocks(self) -> GGMLStorage:
        """The ggml storage the written tensor has."""
        return GGMLStorage(self.recipe.ggml)

    def nbytes(self, shape: tuple[int, ...]) -> int:
        return self.source.nbytes(shape)

    def quantize(self) -> QuantizeBlocks:
        return QuantizeBlocks(self.source.dtype, self.recipe.ggml)

    def conversion_to(self, target: Storage) -> Conversion:
        if target == self.blocks or (isinstance(target, DenseStorage) and target.dtype == UINT8):
            return self.quantize()
        if isinstance(target, DenseStorage) and target.floating:
            # the values its blocks stand for (a re-layout part replaces this conversion)
            return ThenPart(self.quantize(), Dequantize(self.recipe.ggml, target.dtype))
        raise RouteError(
            f"a {self.source.name} tensor quantized to {self.recipe.type.value} is written as "
            f"its blocks, not as {target.name}"
        )

    def part_conversion(self, part: PartOf, shape: tuple[int, ...], dtype: np.dtype) -> Conversion:
        """Quantize, then cut `part` out of the blocks as from a GGUF tensor of that type."""
        ggml = self.recipe.ggml
        blocks = (*shape[:-1], ggml.row_bytes(shape[-1]))
        return ThenPart(self.quantize(), self.blocks.part_conversion(part, blocks, dtype))

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> WeightFormat | None:
        return self.blocks.weight_format(dtype, backend, shape, stacked)


def quantized_storage(
    source: DenseStorage, recipe: Recipe, shape: tuple[int, ...]
) -> QuantizedStorage | NBitsStorage:
    """The storage of a dense tensor of `shape` that the export quantizes by `recipe`: ggml
    blocks for llama.cpp's types, MatMulNBits blocks for int4 / int8."""
    if recipe.type.is_ggml:
        return QuantizedStorage(source, recipe)
    return NBitsStorage(source, recipe, int(shape[-1]))


def recipe_of(storage: Storage) -> Recipe | None:
    """The recipe of a storage quantized at export, None for any other storage."""
    if isinstance(storage, (QuantizedStorage, NBitsStorage)):
        return storage.recipe
    return None
