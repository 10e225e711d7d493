"""qualify's `--overwrite`: an earlier qualify output is replaced only by a finished run.

Like `build --overwrite`, a non-empty destination is replaced only when it is what the command
writes (here: a qualify output, with report.json) and only at the end: the run writes into a
hidden sibling (`.<name>.partial-*`), which is swapped in when the run returns; a run that
fails or is interrupted leaves the old output as it was and removes its sibling."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mobius_lite.errors import PackageError
from mobius_lite.evaluation.qualify_report import REPORT_FILE


def is_used(directory: Path) -> bool:
    """An existing directory with something in it (or an existing non-directory)."""
    return directory.exists() and (not directory.is_dir() or any(directory.iterdir()))


def check_replaceable(directory: Path) -> None:
    """Raise PackageError, before anything runs, unless `directory` is an earlier qualify
    output that a rename can replace."""
    if not directory.is_dir() or not (directory / REPORT_FILE).is_file():
        raise PackageError(
            f"{directory} is not a qualify output (no {REPORT_FILE}); refusing to overwrite it: "
            "choose another output directory"
        )
    here = Path.cwd().resolve()
    if directory.resolve() in (here, *here.parents):
        raise PackageError(
            f"{directory} is the current directory or holds it and cannot be replaced; "
            "choose another output directory"
        )


@contextlib.contextmanager
def replacing(directory: Path) -> Iterator[Path]:
    """A new empty sibling of `directory` to write the run into; it replaces `directory` when
    the body returns, and is removed when the body raises."""
    check_replaceable(directory)
    parent = directory.absolute().parent
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.partial-", dir=parent))
    try:
        yield staging
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old-", dir=parent))
        directory.rename(old / directory.name)
        staging.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
