"""A benchmark's scratch folder (--workdir): marked when a benchmark makes it, so a mistyped
path to someone's files is refused instead of deleted when the benchmark ends."""

from __future__ import annotations

import shutil
from pathlib import Path

# The file that marks a folder as a benchmark's own scratch workdir, which it may delete.
WORKDIR_MARK = ".mobius-benchmark-workdir"


def claim_workdir(path: Path, fresh: bool = True) -> Path:
    """Make `path` this benchmark's scratch folder, marked as such: created if missing,
    emptied first when `fresh` and a benchmark made it. A non-empty folder no benchmark made
    is refused (exit with one line), so a mistyped --workdir never deletes anyone's files."""
    if path.is_dir() and any(path.iterdir()) and not (path / WORKDIR_MARK).is_file():
        raise SystemExit(
            f"--workdir {path} is a non-empty folder that no benchmark created; give a new or "
            "empty folder (the benchmark deletes its workdir when it ends)"
        )
    if path.exists() and not path.is_dir():
        raise SystemExit(f"--workdir {path} is a file; give a new or empty folder")
    if fresh:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / WORKDIR_MARK).write_text("scratch folder of a mobius_lite benchmark\n")
    return path


def release_workdir(path: Path) -> None:
    """Delete a workdir that claim_workdir marked; anything else is left alone."""
    if (path / WORKDIR_MARK).is_file():
        shutil.rmtree(path, ignore_errors=True)
