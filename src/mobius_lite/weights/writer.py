"""Streaming save: initializers go to sharded external data one bounded chunk at a time.

Each source tensor is read lazily (a byte range of the checkpoint file when the source has
one, else the in-memory array), in chunks of at most `chunk_bytes`, cast per chunk when the
binding says so, hashed (sha256 of the source bytes and of the written bytes) and appended to
the current shard. Reading, hashing and writing overlap on a small thread pool; memory stays
at a few chunks whatever the model size.

Shards are regular files named after the model file: model.onnx.data for one shard,
model.onnx-00001-of-00007.data for several. A shard closes when the next tensor would push it
past `shard_size`; a single tensor larger than `shard_size` gets a shard of its own (an ONNX
external tensor cannot span files). The model proto is serialized with external references
only, so no tensor data is ever materialised for it.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import Binding, BoundTensor, cast_array

DEFAULT_SHARD_SIZE = 1 << 30
DEFAULT_CHUNK_BYTES = 16 << 20
HASH_QUEUE = 3  # chunks waiting for each hashing thread
INLINE_LIMIT = 1024  # builder constants below this stay inside the model file
ALIGNMENT = 64
LARGE_ALIGNMENT = 4096  # page-aligned offsets for tensors of 1 MiB and more (mmap-friendly)
LARGE_TENSOR = 1 << 20

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


# --------------------------------------------------------------------------- records
@dataclass
class Segment:
    """The part of an initializer made from one source tensor (all of it unless stacked)."""

    source: str | None  # None for builder constants that have no source tensor
    offset: int  # byte offset inside the initializer
    length: int  # written bytes
    sha256: str  # of the written bytes
    source_sha256: str | None = None  # of the raw source bytes
    source_nbytes: int = 0


@dataclass
class WrittenTensor:
    """One external initializer: where it lives and what it was made from."""

    name: str
    file: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]
    binding: Binding | None = None
    segments: list[Segment] = field(default_factory=list)


@dataclass
class WriteResult:
    model_file: str
    data_files: list[str] = field(default_factory=list)
    file_sizes: dict[str, int] = field(default_factory=dict)
    tensors: list[WrittenTensor] = field(default_factory=list)
    bytes_written: int = 0


# --------------------------------------------------------------------------- planning
def shard_name(model_file: str, index: int, count: int) -> str:
    """model.onnx.data for a single shard, model.onnx-00002-of-00007.data for several."""
    if count == 1:
        return f"{model_file}.data"
    return f"{model_file}-{index + 1:05d}-of-{count:05d}.data"


def alignment_for(size: int) -> int:
    return LARGE_ALIGNMENT if size >= LARGE_TENSOR else ALIGNMENT


def plan_shards(sizes: list[int], shard_size: int) -> list[tuple[int, int]]:
    """(shard index, offset) of each tensor, packed in order.

    A tensor starts a new shard when its aligned end would pass `shard_size`; a tensor larger
    than `shard_size` therefore sits alone in its shard. No shard ends in padding.
    """
    placement: list[tuple[int, int]] = []
    shard, used = 0, 0
    for size in sizes:
        align = alignment_for(size)
        offset = -(-used // align) * align
        if used and offset + size > shard_size:
            shard, offset = shard + 1, 0
        placement.append((shard, offset))
        used = offset + size
    return placement


def external_initializers(model: ir.Model) -> list[ir.Value]:
    """Initializers of every graph (subgraphs included) whose data goes to external files."""
    out = []
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            if tensor is None:
                raise ValueError(f"initializer {value.name} has no data bound to it")
            if isinstance(tensor, BoundTensor) or tensor.nbytes > INLINE_LIMIT:
                out.append(value)
    return out


# --------------------------------------------------------------------------- reading
def _aligned_chunk(chunk_bytes: int, itemsize: int) -> int:
    step = max(itemsize, 4096 // itemsize * itemsize)
    return max(step, chunk_bytes // step * step)


class BufferPool:
    """A fixed set of reusable read buffers: bounds the memory in flight and spares the
    page faults of a fresh allocation for every chunk."""

    def __init__(self, count: int, size: int) -> None:
        self.size = size
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(count):
            self._free.put(bytearray(size))

    def get(self) -> bytearray:
        return self._free.get()

    def release(self, chunk) -> None:
        """Return the buffer behind a chunk that came from this pool (others are ignored)."""
        owner = chunk.obj if isinstance(chunk, memoryview) else None
        if isinstance(owner, bytearray) and len(owner) == self.size:
            self._free.put(owner)


def iter_source_bytes(
    source: TensorSource,
    name: str,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    buffers: BufferPool | None = None,
) -> Iterator[bytes | memoryview]:
    """The raw (little-endian) bytes of one source tensor, a bounded chunk at a time.

    Sources with `byte_range` (safetensors files) are read with pread, into buffers taken from
    `buffers` (the caller releases each chunk) or fresh ones; no mapping of the file grows the
    resident set. Other sources are sliced in memory.
    """
    info = source.info(name)
    chunk = _aligned_chunk(chunk_bytes, info.dtype.itemsize)
    if buffers is not None:
        chunk = min(chunk, _aligned_chunk(buffers.size, info.dtype.itemsize))
    byte_range = getattr(source, "byte_range", None)
    if byte_range is not None:
        path, start, length = byte_range(name)
        fd = os.open(path, os.O_RDONLY)
        try:
            pos = 0
            while pos < length:
                want = min(chunk, length - pos)
                view = memoryview(buffers.get() if buffers else bytearray(want))[:want]
                got = 0
                while got < want:  # short reads are legal; finish the chunk
                    n = os.preadv(fd, [view[got:]], start + pos + got)
                    if n == 0:
                        raise OSError(f"{path}: unexpected end of file reading {name}")
                    got += n
                yield view
                pos += want
        finally:
            os.close(fd)
        return
    array = np.ascontiguousarray(source.read(name))
    flat = memoryview(array.reshape(-1).view(np.uint8))
    for pos in range(0, len(flat), chunk):
        yield flat[pos : pos + chunk]


def convert_chunk(raw: bytes | memoryview, source_dtype: np.dtype, target_dtype: np.dtype):
    """Source bytes -> written bytes for one chunk (identity, or an element-type cast)."""
    if source_dtype == target_dtype:
        return raw
    array = np.frombuffer(raw, dtype=source_dtype)
    # Viewed as bytes: the buffer protocol does not carry ml_dtypes types such as bfloat16.
    return memoryview(cast_array(array, target_dtype).view(np.uint8))


class _Prefetch:
    """Iterate with the next item fetched on a worker thread (pread releases the GIL)."""

    def __init__(self, iterator: Iterator, pool: ThreadPoolExecutor) -> None:
        self._it = iterator
        self._pool = pool
        self._next: Future = pool.submit(next, iterator, None)

    def __iter__(self):
        while True:
            item = self._next.result()
            if item is None:
                return
            self._next = self._pool.submit(next, self._it, None)
            yield item


class _HashStream:
    """sha256 streams fed on one dedicated thread, in submission order, so hashing overlaps
    reading and writing; at most `depth` chunks wait in its queue (bounded memory)."""

    def __init__(self, depth: int = HASH_QUEUE) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mobius-hash")
        self._queue: deque[Future] = deque()
        self._depth = depth

    def update(self, digest, data) -> Future:
        job = self._pool.submit(digest.update, data)
        self._queue.append(job)
        while len(self._queue) > self._depth:
            self._queue.popleft().result()
        return job

    def hexdigest(self, digest) -> Future:
        """The digest once every update queued before it has run."""
        return self._pool.submit(digest.hexdigest)

    def close(self) -> None:
        while self._queue:
            self._queue.popleft().result()
        self._pool.shutdown()


# --------------------------------------------------------------------------- writing
class _ShardWriter:
    """Appends tensors to the planned shard files; every file is a fresh regular file.

    A finished shard is fsynced and closed on a background thread while the next one fills.
    """

    def __init__(self, directory: Path, names: list[str], pool: ThreadPoolExecutor) -> None:
        self.directory = directory
        self.names = names
        self.index = -1
        self.handle = None
        self.sizes: dict[str, int] = {}
        self._pool = pool
        self._closing: list[Future] = []

    def seek(self, shard: int, offset: int) -> None:
        if shard != self.index:
            self._finish()
            self.index = shard
            # "xb": refuse to follow or reuse anything already there (no links, no clobber).
            self.handle = open(self.directory / self.names[shard], "xb")  # noqa: SIM115
        pos = self.handle.tell()
        if offset < pos:
            raise RuntimeError(f"shard plan went backwards ({offset} < {pos})")
        if offset > pos:
            self.handle.write(b"\0" * (offset - pos))

    def write(self, data) -> None:
        self.handle.write(data)

    def _finish(self) -> None:
        if self.handle is not None:
            handle, self.handle = self.handle, None
            handle.flush()
            self.sizes[self.names[self.index]] = handle.tell()
            self._closing.append(self._pool.submit(_fsync_close, handle))

    def close(self) -> None:
        """Finish the open shard and wait until every shard is on disk."""
        self._finish()
        for job in self._closing:
            job.result()
        self._closing.clear()


def _fsync_close(handle) -> None:
    try:
        os.fsync(handle.fileno())
    finally:
        handle.close()


def _write_binding(
    binding: Binding,
    source: TensorSource,
    out: _ShardWriter,
    reader: ThreadPoolExecutor,
    hashers: tuple[_HashStream, _HashStream],
    buffers: BufferPool,
    chunk_bytes: int,
    on_bytes: Callable[[int], None] | None,
) -> list[Segment]:
    """Stream one binding's sources into `out`; segment hashes are Futures until resolved."""
    segments = []
    position = 0
    cast = binding.source_dtype != binding.target_dtype
    for name in binding.sources:
        src_hash = hashlib.sha256()
        out_hash = hashlib.sha256() if cast else src_hash
        length = 0
        source_nbytes = 0
        chunks = iter_source_bytes(source, name, chunk_bytes, buffers)
        for raw in _Prefetch(chunks, reader):
            hashed = hashers[0].update(src_hash, raw)
            data = convert_chunk(raw, binding.source_dtype, binding.target_dtype)
            if cast:
                hashers[1].update(out_hash, data)
            out.write(data)
            # The read buffer goes back to the pool once it is written and hashed.
            hashed.add_done_callback(lambda _, chunk=raw: buffers.release(chunk))
            source_nbytes += len(raw)
            length += len(data)
            if on_bytes is not None:
                on_bytes(len(data))
        source_digest = hashers[0].hexdigest(src_hash)
        segments.append(
            Segment(
                source=name,
                offset=position,
                length=length,
                sha256=hashers[1].hexdigest(out_hash) if cast else source_digest,
                source_sha256=source_digest,
                source_nbytes=source_nbytes,
            )
        )
        position += length
    return segments


