"""Streaming save: initializers go to sharded external data one bounded chunk at a time.

Each source tensor is read lazily (a byte range of the checkpoint file when the source has
one, else the in-memory array), in chunks of at most `chunk_bytes`, converted per chunk by the
binding's conversion (the storage format decides: identity, cast, ...), checked for
non-finite values, hashed (sha256 of the source bytes and of the written bytes) and appended
to the current shard. Reading, hashing and writing overlap on a small thread pool; memory
stays at a few chunks whatever the model size.

Several graphs of one package share one set of shards: a tensor bound in two graphs (the same
binding) is written once and referenced by both. Shards are regular files named after the
first model file: model.onnx.data for one shard, model.onnx-00001-of-00007.data for several.
A shard closes when the next tensor would push it past `shard_size`; a single tensor larger
than `shard_size` gets a shard of its own (an ONNX external tensor cannot span files). The
model protos are serialized with external references only, so no tensor data is ever
materialised for them.
"""

from __future__ import annotations

import hashlib
import os
import queue
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from mobius_lite.formats.dense import dense
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import Binding, BoundTensor

DEFAULT_SHARD_SIZE = 1 << 30
DEFAULT_CHUNK_BYTES = 16 << 20
HASH_QUEUE = 3  # chunks waiting for each hashing thread
INLINE_LIMIT = 1024  # builder constants below this stay inside the model file
ALIGNMENT = 64
LARGE_ALIGNMENT = 4096  # page-aligned offsets for tensors of 1 MiB and more (mmap-friendly)
LARGE_TENSOR = 1 << 20


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
    """One external initializer: where it lives, what it was made from, who references it."""

    name: str
    file: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]
    binding: Binding | None = None
    segments: list[Segment] = field(default_factory=list)
    graphs: list[str] = field(default_factory=list)  # the model files that reference it
    nonfinite: int = 0  # NaN / +-Inf values among the written elements (float tensors)


@dataclass
class WriteResult:
    model_files: list[str]
    data_files: list[str] = field(default_factory=list)
    file_sizes: dict[str, int] = field(default_factory=dict)
    tensors: list[WrittenTensor] = field(default_factory=list)  # each written tensor once
    bytes_written: int = 0

    @property
    def model_file(self) -> str:
        return self.model_files[0]

    def tensors_of(self, model_file: str) -> list[WrittenTensor]:
        return [t for t in self.tensors if model_file in t.graphs]

    @property
    def nonfinite(self) -> dict[str, int]:
        """Initializer name -> count, for the tensors holding NaN or infinite values."""
        return {t.name: t.nonfinite for t in self.tensors if t.nonfinite}


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
    unit_bytes: int | None = None,
) -> Iterator[bytes | memoryview]:
    """The raw (little-endian) bytes of one source tensor, a bounded chunk at a time.

    Every chunk holds whole units of `unit_bytes` (default: one element; a conversion's
    block for packed storage). Sources whose tensors have a `byte_range` (files) are read
    with pread, into buffers taken from `buffers` (the caller releases each chunk) or fresh ones;
    no mapping of the file grows the resident set. Other sources are sliced in memory.
    """
    unit = unit_bytes or source.info(name).dtype.itemsize
    chunk = _aligned_chunk(chunk_bytes, unit)
    if buffers is not None:
        chunk = min(chunk, _aligned_chunk(buffers.size, unit))
    span = source.byte_range(name)
    if span is not None:
        path, start, length = span
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


def count_nonfinite(data: bytes | memoryview, dtype: np.dtype) -> int:
    """NaN and infinite elements of a float chunk (0 for other element types)."""
    if not dense(dtype).floating:
        return 0
    values = np.frombuffer(data, dtype=dtype)
    finite = np.isfinite(values)
    return 0 if finite.all() else int(values.size - np.count_nonzero(finite))


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
) -> tuple[list[Segment], int]:
    """Stream one binding's sources into `out`; returns its segments (hashes are Futures
    until resolved) and its count of non-finite written values."""
    segments = []
    position = 0
    nonfinite = 0
    conversion = binding.conversion
    cast = not conversion.verbatim
    for name in binding.sources:
        src_hash = hashlib.sha256()
        out_hash = hashlib.sha256() if cast else src_hash
        length = 0
        source_nbytes = 0
        chunks = iter_source_bytes(source, name, chunk_bytes, buffers, conversion.unit_bytes)
        for raw in _Prefetch(chunks, reader):
            hashed = hashers[0].update(src_hash, raw)
            data = conversion.convert(raw)
            nonfinite += count_nonfinite(data, binding.target_dtype)
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
    return segments, nonfinite


