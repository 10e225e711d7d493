"""Read a package directory before anything runs or checks it: manifest, graph files, data.

inspect, verify, generate, qualify and the runtime share this, so a package with a missing
graph, a missing or truncated data file, or a directory that is a checkpoint and not a package
is one PackageError that says so, raised before onnxruntime creates a session or any weight is
compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobius_lite.enums import GraphRole
from mobius_lite.errors import PackageError
from mobius_lite.layout import CONFIG_FILE, DECODER_FILE, MANIFEST_FILE
from mobius_lite.listing import format_names

SHOWN_PROBLEMS = 2


@dataclass(frozen=True)
class PackageFiles:
    """A package whose manifest was read and whose files were checked against it."""

    directory: Path
    manifest: dict[str, Any]
    problems: tuple[str, ...]

    @property
    def graphs(self) -> dict[str, Path]:
        """Graph role -> its model file, as the manifest lists them."""
        return {role: self.directory / g["file"] for role, g in self.manifest["graphs"].items()}

    def graph(self, role: GraphRole) -> Path:
        """The file of one graph; PackageError when the package has no such graph."""
        path = self.graphs.get(role.value)
        if path is None:
            raise PackageError(f"{self.directory} has no {role.value} graph ({role.file_name})")
        return path

    def raise_if_incomplete(self) -> PackageFiles:
        """PackageError naming the first problems, unless the package is complete."""
        if self.problems:
            raise incomplete_package(self.directory, self.problems)
        return self


def incomplete_package(directory: Path, problems: Sequence[str]) -> PackageError:
    """The one error for a package with missing, truncated or unreadable files."""
    shown = format_names(problems, SHOWN_PROBLEMS, separator="; ", more=" (and {} more problems)")
    return PackageError(
        f"{directory} is incomplete: {shown}"
        "; copy the whole package directory again or re-export it with mobius build"
    )


def not_a_package_hint(directory: Path) -> str | None:
    """What `directory` is when it is not a package: a checkpoint folder, or a .gguf file."""
    if directory.is_file() and directory.suffix == ".gguf":
        return (
            f"{directory} is a GGUF checkpoint, not a package; export it first: mobius build "
            f"--model {directory} --output {directory.with_suffix('')}-onnx"
        )
    if directory.is_dir() and (directory / CONFIG_FILE).is_file():
        weights = any(directory.glob("*.safetensors")) or any(directory.glob("*.gguf"))
        if weights and not (directory / DECODER_FILE).exists():
            return (
                f"{directory} is a checkpoint (config.json and weights), not a package; export "
                f"it first: mobius build --model {directory} --output {directory}-onnx, then "
                f"pass {directory}-onnx"
            )
    return None


def read_package(directory: str | Path) -> PackageFiles:
    """The manifest of `directory` and every structural problem of its files (missing or
    unreadable graphs; data files missing, truncated, linked or not as the manifest recorded).
    PackageError when `directory` is not a package at all."""
    from mobius_lite.weights.manifest import read_manifest
    from mobius_lite.weights.verify import check_references

    directory = Path(directory)
    hint = not_a_package_hint(directory)
    if hint:
        raise PackageError(hint)
    if not directory.is_dir():
        raise PackageError(f"{directory}: no such package directory")
    manifest = read_manifest(directory)
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict) or not graphs:
        raise PackageError(f"{directory / MANIFEST_FILE} lists no graphs; re-export the package")
    problems = []
    for graph in graphs.values():
        path = directory / graph["file"]
        if not path.is_file():
            problems.append(f"its graph file {graph['file']} is missing")
    if problems:
        return PackageFiles(directory, manifest, tuple(problems))
    try:
        problems = check_references(directory, manifest)
    except Exception:  # onnx raises DecodeError / OSError variants for a broken graph file
        problems = [_unreadable_graph(directory, [g["file"] for g in graphs.values()])]
    return PackageFiles(directory, manifest, tuple(problems))


def _unreadable_graph(directory: Path, files: list[str]) -> str:
    """Which graph file onnx cannot parse (only looked for once one could not be read)."""
    import onnx

    for name in files:
        try:
            onnx.load(str(directory / name), load_external_data=False)
        except Exception as exc:
            return f"its graph file {name} is not a readable ONNX model ({type(exc).__name__})"
    return "its graph files cannot be read together with the manifest"


def open_package(directory: str | Path) -> PackageFiles:
    """`read_package`, raising PackageError unless every file is there and complete."""
    return read_package(directory).raise_if_incomplete()
