"""Which checkpoint a package is checked against (verify, qualify)."""

from __future__ import annotations

import json
from pathlib import Path

from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.layout import CONFIG_FILE, MANIFEST_FILE
from mobius_lite.source_kinds import resolve_source
from mobius_lite.sources.hub import ResolvedCheckpoint


def source_for_package(
    package_dir: str | Path, source: str | Path | None = None, revision: str | None = None
) -> ResolvedCheckpoint:
    """`source` when given (a directory, or a hub id at --revision or its registry pin);
    otherwise the model and commit recorded in the package's manifest.json at export time."""
    if not (Path(package_dir) / MANIFEST_FILE).is_file():
        looks_like = (
            " (it looks like a checkpoint: export it with `mobius build --model` first)"
            if (Path(package_dir) / CONFIG_FILE).is_file()
            else ""
        )
        raise PackageError(
            f"{package_dir} is not a mobius package: it has no {MANIFEST_FILE}{looks_like}; "
            "give the package directory written by `mobius build`, and the checkpoint with "
            "--source"
        )
    if source is None:
        manifest = Path(package_dir) / MANIFEST_FILE
        try:
            record = json.loads(manifest.read_text()).get("source") or {}
        except (OSError, json.JSONDecodeError):
            record = {}
        if not record.get("model"):
            raise ConfigError(
                f"{manifest} records no source checkpoint (packages built with "
                "build_from_module have none); give the checkpoint (--source CHECKPOINT; "
                "source=... in Python)"
            )
        source, revision = record["model"], revision or record.get("revision")
    return resolve_source(source, revision)
