"""Dense storage: one element type per tensor (float32, float16, bfloat16, ...).

Conversions between dense types are the identity or an element-type cast that rounds to the
nearest even value, as torch's `.to()` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.parts import PartOf, no_relayout
from mobius_lite.formats.storage import Bytes, Conversion, Storage
from mobius_lite.formats.weight import WeightFormat


class SameShape:
    """A conversion of whole elements or blocks in place: one initializer, shape kept."""

    @property
    def part(self) -> str | None:
        return None

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return stored


@dataclass(frozen=True)
class Verbatim(SameShape):
    """Bytes copied unchanged."""

    unit_bytes: int
    name: str = "identity"

    @property
    def verbatim(self) -> bool:
        return True

    def convert(self, raw: Bytes) -> Bytes:
        return raw

    def recompute(self, raw: Bytes) -> bytes:
        return bytes(raw)


@dataclass(frozen=True)
class Cast(SameShape):
    """An element-type conversion with round-to-nearest-even."""

    source: np.dtype
    target: np.dtype
    name: str = "cast"

    @property
    def unit_bytes(self) -> int:
        return self.source.itemsize

    @property
    def verbatim(self) -> bool:
        return False

    def convert(self, raw: Bytes) -> Bytes:
        array = np.frombuffer(raw, dtype=self.source)
        # Viewed as bytes: the buffer protocol does not carry ml_dtypes types such as bfloat16.
        return memoryview(cast_array(array, self.target).view(np.uint8))

    def recompute(self, raw: Bytes) -> bytes:
        # A fresh numpy conversion of a fresh copy, sharing nothing with convert().
        with np.errstate(over="ignore"):
            values = np.array(np.frombuffer(bytes(raw), dtype=self.source), dtype=self.target)
        return values.tobytes()


def cast_array(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Element-type conversion with round-to-nearest-even (as torch's .to())."""
    if array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):  # overflow to inf is counted and reported by the writer
        return np.asarray(array).astype(dtype)


@dataclass(frozen=True)
class DenseStorage:
    """A tensor of one numpy element type, stored contiguously, little-endian."""

    dtype: np.dtype

    @property
    def name(self) -> str:
        return self.dtype.name

    @property
    def numpy_dtype(self) -> np.dtype:
        return self.dtype

    def nbytes(self, shape: tuple[int, ...]) -> int:
        return int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> WeightFormat | None:
        """None: a dense tensor feeds a dense weight (cast to the activation precision)."""
        return None

    def conversion_to(self, target: Storage) -> Conversion:
        if not isinstance(target, DenseStorage):
            raise RouteError(f"no conversion from dense {self.name} to {target.name} storage")
        if target.dtype == self.dtype:
            return Verbatim(self.dtype.itemsize)
        return Cast(self.dtype, target.dtype)

    def part_conversion(self, part: PartOf, shape: tuple[int, ...], dtype: np.dtype) -> Conversion:
        raise no_relayout(f"dense {self.name}", part)

    @property
    def floating(self) -> bool:
        """True for float element types (whose values can be non-finite)."""
        # ml_dtypes types (bfloat16, float8_*) have numpy kind "V"; their names say it.
        return self.dtype.kind == "f" or self.dtype.name.startswith(("bfloat", "float"))


def dense(dtype: np.dtype | str) -> DenseStorage:
    return DenseStorage(np.dtype(dtype))