def write_model(
    model: ir.Model,
    directory: str | Path,
    model_file: str = "model.onnx",
    shard_size: int = DEFAULT_SHARD_SIZE,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WriteResult:
    """Write `model` into `directory` (which must exist) with sharded external data.

    The model object is left as it was (its lazy tensors are swapped for external references
    only while the proto is serialized), so the same package can be saved again.
    """
    directory = Path(directory)
    values = external_initializers(model)
    sizes = [v.const_value.nbytes for v in values]
    placement = plan_shards(sizes, shard_size)
    count = (placement[-1][0] + 1) if placement else 0
    names = [shard_name(model_file, i, count) for i in range(count)]
    result = WriteResult(model_file=model_file, data_files=list(names))
    hashers = (_HashStream(depth=HASH_QUEUE), _HashStream(depth=HASH_QUEUE))
    # Buffers in flight: one being read ahead, one being written, the hash queue and the one
    # being hashed. Peak memory of the data path is about this many chunks, whatever the model.
    buffers = BufferPool(HASH_QUEUE + 3, chunk_bytes)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="mobius-io") as io:
        out = _ShardWriter(directory, names, io)
        try:
            for value, size, (shard, offset) in zip(values, sizes, placement, strict=True):
                out.seek(shard, offset)
                tensor = value.const_value
                if isinstance(tensor, BoundTensor):
                    segments = _write_binding(
                        tensor.binding,
                        tensor.source,
                        out,
                        io,
                        hashers,
                        buffers,
                        chunk_bytes,
                        on_bytes,
                    )
                    binding = tensor.binding
                else:  # a builder constant: small, already in memory
                    data = tensor.tobytes()
                    out.write(data)
                    if on_bytes is not None:
                        on_bytes(len(data))
                    segments = [Segment(None, 0, len(data), hashlib.sha256(data).hexdigest())]
                    binding = None
                length = sum(s.length for s in segments)
                if length != size:
                    raise RuntimeError(f"{value.name}: wrote {length} bytes, expected {size}")
                result.tensors.append(
                    WrittenTensor(
                        name=value.name,
                        file=names[shard],
                        offset=offset,
                        length=length,
                        dtype=tensor.dtype.name,
                        shape=tuple(int(d) for d in tensor.shape),
                        binding=binding,
                        segments=segments,
                    )
                )
                result.bytes_written += length
        finally:
            out.close()
            for hasher in hashers:
                hasher.close()
    for record in result.tensors:
        for segment in record.segments:
            segment.sha256 = _resolved(segment.sha256)
            segment.source_sha256 = _resolved(segment.source_sha256)
    result.file_sizes = dict(out.sizes)
    _write_proto(model, directory, model_file, values, result.tensors)
    result.file_sizes[model_file] = (directory / model_file).stat().st_size
    return result


def _resolved(value):
    return value.result() if isinstance(value, Future) else value


def _write_proto(
    model: ir.Model,
    directory: Path,
    model_file: str,
    values: list[ir.Value],
    written: list[WrittenTensor],
) -> None:
    """Serialize with every external initializer as a reference, then restore the lazy data."""
    originals = [v.const_value for v in values]
    try:
        for value, record, tensor in zip(values, written, originals, strict=True):
            value.const_value = ir.ExternalTensor(
                record.file,
                offset=record.offset,
                length=record.length,
                dtype=tensor.dtype,
                shape=tensor.shape,
                name=value.name,
                base_dir=str(directory),
            )
        proto = ir.serde.serialize_model(model)
    finally:
        for value, tensor in zip(values, originals, strict=True):
            value.const_value = tensor
    with open(directory / model_file, "xb") as handle:
        handle.write(proto.SerializeToString())
        handle.flush()
        os.fsync(handle.fileno())
