"""Streaming save: initializers go to sharded external data one bounded chunk at a time.

Data is pulled from each initializer's lazy source (BoundTensor.iter_chunks) and appended to
the current shard; a shard closes when the next tensor would push it past `shard_size`
(a tensor larger than a shard gets a shard of its own). Shards are regular files named after
the model file: model.onnx.data for one shard, model.onnx-00001-of-00007.data for several.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from mobius_lite.weights.binding import BoundTensor

DEFAULT_SHARD_SIZE = 1 << 30
INLINE_LIMIT = 1024  # builder constants below this stay inside the model file
ALIGNMENT = 64


@dataclass
class WrittenTensor:
    name: str
    file: str
    offset: int
    length: int


@dataclass
class WriteResult:
    model_file: str
    data_files: list[str] = field(default_factory=list)
    tensors: list[WrittenTensor] = field(default_factory=list)
    bytes_written: int = 0


SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """'1GiB', '512MB', '1048576' -> bytes (decimal kB/MB/GB, binary KiB/MiB/GiB)."""
    if isinstance(text, int):
        value = text
    else:
        import re

        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in SIZE_UNITS:
            raise ValueError(
                f"invalid size {text!r}: use a byte count or a number with a unit "
                "(KB, MB, GB, KiB, MiB, GiB), e.g. 512MB or 1GiB"
            )
        value = int(float(match.group(1)) * SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be positive, found {text!r}")
    return value


def _chunks(tensor: ir.TensorProtocol) -> Iterator[bytes]:
    if isinstance(tensor, BoundTensor):
        yield from tensor.iter_chunks()
    else:
        yield tensor.tobytes()


def shard_name(model_file: str, index: int, count: int) -> str:
    if count == 1:
        return f"{model_file}.data"
    stem = model_file
    return f"{stem}-{index + 1:05d}-of-{count:05d}.data"


def plan_shards(sizes: list[int], shard_size: int) -> list[int]:
    """Shard index of each tensor (in order), packing greedily with 64-byte alignment."""
    assignment: list[int] = []
    shard, used = 0, 0
    for size in sizes:
        padded = -(-size // ALIGNMENT) * ALIGNMENT
        if used and used + size > shard_size:
            shard, used = shard + 1, 0
        assignment.append(shard)
        used += padded
    return assignment


def write_model(
    model: ir.Model,
    directory: str | Path,
    model_file: str = "model.onnx",
    shard_size: int = DEFAULT_SHARD_SIZE,
    on_bytes: Callable[[int], None] | None = None,
) -> WriteResult:
    """Write `model` into `directory` (which must exist) with sharded external data."""
    directory = Path(directory)
    external = [
        v
        for v in model.graph.initializers.values()
        if v.const_value is not None
        and (isinstance(v.const_value, BoundTensor) or v.const_value.nbytes > INLINE_LIMIT)
    ]
    sizes = [v.const_value.nbytes for v in external]
    assignment = plan_shards(sizes, shard_size)
    count = (assignment[-1] + 1) if assignment else 0
    result = WriteResult(model_file=model_file)
    handles: dict[int, tuple[str, object]] = {}
    try:
        for value, shard in zip(external, assignment):
            if shard not in handles:
                for _, old in handles.values():
                    old.close()  # type: ignore[attr-defined]
                name = shard_name(model_file, shard, count)
                handles = {shard: (name, open(directory / name, "wb"))}  # noqa: SIM115
                result.data_files.append(name)
            name, handle = handles[shard]
            offset = handle.tell()  # type: ignore[attr-defined]
            pad = -offset % ALIGNMENT
            if pad:
                handle.write(b"\0" * pad)  # type: ignore[attr-defined]
                offset += pad
            tensor = value.const_value
            length = 0
            for chunk in _chunks(tensor):
                handle.write(chunk)  # type: ignore[attr-defined]
                length += len(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            if length != tensor.nbytes:
                raise RuntimeError(f"{value.name}: wrote {length} bytes, expected {tensor.nbytes}")
            value.const_value = ir.ExternalTensor(
                name,
                offset=offset,
                length=length,
                dtype=tensor.dtype,
                shape=tensor.shape,
                name=value.name,
                base_dir=str(directory),
            )
            result.tensors.append(WrittenTensor(value.name, name, offset, length))
            result.bytes_written += length
    finally:
        for _, handle in handles.values():
            handle.flush()  # type: ignore[attr-defined]
            os.fsync(handle.fileno())  # type: ignore[attr-defined]
            handle.close()  # type: ignore[attr-defined]
    proto = ir.serde.serialize_model(model)
    (directory / model_file).write_bytes(proto.SerializeToString())
    return result
