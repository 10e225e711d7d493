"""Name maps: where a source keeps the data of each graph parameter.

A model supplies one NameMap per source kind (models/nemotron_h_names.py for safetensors,
models/nemotron_h_gguf.py for GGUF); the generic binding (weights/binding.py) follows it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mobius_lite.formats.storage import Conversion
from mobius_lite.sources.base import TensorInfo


@dataclass(frozen=True)
class SourceRef:
    """Where one parameter's data may be: one tensor, or slices stacked along a new leading
    axis (with `concat`: concatenated along the existing one), in order. Optionally stored in
    another row-major shape (`reshape`: same elements, bytes unchanged) or in another order
    that a lossless re-layout undoes (`layout` wraps the storage's conversion, e.g. a row
    permutation)."""

    names: tuple[str, ...]
    reshape: bool = False
    concat: bool = False  # several names: slices concatenated along the existing leading axis
    layout: Callable[[Conversion, TensorInfo], Conversion] | None = None


Candidate = tuple[str, ...] | SourceRef


def as_ref(candidate: Candidate) -> SourceRef:
    return candidate if isinstance(candidate, SourceRef) else SourceRef(tuple(candidate))


class NameMap(Protocol):
    """Where a source may keep the data of one graph parameter."""

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        """Candidates, tried in order: a tuple of names (one: the tensor itself; several:
        slices stacked along a new leading axis) or a SourceRef."""
        ...
