"""The fidelity manifest (manifest.json): what every source tensor became, with hashes.

For each source tensor: the initializer it became, the transform (identity, cast, stack,
stack+cast), the sha256 of its raw checkpoint bytes and of the bytes written for it, and where
those bytes sit inside the initializer. Every source tensor appears exactly once, either under
"sources" (bound) or under "unused" with the reason. The package's own facts (format version,
tool version, dtype, files) sit beside the caller's metadata (e.g. the hub revision).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius_lite.errors import PackageError
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import BindingPlan
from mobius_lite.weights.publish import MANIFEST_FILE, PENDING_MANIFEST, is_staging_name
from mobius_lite.weights.writer import WriteResult

FORMAT = "mobius-lite-package"
FORMAT_VERSION = 1
RESERVED_KEYS = (
    "format",
    "format_version",
    "tool",
    "dtype",
    "model_file",
    "files",
    "initializers",
    "sources",
    "unused",
    "totals",
)
SMALL_FILE = 64 << 20  # files up to this size get a whole-file sha256 in "files"


def _tool_version() -> str:
    from mobius_lite import __version__

    return __version__


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(
    result: WriteResult,
    plan: BindingPlan,
    source: TensorSource,
    dtype: str,
    directory: Path,
    other_files: list[str],
    metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assemble the manifest from what the writer recorded; raise if any source is unaccounted."""
    metadata = dict(metadata or {})
    clash = sorted(set(metadata) & set(RESERVED_KEYS))
    if clash:
        raise PackageError(f"package metadata may not use the manifest's own keys {clash}")

    files: dict[str, dict[str, Any]] = {}
    for name in [result.model_file, *result.data_files, *other_files]:
        path = directory / name
        size = path.stat().st_size
        entry: dict[str, Any] = {"bytes": size}
        if name in result.data_files:
            entry["role"] = "external-data"
        else:
            entry["role"] = "model" if name == result.model_file else "aux"
            if size <= SMALL_FILE:
                entry["sha256"] = _file_sha256(path)
        files[name] = entry

    initializers: dict[str, dict[str, Any]] = {}
    sources: dict[str, dict[str, Any]] = {}
    for tensor in result.tensors:
        binding = tensor.binding
        entry = {
            "file": tensor.file,
            "offset": tensor.offset,
            "length": tensor.length,
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "transform": binding.transform.value if binding else "constant",
            "sources": list(binding.sources) if binding else [],
        }
        if len(tensor.segments) == 1:
            entry["sha256"] = tensor.segments[0].sha256
        initializers[tensor.name] = entry
        if binding is None:
            continue
        for segment in tensor.segments:
            assert segment.source is not None
            if segment.source in sources:
                raise PackageError(f"source tensor {segment.source} was bound twice")
            info = source.info(segment.source)
            sources[segment.source] = {
                "initializer": tensor.name,
                "transform": binding.transform.value,
                "dtype": str(info.dtype),
                "shape": list(info.shape),
                "nbytes": segment.source_nbytes,
                "sha256": segment.source_sha256,
                "written": {
                    "offset": segment.offset,
                    "length": segment.length,
                    "dtype": str(binding.target_dtype),
                    "sha256": segment.sha256,
                },
            }

    unused = {}
    for name, reason in sorted(plan.unused.items()):
        info = source.info(name)
        unused[name] = {
            "reason": reason,
            "dtype": str(info.dtype),
            "shape": list(info.shape),
            "nbytes": info.nbytes,
        }

    everything = set(source.names())
    accounted = set(sources) | set(unused)
    if everything != accounted or set(sources) & set(unused):
        missing = sorted(everything - accounted)[:10]
        extra = sorted(accounted - everything)[:10]
        raise PackageError(
            f"manifest does not account for the source exactly: unaccounted {missing}, "
            f"unknown {extra}"
        )

    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tool": {"name": "mobius-lite", "version": _tool_version()},
        "dtype": dtype,
        "model_file": result.model_file,
        **metadata,
        "files": files,
        "totals": {
            "initializers": len(initializers),
            "source_tensors": len(sources),
            "unused_tensors": len(unused),
            "data_files": len(result.data_files),
            "bytes_written": result.bytes_written,
        },
        "initializers": initializers,
        "sources": sources,
        "unused": unused,
    }


