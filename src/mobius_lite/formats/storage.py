"""What a stored tensor is, and how its bytes become an initializer's bytes.

A `Storage` describes one tensor's bytes (a dense element type today; GGUF block types and
FP4 / FP8 with their scales next). Asked for a target storage, it returns the `Conversion`
between the two: the writer converts with it chunk by chunk, `verify` recomputes with it
independently, the manifest records its name, and `materialize` applies it to whole arrays.
A parameter a weight format cuts out of a slot's tensor (formats/parts.py) asks the storage for
that part's conversion (`part_conversion`). Nothing outside a format decides how bytes change.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.formats.parts import PartOf
from mobius_lite.formats.weight import WeightFormat

Bytes = bytes | memoryview


class Conversion(Protocol):
    """How source bytes become written bytes, applicable to any whole number of units."""

    name: str  # recorded in the manifest: "identity", "cast", ...
    unit_bytes: int  # source bytes of one indivisible unit (an element, a block)

    @property
    def verbatim(self) -> bool:
        """True when the written bytes are the source bytes."""
        ...

    @property
    def part(self) -> str | None:
        """Which initializer of a multi-part re-layout it writes (one source tensor feeding
        several initializers), or None."""
        ...

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of a tensor stored as `stored` once converted (packed rows decoded to
        elements, a re-layout part's own shape); `stored` when the conversion keeps it."""
        ...

    def convert(self, raw: Bytes) -> Bytes:
        """The written bytes for `raw` (a whole number of units): the export path."""
        ...

    def recompute(self, raw: Bytes) -> bytes:
        """The same result by an independent computation: what `verify` compares against."""
        ...


class Storage(Protocol):
    """The layout of one stored tensor's bytes."""

    name: str

    def nbytes(self, shape: tuple[int, ...]) -> int: ...

    def conversion_to(self, target: Storage) -> Conversion:
        """The conversion into `target`; RouteError when there is none."""
        ...

    def part_conversion(self, part: PartOf, shape: tuple[int, ...], dtype: np.dtype) -> Conversion:
        """The conversion of a tensor stored as `shape` into `part` of one of its re-layouts
        (formats/parts.py; the part's parameter of element type `dtype`); RouteError when this
        storage has no such re-layout."""
        ...

    @property
    def numpy_dtype(self) -> np.dtype:
        """The element type its bytes are viewed as (uint8 for packed blocks)."""
        ...

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> WeightFormat | None:
        """The format a weight slot of logical `shape` (stacked: experts along a new leading
        axis) fed by this tensor computes with in activation `dtype` on `backend`; None for a
        plain dense weight."""
        ...
