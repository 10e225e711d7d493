"""The fidelity manifest (manifest.json): what every source tensor became, with hashes.

Per graph (decoder, embedding, ...): its file and its external initializers. For each source
tensor: the initializer it became and the graphs using it, the transform (identity, cast,
stack, stack+cast, quantize), the recipe of a tensor quantized at export ("quantize"), the
sha256 of its raw checkpoint bytes and of the bytes written for it,
and where those bytes sit inside the initializer; a source re-laid out into several
initializers (MatMulNBits B and scales, transform "relayout") lists each under "parts".
Every source tensor appears exactly once, under "sources" (bound) or under "unused" with the
reason; one used by several graphs is written once and listed under "shared". Float
initializers record their count of non-finite values. The package's own facts (format
version, tool version, dtype, files) sit beside the caller's metadata (e.g. the hub revision).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobius_lite.errors import PackageError
from mobius_lite.formats.dense import dense
from mobius_lite.formats.quantize.storage import recipe_of
from mobius_lite.hashing import sha256_file
from mobius_lite.layout import DECODER_FILE, MANIFEST_FILE
from mobius_lite.sources.base import TensorSource
from mobius_lite.version import __version__
from mobius_lite.weights.binding import BindingPlan
from mobius_lite.weights.publish import PENDING_MANIFEST, is_staging_name
from mobius_lite.weights.writer import Segment, WriteResult, WrittenTensor

FORMAT = "mobius-lite-package"
FORMAT_VERSION = 2
RESERVED_KEYS = (
    "format",
    "format_version",
    "tool",
    "dtype",
    "graphs",
    "files",
    "sources",
    "unused",
    "shared",
    "totals",
)
SMALL_FILE = 64 << 20  # files up to this size get a whole-file sha256 in "files"


@dataclass(frozen=True)
class GraphPlan:
    """One graph of the package as the manifest records it."""

    role: str
    file: str
    plan: BindingPlan


def _initializer_entry(tensor: WrittenTensor) -> dict[str, Any]:
    binding = tensor.binding
    entry: dict[str, Any] = {
        "file": tensor.file,
        "offset": tensor.offset,
        "length": tensor.length,
        "dtype": tensor.dtype,
        "shape": list(tensor.shape),
        "transform": binding.transform if binding else "constant",
        "sources": list(binding.sources) if binding else [],
    }
    if len(tensor.segments) == 1:
        entry["sha256"] = tensor.segments[0].sha256
    if binding is not None and dense(binding.target_dtype).floating:
        entry["nonfinite"] = tensor.nonfinite
    return entry


def _add_part(
    entry: dict[str, Any], name: str, initializer: str, binding: Any, written: dict[str, Any]
) -> None:
    """Record one more part of a source bound as several parts of one re-layout (MatMulNBits
    B and scales); any other second binding of a source is an error."""
    parts = entry.get("parts")
    if binding.part is None or parts is None or binding.part in {p["part"] for p in parts}:
        raise PackageError(f"source tensor {name} was bound twice")
    parts.append({"part": binding.part, "initializer": initializer, "written": written})


def build_manifest(
    result: WriteResult,
    graphs: list[GraphPlan],
    source: TensorSource,
    dtype: str,
    directory: Path,
    other_files: list[str],
    metadata: dict[str, Any] | None = None,
    shared: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Assemble the manifest from what the writer recorded; raise if any source tensor is
    unaccounted for, or bound in several graphs without being declared in `shared`
    (source name -> the roles of the graphs that share it)."""
    metadata = dict(metadata or {})
    shared = dict(shared or {})
    clash = sorted(set(metadata) & set(RESERVED_KEYS))
    if clash:
        raise PackageError(f"package metadata may not use the manifest's own keys {clash}")
    role_of = {g.file: g.role for g in graphs}
    files = _file_entries(result, role_of, directory, other_files)
    graph_entries, sources = _tensor_entries(result, graphs, role_of, source, shared)
    unused = _unused_entries(graphs, source)
    _check_accounted(source, sources, unused)

    nonfinite = result.nonfinite
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tool": {"name": "mobius-lite", "version": __version__},
        "dtype": dtype,
        **metadata,
        "graphs": graph_entries,
        "files": files,
        "totals": {
            "graphs": len(graphs),
            "initializers": len(result.tensors),
            "source_tensors": len(sources),
            "unused_tensors": len(unused),
            "shared_tensors": len(shared),
            "data_files": len(result.data_files),
            "bytes_written": result.bytes_written,
            "nonfinite_values": sum(nonfinite.values()),
        },
        "sources": sources,
        "unused": unused,
        "shared": shared,
    }


def _file_entries(
    result: WriteResult, role_of: dict[str, str], directory: Path, other_files: list[str]
) -> dict[str, dict[str, Any]]:
    """Every package file: its size and role, and the sha256 of a small graph or aux file."""
    files: dict[str, dict[str, Any]] = {}
    for name in [*result.model_files, *result.data_files, *other_files]:
        path = directory / name
        size = path.stat().st_size
        entry: dict[str, Any] = {"bytes": size}
        if name in result.data_files:
            entry["role"] = "external-data"
        else:
            entry["role"] = "model" if name in role_of else "aux"
            if size <= SMALL_FILE:
                entry["sha256"] = sha256_file(path)
        files[name] = entry
    return files


