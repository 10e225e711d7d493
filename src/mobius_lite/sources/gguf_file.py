"""A lazy index over a GGUF file or a split set (`name-00001-of-0000N.gguf`).

Built on gguf-py's GGUFReader, which memory-maps the file: headers are parsed up front, so
names, ggml types, shapes and byte ranges are known before any tensor data is touched. Each
tensor is validated (known ggml type, whole blocks per row, inside the file) before mapping.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader

from mobius_lite.errors import CheckpointError
from mobius_lite.formats.ggml.storage import GGMLStorage
from mobius_lite.formats.ggml.types import GGML_TYPES, GGML_TYPES_BY_ID, GGMLType
from mobius_lite.sources.base import TensorInfo

GGUF = "gguf"  # the source kind
GGUF_SUFFIX = ".gguf"
GGUF_MAGIC = b"GGUF"
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"

# Stored element dtype of the unquantized ggml types; every other type is read as bytes.
FLOAT_DTYPES: dict[str, np.dtype] = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}


def _type_label(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"unknown type id {type_id}"


def is_gguf(model: str | Path) -> bool:
    """Whether the user named a GGUF file (by its suffix)."""
    return str(model).lower().endswith(GGUF_SUFFIX)


class _CheckedReader(GGUFReader):
    """GGUFReader that checks each tensor's type and byte span before it maps the data view."""

    def __init__(self, path: Path) -> None:
        self._checked_path = path
        super().__init__(path, mode="r")

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_type, rel_offset = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            type_id = int(raw_type[0])
            ggml = GGML_TYPES_BY_ID.get(type_id)
            if ggml is None:
                raise CheckpointError(
                    f"{self._checked_path}: tensor {name} has ggml type {_type_label(type_id)}, "
                    f"which this library cannot read; supported: {', '.join(GGML_TYPES)}"
                )
            ne = [int(d) for d in dims]
            if not ne or ne[0] % ggml.block_elements:
                raise CheckpointError(
                    f"{self._checked_path}: tensor {name} ({ggml.name}) has rows of {ne[:1]} "
                    f"elements, not whole {ggml.block_elements}-element blocks; corrupt file"
                )
            nbytes = ggml.row_bytes(ne[0]) * int(np.prod(ne[1:], dtype=np.int64))
            end = start_offs + int(rel_offset[0]) + nbytes
            if end > size:
                raise CheckpointError(
                    f"{self._checked_path}: truncated GGUF file: tensor {name} ends at byte {end} "
                    f"but the file has {size} bytes; re-download it"
                )
        super()._build_tensors(start_offs, fields)


@dataclass(frozen=True)
class _Entry:
    info: TensorInfo
    ggml: GGMLType
    ne: tuple[int, ...]  # ggml order: ne[0] is the row (fastest axis)
    path: Path
    offset: int  # absolute byte offset of the data in the file
    reader: GGUFReader
    index: int  # position in reader.tensors


def _open_part(path: Path) -> GGUFReader:
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise CheckpointError(
            f"{path}: not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})"
        )
    try:
        reader = _CheckedReader(path)
    except CheckpointError:
        raise
    except (ValueError, IndexError, KeyError, UnicodeDecodeError) as err:
        raise CheckpointError(
            f"{path}: truncated or corrupt GGUF header ({err}); re-download it"
        ) from None
    if reader.byte_order != "I":
        raise CheckpointError(f"{path}: big-endian GGUF files are not supported")
    return reader


def split_parts(path: Path) -> list[Path]:
    """All files of the split set `path` belongs to (or [path] for a single file)."""
    match = SPLIT_NAME.match(path.name)
    if match is None:
        return [path]
    count = int(match["count"])
    parts = [
        path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)
    ]
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise CheckpointError(
            f"GGUF split set {match['stem']} has {count} parts but these are missing: "
            f"{', '.join(missing)}"
        )
    return parts


