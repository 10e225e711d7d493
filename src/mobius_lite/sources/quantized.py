"""A tensor source whose chosen tensors the export quantizes (`--quantize`).

It wraps another source and changes nothing but the storage its `info` reports for the
tensors given a recipe (formats/quantize/storage.py); names, shapes, bytes and byte ranges
are the wrapped source's, so the manifest's source sha256 is the checkpoint's own and the
writer streams the checkpoint's bytes through the quantizing conversion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np

from mobius_lite.errors import RouteError
from mobius_lite.formats.dense import DenseStorage
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.formats.quantize.storage import quantized_storage
from mobius_lite.sources.base import TensorInfo, TensorSource

FLOAT_SOURCES = ("float32", "float16", "bfloat16")


class QuantizedSource:
    """`inner` with the tensors of `recipes` (name -> Recipe) stored as QuantizedStorage."""

    def __init__(self, inner: TensorSource, recipes: Mapping[str, Recipe]) -> None:
        self.inner = inner
        self.kind = inner.kind
        self.recipes = dict(recipes)
        unknown = sorted(set(self.recipes) - set(inner.names()))
        if unknown:
            raise RouteError(f"no tensors named {', '.join(unknown[:10])} to quantize")
        self._infos: dict[str, TensorInfo] = {}
        for name, recipe in self.recipes.items():
            info = inner.info(name)
            storage = info.storage
            if not isinstance(storage, DenseStorage) or storage.name not in FLOAT_SOURCES:
                raise RouteError(
                    f"{name} is stored as {storage.name}; only {', '.join(FLOAT_SOURCES)} "
                    "tensors can be quantized at export"
                )
            self._infos[name] = replace(
                info, storage=quantized_storage(storage, recipe, tuple(info.shape))
            )

    def names(self) -> list[str]:
        return self.inner.names()

    def info(self, name: str) -> TensorInfo:
        return self._infos.get(name) or self.inner.info(name)

    def read(self, name: str) -> np.ndarray:
        return self.inner.read(name)

    def byte_range(self, name: str) -> tuple[Path, int, int] | None:
        return self.inner.byte_range(name)
