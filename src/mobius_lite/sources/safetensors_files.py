"""A lazy index over safetensors files (one file, or an index JSON + shards).

Headers are parsed up front so that names, dtypes, shapes and byte ranges are known before
any tensor data is touched; data is memory-mapped tensor by tensor on demand.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mobius_lite.errors import CheckpointError
from mobius_lite.sources.base import SAFETENSORS_DTYPES, TensorInfo

SAFETENSORS = "safetensors"  # the source kind
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class _Entry:
    info: TensorInfo
    path: Path
    offset: int  # absolute byte offset of the data in the file


def _parse_header(path: Path) -> dict[str, _Entry]:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated safetensors file (no header length)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise CheckpointError(
                f"{path}: truncated or corrupt safetensors file (header of {header_len} bytes "
                f"in a {size}-byte file); re-download it"
            )
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path}: corrupt safetensors header; re-download it") from None
    data_start = 8 + header_len
    entries: dict[str, _Entry] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(meta.get("dtype"))
        if dtype is None:
            raise CheckpointError(
                f"{path}: tensor {name} has unsupported dtype {meta.get('dtype')}"
            )
        begin, end = meta["data_offsets"]
        shape = tuple(int(d) for d in meta["shape"])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != expected:
            raise CheckpointError(
                f"{path}: tensor {name} spans {end - begin} bytes "
                f"but {shape} {dtype} needs {expected}"
            )
        if data_start + end > size:
            raise CheckpointError(
                f"{path}: truncated safetensors file: tensor {name} ends at byte "
                f"{data_start + end} but the file has {size} bytes; re-download it"
            )
        info = TensorInfo(name=name, dtype=dtype, shape=shape, nbytes=expected, location=str(path))
        entries[name] = _Entry(info=info, path=path, offset=data_start + begin)
    return entries


class SafetensorsCheckpoint:
    """Tensors of a safetensors checkpoint directory or file, indexed lazily by name."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_file():
            files = [path]
        elif (path / INDEX_NAME).is_file():
            try:
                index = json.loads((path / INDEX_NAME).read_text())
                weight_map: dict[str, str] = index["weight_map"]
            except (json.JSONDecodeError, KeyError):
                raise CheckpointError(
                    f"{path / INDEX_NAME}: not a valid safetensors index"
                ) from None
            files = sorted({path / f for f in weight_map.values()})
            missing = [str(f) for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(f"shards listed in {INDEX_NAME} are missing: {missing}")
        elif (path / SINGLE_NAME).is_file():
            files = [path / SINGLE_NAME]
        else:
            files = sorted(path.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"no *.safetensors files in {path}")
        self.files = files
        self._entries: dict[str, _Entry] = {}
        for file in files:
            for name, entry in _parse_header(file).items():
                if name in self._entries:
                    raise CheckpointError(
                        f"tensor {name} appears in both {self._entries[name].path} and {file}"
                    )
                self._entries[name] = entry

    kind = SAFETENSORS

    def names(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> TensorInfo:
        return self._entries[name].info

    def byte_range(self, name: str) -> tuple[Path, int, int]:
        """(file, absolute offset, length) of a tensor's raw little-endian bytes."""
        entry = self._entries[name]
        return entry.path, entry.offset, entry.info.nbytes

    def read(self, name: str) -> np.ndarray:
        entry = self._entries[name]
        info = entry.info
        if info.nbytes == 0:
            return np.zeros(info.shape, dtype=info.dtype)
        return np.memmap(
            entry.path, dtype=info.dtype, mode="r", offset=entry.offset, shape=info.shape
        )
