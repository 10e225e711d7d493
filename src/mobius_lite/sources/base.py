"""The lazy tensor-source protocol: names, dtypes and shapes up front, bytes only on demand."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import ml_dtypes
import numpy as np

from mobius_lite.formats.dense import dense
from mobius_lite.formats.storage import Storage

# safetensors dtype codes -> numpy dtypes (bf16 / fp8 through ml_dtypes).
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}


@dataclass(frozen=True)
class TensorInfo:
    """Where one source tensor lives and what it is, known without reading its data."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    nbytes: int
    location: str  # file path (or "memory") for messages and the manifest
    # How the bytes are laid out; dense `dtype` unless the source says otherwise (packed blocks).
    storage: Storage = field(default=None)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.storage is None:
            object.__setattr__(self, "storage", dense(self.dtype))


class TensorSource(Protocol):
    """A checkpoint seen as named tensors; `read` returns a (possibly memory-mapped) array.
    `kind` names its source kind (source_kinds.py: the name map and conventions it takes)."""

    kind: str

    def names(self) -> list[str]: ...

    def info(self, name: str) -> TensorInfo: ...

    def read(self, name: str) -> np.ndarray: ...

    def byte_range(self, name: str) -> tuple[Path, int, int] | None:
        """(file, absolute offset, length) of a tensor's stored bytes, so the writer can
        pread them; None for a source that is not a file (read() is sliced instead)."""
        ...