def write_model(
    model: ir.Model,
    directory: str | Path,
    model_file: str = "model.onnx",
    shard_size: int = DEFAULT_SHARD_SIZE,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WriteResult:
    """Write one model into `directory` (which must exist) with sharded external data."""
    return write_graphs([(model_file, model)], directory, shard_size, on_bytes, chunk_bytes)


def _unique_tensors(
    graphs: list[tuple[str, ir.Model]],
) -> tuple[list[ir.Value], dict[str, list[ir.Value]], dict[int, ir.Value]]:
    """The external initializers to write, each once: a bound tensor whose binding appears in
    several graphs (a declared shared tensor) is written once. Returns the values to write,
    each graph's external values, and for every external value (by id) the one written for it.
    """
    by_binding: dict[Binding, ir.Value] = {}
    to_write: list[ir.Value] = []
    per_graph: dict[str, list[ir.Value]] = {}
    written_for: dict[int, ir.Value] = {}
    for model_file, model in graphs:
        per_graph[model_file] = external_initializers(model)
        for value in per_graph[model_file]:
            tensor = value.const_value
            key = tensor.binding if isinstance(tensor, BoundTensor) else None
            written = by_binding.setdefault(key, value) if key is not None else value
            if written is value:
                to_write.append(value)
            written_for[id(value)] = written
    return to_write, per_graph, written_for


def write_graphs(
    graphs: list[tuple[str, ir.Model]],
    directory: str | Path,
    shard_size: int = DEFAULT_SHARD_SIZE,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> WriteResult:
    """Write (model file, model) pairs into `directory` (which must exist), their external
    data in one set of shards named after the first model file.

    The model objects are left as they were (their lazy tensors are swapped for external
    references only while each proto is serialized), so the same package can be saved again.
    """
    directory = Path(directory)
    values, per_graph, written_for = _unique_tensors(graphs)
    users = _users(per_graph, written_for)
    model_files = [name for name, _ in graphs]
    sizes = [v.const_value.nbytes for v in values]
    placement = plan_shards(sizes, shard_size)
    count = (placement[-1][0] + 1) if placement else 0
    names = [shard_name(model_files[0], i, count) for i in range(count)]
    result = WriteResult(model_files=model_files, data_files=list(names))
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
                    segments, nonfinite = _write_binding(
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
                    segments, nonfinite, binding = [_write_constant(tensor, out, on_bytes)], 0, None
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
                        graphs=users[id(value)],
                        nonfinite=nonfinite,
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
    record_of = {id(v): r for v, r in zip(values, result.tensors, strict=True)}
    for model_file, model in graphs:
        graph_values = per_graph[model_file]
        records = [record_of[id(written_for[id(v)])] for v in graph_values]
        _write_proto(model, directory, model_file, graph_values, records)
        result.file_sizes[model_file] = (directory / model_file).stat().st_size
    return result


def _users(
    per_graph: dict[str, list[ir.Value]], written_for: dict[int, ir.Value]
) -> dict[int, list[str]]:
    """id of each written value -> the model files whose graphs use it."""
    users: dict[int, list[str]] = {}
    for model_file, graph_values in per_graph.items():
        for value in graph_values:
            users.setdefault(id(written_for[id(value)]), []).append(model_file)
    return users


def _write_constant(
    tensor: ir.TensorProtocol, out: _ShardWriter, on_bytes: Callable[[int], None] | None
) -> Segment:
    """Write a builder constant (small, already in memory) whole; its one segment."""
    data = tensor.tobytes()
    out.write(data)
    if on_bytes is not None:
        on_bytes(len(data))
    return Segment(None, 0, len(data), hashlib.sha256(data).hexdigest())


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
