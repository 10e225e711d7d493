"""What qualify's reference reads from its source: the source kind, its config, and a check
that it is the model the package was built from.

The source's kind comes from the registry (source_kinds.local_kind), and so do its config
reader (a GGUF carries only part of a config) and the dense checkpoint transformers loads
(`SourceKind.reference`, evaluation/dense_reference.py).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.errors import ConfigError
from mobius_lite.source_kinds import SourceKind, local_kind

MAX_DIFFERENCES = 3


def source_kind(source: Path) -> SourceKind:
    """The kind of the local source qualify reads; ConfigError for anything qualify cannot
    read as a source (neither a checkpoint directory nor a file a source kind claims)."""
    kind = local_kind(source)
    if kind.claims_name(source, None):
        if not source.exists():
            raise ConfigError(f"--source {source}: no such {kind.name} file")
        return kind
    if not source.is_dir():
        raise ConfigError(
            f"--source {source}: not a checkpoint directory or .gguf file; pass the checkpoint "
            "directory or the GGUF file the package was built from"
        )
    return kind


def source_config(source: Path, kind: SourceKind, package_raw: dict[str, Any]) -> dict[str, Any]:
    """The source's config dict. A source that carries only part of a config (a GGUF) takes
    the fields it lacks from the package's config.json, every field it has cross-checked
    against it."""
    try:
        return kind.local_config(source, package_raw)
    except ConfigError as exc:
        message = str(exc).replace("config.json gives", "the package's config.json gives")
        raise ConfigError(
            f"--source {source} is not the model this package was built from: {message}; pass "
            f"the {kind.name} source the package was exported from"
        ) from None


def spec_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """`field.path a vs b` for every leaf field of two (nested) dataclasses that differs."""
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        out: list[str] = []
        for item in dataclasses.fields(a):
            if item.compare:
                name = f"{path}.{item.name}" if path else item.name
                out += spec_differences(getattr(a, item.name), getattr(b, item.name), name)
        return out
    if a == b:
        return []
    if dataclasses.is_dataclass(a) or dataclasses.is_dataclass(b):  # e.g. another mixer kind
        return [f"{path} {type(a).__name__} vs {type(b).__name__}"]
    shown = [x.value if hasattr(x, "value") else x for x in (a, b)]
    return [f"{path} {shown[0]} vs {shown[1]}"]


def check_same_model(package: NemotronHConfig, source: NemotronHConfig, where: Path) -> None:
    """The source must describe the same decoder as the package, or nothing is comparable; the
    error names each differing field with both values."""
    problems = []
    for name in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if getattr(package, name) != getattr(source, name):
            problems.append(f"{name} {getattr(package, name)} vs {getattr(source, name)}")
    if not problems:
        for a, b in zip(package.layers, source.layers, strict=True):
            problems += [f"layer {a.index}: {d}" for d in spec_differences(a, b)]
    if problems:
        shown = problems[:MAX_DIFFERENCES]
        if len(problems) > MAX_DIFFERENCES:
            shown.append(f"{len(problems) - MAX_DIFFERENCES} more")
        raise ConfigError(
            f"--source {where} is not the model this package was built from (package vs "
            f"source: {'; '.join(shown)}); pass the checkpoint, or the .gguf file, the package "
            "was exported from"
        )