def write_manifest(directory: Path, manifest: dict[str, Any], name: str = PENDING_MANIFEST) -> Path:
    """Write the manifest durably: in a staging directory under its pending name, which
    publish() turns into manifest.json just before the package is renamed into place."""
    path = directory / name
    with open(path, "x", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a package directory; PackageError if there is none or it is foreign."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if is_staging_name(directory.resolve().name):
        raise PackageError(
            f"{directory} is the temporary directory of an unfinished or replaced export, not a "
            "package; it is removed by the next export to the same destination"
        )
    if not path.is_file():
        raise PackageError(
            f"{directory} is not a mobius package (no {MANIFEST_FILE}); an unfinished export "
            "leaves only a hidden .partial directory, which is not a package"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PackageError(f"{path}: not valid JSON ({exc}); re-export the package") from None
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{path}: not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PackageError(
            f"{path}: manifest format version {manifest.get('format_version')} is not supported "
            f"(this mobius reads version {FORMAT_VERSION}); use a matching mobius version"
        )
    return manifest


# --------------------------------------------------------------------------- summary
def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


@dataclass
class SaveSummary:
    """What a save produced, for the one-screen report at the end of an export."""

    directory: Path
    dtype: str
    files: dict[str, int] = field(default_factory=dict)  # every file but the manifest
    data_files: list[str] = field(default_factory=list)  # the external-data shards, in order
    initializers: int = 0
    source_tensors: int = 0
    unused_tensors: int = 0
    bytes_written: int = 0
    seconds: float = 0.0

    @classmethod
    def from_manifest(cls, directory: Path, manifest: dict[str, Any], seconds: float):
        totals = manifest["totals"]
        files = manifest["files"]
        return cls(
            directory=Path(directory),
            dtype=manifest["dtype"],
            files={name: f["bytes"] for name, f in files.items()},
            data_files=[n for n, f in files.items() if f.get("role") == "external-data"],
            initializers=totals["initializers"],
            source_tensors=totals["source_tensors"],
            unused_tensors=totals["unused_tensors"],
            bytes_written=totals["bytes_written"],
            seconds=seconds,
        )

    def render(self, max_other: int = 8) -> str:
        """At most about 16 lines however many shards: the shards are listed as one line."""
        total = sum(self.files.values())
        rate = self.bytes_written / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"package   {self.directory}  ({self.dtype})",
            f"files     {len(self.files) + 1} files, {human_bytes(total)} (+ {MANIFEST_FILE})",
        ]
        shards = self.data_files
        others = [n for n in self.files if n not in set(shards)]
        for name in others[:1]:  # the model file
            lines.append(f"          {human_bytes(self.files[name]):>12}  {name}")
        if len(shards) == 1:
            lines.append(f"          {human_bytes(self.files[shards[0]]):>12}  {shards[0]}")
        elif shards:
            sizes = [self.files[n] for n in shards]
            pattern = re.sub(r"-\d{5}-of-", "-*-of-", shards[0])
            lines.append(
                f"          {human_bytes(sum(sizes)):>12}  {pattern}: {len(shards)} shards, "
                f"largest {human_bytes(max(sizes))}"
            )
        for name in others[1 : 1 + max_other]:
            lines.append(f"          {human_bytes(self.files[name]):>12}  {name}")
        if len(others) > 1 + max_other:
            rest = sum(self.files[n] for n in others[1 + max_other :])
            lines.append(
                f"          {human_bytes(rest):>12}  ... {len(others) - 1 - max_other} more"
            )
        lines.append(
            f"tensors   {self.initializers} initializers from {self.source_tensors} source "
            f"tensors; {self.unused_tensors} intentionally unused (see {MANIFEST_FILE})"
        )
        lines.append(
            f"time      {self.seconds:.1f} s, {human_bytes(self.bytes_written)} of weights "
            f"({human_bytes(rate)}/s)"
        )
        return "\n".join(lines)
