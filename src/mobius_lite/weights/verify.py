"""Verify a package against its source checkpoint by re-reading both sides.

Two layers of checks:
- structure (`check_references`): every external-data reference of every graph file
  (subgraphs and Constant attributes included) names a regular file in the package (no links,
  no paths) and a range inside it of the right length; the data files are exactly those the
  graphs reference; the manifest agrees with each graph.
- content (`verify_package`): every bound source tensor is re-read from the checkpoint and
  compared with the bytes in the shard: the source's storage format gives the conversion, and
  its independent recomputation (byte-exact for identity and stack; a fresh cast for casts)
  is what the written bytes must equal. The source and written sha256 recorded at export are
  checked too, and every checkpoint tensor must be bound once or listed as unused.
Memory stays bounded: both sides are streamed chunk by chunk.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_lite.formats.part_catalog import part_of_parameter
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.source_kinds import layout_of, local_tensors
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import NameMap, SourceRef, as_ref
from mobius_lite.sources.quantized import QuantizedSource
from mobius_lite.weights.binding import slot_of, source_conversion
from mobius_lite.weights.external_data import ExternalRef, external_references
from mobius_lite.weights.manifest import manifest_initializers, read_manifest
from mobius_lite.weights.writer import DEFAULT_CHUNK_BYTES, iter_source_bytes


@dataclass
class VerifyReport:
    """The verdict on a package's weights: ok only if nothing mismatched."""

    package: Path
    source: str
    checked: int = 0
    bytes_compared: int = 0
    mismatches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def as_dict(self) -> dict[str, Any]:
        return {
            "package": str(self.package),
            "source": self.source,
            "ok": self.ok,
            "checked": self.checked,
            "bytes_compared": self.bytes_compared,
            "mismatches": list(self.mismatches),
        }


# --------------------------------------------------------------------------- structure
def _check_file(directory: Path, location: str) -> str | None:
    if not location or Path(location).name != location or location in (".", ".."):
        return f"external data location {location!r} is not a plain file name in the package"
    try:
        st = os.lstat(directory / location)
    except FileNotFoundError:
        return f"external data file {location} is missing"
    if stat.S_ISLNK(st.st_mode):
        return f"external data file {location} is a symbolic link (ORT refuses them)"
    if not stat.S_ISREG(st.st_mode):
        return f"external data file {location} is not a regular file"
    if st.st_nlink != 1:
        return f"external data file {location} has {st.st_nlink} hard links (ORT refuses them)"
    return None


def graph_references(directory: Path, manifest: dict[str, Any]) -> dict[str, list[ExternalRef]]:
    """Each graph's external references (role -> refs), read from its model file."""
    return {
        role: external_references(directory / graph["file"])
        for role, graph in manifest["graphs"].items()
    }


def check_references(directory: Path, manifest: dict[str, Any]) -> list[str]:
    """Structural problems of the package in `directory` (empty list when sound)."""
    directory = Path(directory)
    problems: list[str] = []
    per_graph = graph_references(directory, manifest)
    # A tensor shared by two graphs is one reference seen twice: count it once.
    refs = list(
        {(r.location, r.offset, r.name): r for rs in per_graph.values() for r in rs}.values()
    )
    files = manifest.get("files", {})
    data_files = {n for n, f in files.items() if f.get("role") == "external-data"}
    sizes: dict[str, int] = {}
    for location in sorted({r.location for r in refs}):
        problem = _check_file(directory, location)
        if problem:
            problems.append(problem)
        else:
            sizes[location] = (directory / location).stat().st_size
    referenced = {r.location for r in refs}
    for name in sorted(data_files - referenced):
        problems.append(f"data file {name} is listed in the manifest but no tensor references it")
    for name in sorted(referenced - data_files):
        problems.append(f"data file {name} is referenced by the model but not in the manifest")
    for name, size in sizes.items():
        if name in files and files[name]["bytes"] != size:
            problems.append(
                f"{name} has {size} bytes; the manifest recorded {files[name]['bytes']}"
            )

    spans: dict[str, list[tuple[int, int, str]]] = {}
    for ref in refs:
        if ref.length is None or ref.length != ref.expected_length:
            problems.append(
                f"{ref.name}: external length {ref.length} but {list(ref.dims)} of "
                f"{ir.DataType(ref.data_type).name} needs {ref.expected_length} bytes"
            )
            continue
        if ref.location in sizes and ref.offset + ref.length > sizes[ref.location]:
            problems.append(
                f"{ref.name}: range {ref.offset}+{ref.length} runs past the end of "
                f"{ref.location} ({sizes[ref.location]} bytes)"
            )
        spans.setdefault(ref.location, []).append((ref.offset, ref.offset + ref.length, ref.name))
    for location, ranges in spans.items():
        ranges.sort()
        for (_, end, first), (start, _, second) in zip(ranges, ranges[1:], strict=False):
            if start < end:
                problems.append(f"{first} and {second} overlap in {location}")

    for role, graph in manifest["graphs"].items():
        by_name = {r.name: r for r in per_graph[role]}
        initializers = graph["initializers"]
        model_file = graph["file"]
        for name, entry in initializers.items():
            ref = by_name.get(name)
            if ref is None:
                problems.append(
                    f"{name}: in the manifest but not an external tensor of {model_file}"
                )
            elif (ref.location, ref.offset, ref.length) != (
                entry["file"],
                entry["offset"],
                entry["length"],
            ):
                problems.append(
                    f"{name}: {model_file} says {ref.location}+{ref.offset}:{ref.length}, the "
                    f"manifest says {entry['file']}+{entry['offset']}:{entry['length']}"
                )
        for name in sorted(set(by_name) - set(initializers)):
            problems.append(f"{name}: external tensor of {model_file} missing from the manifest")
    return problems


