"""Free space for a package: checked before the first weight is read, and a disk that fills
anyway (another writer, a quota) said in one line naming the filesystem and the bytes still
needed, instead of an `OSError: [Errno 28]` traceback.

A package's weights are known to the byte before anything is written (the sum of its external
initializers); the graph files and small JSON files come on top, so the early check compares
the weights alone with the free space: it never refuses a package that fits, and the rare one
that passes and still does not fit ends in `no_space_error`.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from mobius_lite.errors import PackageError
from mobius_lite.sizes import human_bytes


def _existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _unescape(text: str) -> str:
    """/proc/self/mountinfo writes spaces and the like as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def filesystem_of(path: Path) -> str:
    """The filesystem holding `path`, for messages: "/dev/vda1 mounted at /work" (Linux, from
    /proc/self/mountinfo by device number), else the nearest mount point."""
    where = _existing(path)
    device = os.stat(where).st_dev
    wanted = f"{os.major(device)}:{os.minor(device)}"
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        lines = []
    best: tuple[str, str] | None = None
    for line in lines:
        fields = line.split()
        if len(fields) < 5 or fields[2] != wanted or " - " not in line:
            continue
        mount = _unescape(fields[4])
        source = _unescape(line.split(" - ", 1)[1].split()[1])
        inside = where == Path(mount) or Path(mount) in where.parents
        if inside and (best is None or len(mount) > len(best[0])):
            best = (mount, source)
    if best is not None:
        return f"{best[1]} mounted at {best[0]}"
    mount = where
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    return f"the filesystem mounted at {mount}"


def check_free_space(destination: Path, needed: int) -> None:
    """Raise PackageError when the filesystem that will hold `destination` (and its staging
    directory, a sibling) has less than `needed` bytes free."""
    where = _existing(destination.parent if destination.name else destination)
    free = shutil.disk_usage(where).free
    if free >= needed:
        return
    raise PackageError(
        f"not enough free space for {destination}: the package's weights need "
        f"{needed} bytes ({human_bytes(needed)}) and {filesystem_of(where)} has {free} bytes "
        f"({human_bytes(free)}) free; free {needed - free} bytes or more there, or choose an "
        "output on another disk; nothing was written"
    )


def written_bytes(directory: Path) -> int:
    """Bytes held by the files under `directory` (a staging directory before its removal)."""
    total = 0
    for root, _, files in os.walk(directory):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def no_space_error(destination: Path, needed: int, written: int) -> PackageError:
    """The one-line error for a disk that filled during the export (ENOSPC / EDQUOT)."""
    missing = max(needed - written, 1)
    return PackageError(
        f"{filesystem_of(destination)} filled up while writing {destination}: "
        f"{written} of about {needed} bytes were written, {missing} bytes "
        f"({human_bytes(missing)}) or more are still needed; free space there or choose an "
        "output on another disk. The unfinished export was removed"
    )