def _field_value(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


class GGUFCheckpoint:
    """Tensors of a GGUF file or split set, indexed lazily by GGUF name (TensorSource).

    `info` describes the stored bytes: quantized types are uint8 [..., row_bytes] with
    GGMLStorage (their ggml type); F32 / F16 / BF16 keep their float dtype (dense storage).
    `logical_shape` is the element shape in numpy order.
    """

    kind = GGUF

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        self.files = split_parts(path)
        self._readers = [_open_part(p) for p in self.files]
        self._check_split_keys()
        self._entries: dict[str, _Entry] = {}
        for file, reader in zip(self.files, self._readers, strict=True):
            for index, tensor in enumerate(reader.tensors):
                if tensor.name in self._entries:
                    raise CheckpointError(
                        f"tensor {tensor.name} appears in both "
                        f"{self._entries[tensor.name].path} and {file}"
                    )
                self._entries[tensor.name] = self._entry(file, reader, index)
        declared = _field_value(self._readers[0], SPLIT_TENSORS)
        if declared is not None and int(declared) != len(self._entries):
            raise CheckpointError(
                f"{self.files[0]}: the split set declares {declared} tensors but its "
                f"{len(self.files)} parts hold {len(self._entries)}"
            )

    def _check_split_keys(self) -> None:
        count = len(self.files)
        for number, (file, reader) in enumerate(zip(self.files, self._readers, strict=True)):
            no, declared = _field_value(reader, SPLIT_NO), _field_value(reader, SPLIT_COUNT)
            if declared is None:
                if count > 1:
                    raise CheckpointError(f"{file}: named as a split part but has no {SPLIT_COUNT}")
                continue
            if int(declared) != count or int(no) != number:
                raise CheckpointError(
                    f"{file}: {SPLIT_NO}={no}, {SPLIT_COUNT}={declared}, but it was found as "
                    f"part {number + 1} of {count}; the split set is inconsistent"
                )

    @staticmethod
    def _entry(file: Path, reader: GGUFReader, index: int) -> _Entry:
        tensor = reader.tensors[index]
        ggml = GGML_TYPES_BY_ID[int(tensor.tensor_type)]
        ne = tuple(int(d) for d in tensor.shape)
        logical = tuple(reversed(ne))
        storage = None  # dense: F32 / F16 / BF16 keep their element type
        if ggml.name in FLOAT_DTYPES:
            dtype, shape = FLOAT_DTYPES[ggml.name], logical
        else:
            dtype, shape = np.dtype(np.uint8), (*logical[:-1], ggml.row_bytes(ne[0]))
            storage = GGMLStorage(ggml)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        info = TensorInfo(
            name=tensor.name,
            dtype=dtype,
            shape=shape,
            nbytes=nbytes,
            location=str(file),
            storage=storage,  # type: ignore[arg-type]
        )
        return _Entry(info, ggml, ne, file, int(tensor.data_offset), reader, index)

    # ------------------------------------------------------------------ TensorSource
    def names(self) -> list[str]:
        return list(self._entries)

    def _get(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(f"tensor {name} is not in {self.files[0]}") from None

    def info(self, name: str) -> TensorInfo:
        return self._get(name).info

    def read(self, name: str) -> np.ndarray:
        """A read-only memory-mapped view of the stored bytes, shaped as `info(name)`."""
        entry = self._get(name)
        data = entry.reader.tensors[entry.index].data
        return data.view(np.uint8).reshape(-1).view(entry.info.dtype).reshape(entry.info.shape)

    def byte_range(self, name: str) -> tuple[Path, int, int]:
        """(file, absolute offset, length) of a tensor's stored bytes."""
        entry = self._get(name)
        return entry.path, entry.offset, entry.info.nbytes

    # ------------------------------------------------------------------ GGUF views
    def ggml_type(self, name: str) -> GGMLType:
        return self._get(name).ggml

    def logical_shape(self, name: str) -> tuple[int, ...]:
        """Element shape in numpy order: ne=[K, N] is [N, K]."""
        return tuple(reversed(self._get(name).ne))

    @cached_property
    def metadata(self) -> dict[str, Any]:
        """The first part's key/values as plain Python values (arrays as lists)."""
        reader = self._readers[0]
        return {
            key: field.contents()
            for key, field in reader.fields.items()
            if not key.startswith("GGUF.")
        }

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return None if value is None else str(value)