def _part_targets(entry: dict[str, Any]) -> set[str]:
    """The initializers a source re-laid out into several parts feeds (empty otherwise)."""
    return {p["initializer"] for p in entry.get("parts", [])}


# --------------------------------------------------------------------------- content
def _pread_exact(fd: int, length: int, offset: int) -> bytes:
    data = os.pread(fd, length, offset)
    while len(data) < length:
        more = os.pread(fd, length - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def _first_difference(expected: bytes, actual: bytes) -> int:
    a = np.frombuffer(expected, dtype=np.uint8)
    b = np.frombuffer(actual, dtype=np.uint8)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class _Verifier:
    def __init__(
        self,
        directory: Path,
        manifest: dict[str, Any],
        source: TensorSource,
        report,
        names: NameMap | None = None,
    ):
        self.name_map = names
        self.directory = directory
        self.manifest = manifest
        self.source = source
        self.report: VerifyReport = report
        self.fds: dict[str, int] = {}
        self.names = set(source.names())
        self.refs = {
            (role, r.name): r
            for role, refs in graph_references(directory, manifest).items()
            for r in refs
        }

    def fd(self, location: str) -> int | None:
        """An open descriptor, or None for a file that cannot be read (reported already)."""
        if location not in self.fds:
            try:
                self.fds[location] = os.open(self.directory / location, os.O_RDONLY)
            except OSError:
                self.fds[location] = -1
        fd = self.fds[location]
        return None if fd < 0 else fd

    def close(self) -> None:
        for fd in self.fds.values():
            if fd >= 0:
                os.close(fd)

    def coverage(self) -> None:
        sources = self.manifest["sources"]
        unused = self.manifest["unused"]
        names = self.names
        for name in sorted(names - set(sources) - set(unused)):
            self.report.mismatches.append(
                f"{name}: in the checkpoint but neither bound nor listed as unused"
            )
        for name in sorted((set(sources) | set(unused)) - names):
            self.report.mismatches.append(f"{name}: in the manifest but not in the checkpoint")
        for name in sorted(set(sources) & set(unused)):
            self.report.mismatches.append(f"{name}: both bound and listed as unused")
        seen: dict[str, str] = {}
        for target, entry in manifest_initializers(self.manifest).items():
            for name in entry["sources"]:
                parts = _part_targets(sources.get(name, {}))
                if name in seen and target not in parts:
                    self.report.mismatches.append(
                        f"{name}: bound twice ({seen[name]} and {target})"
                    )
                seen[name] = target
                if sources.get(name, {}).get("initializer") != target and target not in parts:
                    self.report.mismatches.append(
                        f"{name}: manifest entries disagree on its initializer"
                    )

    def segment(self, role: str, target: str, name: str, progress) -> None:
        """Compare one source tensor with its slice of the written initializer."""
        entry = self.manifest["sources"][name]
        ref = self.refs.get((role, target))
        if ref is None:
            self.report.mismatches.append(f"{target}: not an external tensor of the model")
            return
        if name not in self.names:
            return  # reported by coverage()
        info = self.source.info(name)
        if info.storage.name != entry["dtype"] or list(info.shape) != entry["shape"]:
            self.report.mismatches.append(
                f"{name}: checkpoint has {info.storage.name} {list(info.shape)}, the package was "
                f"made from {entry['dtype']} {entry['shape']}"
            )
            return
        # The source's storage format (and the name map's layout) says how its bytes become
        # the initializer's.
        conversion = self.conversion(target, name, ref)
        written = entry["written"]
        for part in entry.get("parts", []):
            if part["initializer"] == target:
                written = part["written"]
        fd = self.fd(ref.location)
        if fd is None:
            return  # the missing or unreadable file is reported by check_references
        position = ref.offset + written["offset"]
        src_hash, out_hash = hashlib.sha256(), hashlib.sha256()
        consumed = 0
        problem = None
        chunks = iter_source_bytes(
            self.source, name, DEFAULT_CHUNK_BYTES, unit_bytes=conversion.unit_bytes
        )
        for raw in chunks:
            src_hash.update(raw)
            expected = conversion.recompute(raw)
            actual = _pread_exact(fd, len(expected), position + consumed)
            out_hash.update(actual)
            if problem is None and actual != expected:
                at = _first_difference(expected, actual)
                problem = (
                    f"{target} (from {name}, {entry['transform']}): written bytes differ from "
                    f"the source at byte {written['offset'] + consumed + at} of the initializer "
                    f"({ref.location} offset {position + consumed + at})"
                )
            consumed += len(expected)
            self.report.bytes_compared += len(expected)
            progress.update(len(expected))
        self.report.checked += 1
        if problem:
            self.report.mismatches.append(problem)
        if consumed != written["length"]:
            self.report.mismatches.append(
                f"{name}: becomes {consumed} bytes, the manifest recorded {written['length']}"
            )
        if src_hash.hexdigest() != entry["sha256"]:
            self.report.mismatches.append(
                f"{name}: source bytes changed since export (sha256 differs from the manifest)"
            )
        if problem is None and out_hash.hexdigest() != written["sha256"]:
            self.report.mismatches.append(f"{target} (from {name}): written sha256 differs")

    def conversion(self, target: str, name: str, ref: ExternalRef) -> Any:
        """The conversion the export used for `name` -> `target`: the storage's (into the
        re-layout part the target holds, formats/part_catalog.py), wrapped by the name map's
        layout for that pair when there is one (a row permutation)."""
        info = self.source.info(name)
        dtype = ir.DataType(ref.data_type).numpy()
        part = part_of_parameter(target)
        slot = target if part is None else slot_of(target, part)
        if self.name_map is not None:
            for candidate in map(as_ref, self.name_map.alternatives(slot, tuple(ref.dims))):
                if name in candidate.names:
                    return source_conversion(candidate, info, dtype, part)
        return source_conversion(SourceRef((name,)), info, dtype, part)

    def constant(self, role: str, target: str, entry: dict[str, Any]) -> None:
        ref = self.refs.get((role, target))
        if ref is None or ref.length is None:
            return  # reported by check_references
        fd = self.fd(ref.location)
        if fd is None:
            return
        data = _pread_exact(fd, ref.length, ref.offset)
        if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
            self.report.mismatches.append(f"{target} (constant): written sha256 differs")
        self.report.bytes_compared += len(data)


def quantized_at_export(manifest: dict[str, Any]) -> dict[str, Recipe]:
    """The recipe of every source tensor the export quantized (name -> Recipe)."""
    return {
        name: Recipe.from_record(entry["quantize"])
        for name, entry in manifest["sources"].items()
        if "quantize" in entry
    }


def verify_package(
    package_dir: Path | str,
    source: Path | str | TensorSource,
    *,
    manifest: dict[str, Any] | None = None,
    quiet: bool = True,
    names: NameMap | None = None,
) -> VerifyReport:
    """Re-read the package and its source checkpoint and compare every binding.

    `source` is a checkpoint directory / .safetensors file, a .gguf file, or any TensorSource.
    `manifest` may be given for a package whose manifest.json is not written yet (the staging
    check). `names` is the source's name map; by default its source kind's (the one that
    says how a layout changes bytes, e.g. a GGUF's row permutations).
    """
    from tqdm import tqdm

    package_dir = Path(package_dir)
    if manifest is None:
        manifest = read_manifest(package_dir)
    if isinstance(source, (str, Path)):
        label = str(source)
        source = local_tensors(source)
    else:
        label = type(source).__name__
    if names is None:
        names = layout_of(source).names
    recipes = quantized_at_export(manifest)
    if recipes:  # quantize the checkpoint's tensors again, as the manifest recorded them
        present = set(source.names())  # an absent one is reported by the coverage check
        recipes = {name: recipe for name, recipe in recipes.items() if name in present}
        source = QuantizedSource(source, recipes)
    report = VerifyReport(package=package_dir, source=label)
    report.mismatches.extend(check_references(package_dir, manifest))
    verifier = _Verifier(package_dir, manifest, source, report, names)
    total = sum(e["length"] for e in manifest_initializers(manifest).values())
    try:
        verifier.coverage()
        with tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="verify",
            disable=quiet,
            mininterval=0.5,
        ) as progress:
            done: set[tuple[str, int]] = set()  # a shared tensor is compared once
            for role, graph in manifest["graphs"].items():
                for target, entry in graph["initializers"].items():
                    if (entry["file"], entry["offset"]) in done:
                        continue
                    done.add((entry["file"], entry["offset"]))
                    if entry["transform"] == "constant":
                        verifier.constant(role, target, entry)
                        continue
                    for name in entry["sources"]:
                        if name in manifest["sources"]:
                            verifier.segment(role, target, name, progress)
    finally:
        verifier.close()
    return report