def _tensor_entries(
    result: WriteResult,
    graphs: list[GraphPlan],
    role_of: dict[str, str],
    source: TensorSource,
    shared: dict[str, list[str]],
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Each graph's initializers, and each bound source tensor with what it became; raise for
    a source bound twice, or used by several graphs without being declared shared."""
    graph_entries: dict[str, dict[str, Any]] = {
        g.role: {"file": g.file, "initializers": {}} for g in graphs
    }
    sources: dict[str, dict[str, Any]] = {}
    for tensor in result.tensors:
        roles = [role_of[f] for f in tensor.graphs]
        for role in roles:
            graph_entries[role]["initializers"][tensor.name] = _initializer_entry(tensor)
        binding = tensor.binding
        if binding is None:
            continue
        for segment in tensor.segments:
            assert segment.source is not None
            written = {
                "offset": segment.offset,
                "length": segment.length,
                "dtype": str(binding.target_dtype),
                "sha256": segment.sha256,
            }
            if segment.source in sources:
                _add_part(sources[segment.source], segment.source, tensor.name, binding, written)
                continue
            if len(roles) > 1 and sorted(shared.get(segment.source, [])) != sorted(roles):
                raise PackageError(
                    f"source tensor {segment.source} is used by the graphs {roles} but not "
                    "declared shared between them"
                )
            sources[segment.source] = _source_entry(source, tensor, segment, roles, written)
    undeclared = sorted(set(shared) - set(sources))
    if undeclared:
        raise PackageError(f"tensors declared shared but not written: {undeclared[:10]}")
    return graph_entries, sources


def _source_entry(
    source: TensorSource,
    tensor: WrittenTensor,
    segment: Segment,
    roles: list[str],
    written: dict[str, Any],
) -> dict[str, Any]:
    """What one source tensor became: its initializer, graphs, transform, hashes, recipe."""
    binding = tensor.binding
    assert binding is not None and segment.source is not None
    info = source.info(segment.source)
    entry: dict[str, Any] = {
        "initializer": tensor.name,
        "graphs": roles,
        "transform": binding.transform,
        "dtype": info.storage.name,
        "shape": list(info.shape),
        "nbytes": segment.source_nbytes,
        "sha256": segment.source_sha256,
        "written": written,
    }
    recipe = recipe_of(info.storage)
    if recipe is not None:  # quantized at export: its recipe
        entry["quantize"] = recipe.record()
    if binding.part is not None:
        entry["parts"] = [{"part": binding.part, "initializer": tensor.name, "written": written}]
    return entry


def _unused_entries(graphs: list[GraphPlan], source: TensorSource) -> dict[str, dict[str, Any]]:
    """Every source tensor the graphs deliberately leave out, with the reason, by name."""
    unused = {}
    for name, reason in sorted({k: v for g in graphs for k, v in g.plan.unused.items()}.items()):
        info = source.info(name)
        unused[name] = {
            "reason": reason,
            "dtype": info.storage.name,
            "shape": list(info.shape),
            "nbytes": info.nbytes,
        }
    return unused


def _check_accounted(source: TensorSource, sources: dict[str, Any], unused: dict[str, Any]) -> None:
    """Raise unless every source tensor is exactly once either bound or unused."""
    everything = set(source.names())
    accounted = set(sources) | set(unused)
    if everything != accounted or set(sources) & set(unused):
        missing = sorted(everything - accounted)[:10]
        extra = sorted(accounted - everything)[:10]
        raise PackageError(
            f"manifest does not account for the source exactly: unaccounted {missing}, "
            f"unknown {extra}"
        )


def manifest_initializers(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every graph's initializers in one mapping (a shared one appears once)."""
    out: dict[str, dict[str, Any]] = {}
    for graph in manifest["graphs"].values():
        out.update(graph["initializers"])
    return out


def _upgrade_v1(manifest: dict[str, Any]) -> dict[str, Any]:
    """A version-1 manifest (one decoder graph) in the version-2 layout, in memory."""
    manifest = dict(manifest)
    model_file = manifest.pop("model_file", DECODER_FILE)
    initializers = manifest.pop("initializers", {})
    manifest["graphs"] = {"decoder": {"file": model_file, "initializers": initializers}}
    for entry in manifest.get("sources", {}).values():
        entry.setdefault("graphs", ["decoder"])
    manifest.setdefault("shared", {})
    manifest["format_version"] = FORMAT_VERSION
    return manifest


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
    if manifest.get("format_version") == 1:
        return _upgrade_v1(manifest)
    if manifest.get("format_version") != FORMAT_VERSION:
        raise PackageError(
            f"{path}: manifest format version {manifest.get('format_version')} is not supported "
            f"(this mobius reads version {FORMAT_VERSION}); use a matching mobius version"
        )
    return manifest
