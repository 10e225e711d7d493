"""Atomic publish: a package is built in a hidden sibling directory and renamed into place.

- The staging directory is `.<name>.partial-<pid>-<random>` next to the destination (same
  filesystem, so the final rename is atomic). Its manifest is written under a hidden pending
  name and becomes manifest.json only in the step before the directory rename, and hidden
  staging names are refused as packages, so a leftover is never taken for a package. The
  export holds an flock on a sibling `.<name>.lock-<pid>-<random>` file while it runs; the
  next export to the same destination removes the leftovers whose lock is free (their
  process ended, however it died).
- A non-empty destination is refused unless `overwrite`; with `overwrite` it must look like a
  package (manifest.json or model.onnx inside), and it is replaced only at the very end: on
  Linux by an atomic exchange (renameat2 RENAME_EXCHANGE), elsewhere by two renames.
- A SIGKILL at any moment leaves the destination absent, untouched, or the new complete package.
  SIGINT and SIGTERM (which the CLI turns into an exception) remove the staging directory and
  the lock on the way out; during the final renames they are deferred until the renames end.
- An existing destination that a rename cannot replace (a mount point; another user's
  directory in a sticky parent) is refused by the early check, before any tensor is read.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from secrets import token_hex

from mobius_lite.errors import PackageError
from mobius_lite.layout import DECODER_FILE, MANIFEST_FILE
from mobius_lite.weights.disk_space import check_free_space, no_space_error, written_bytes

# Inside a staging directory the manifest waits under this hidden name; publish() gives it its
# real name only immediately before the directory is renamed into place.
PENDING_MANIFEST = ".manifest.json.pending"
PACKAGE_MARKERS = (MANIFEST_FILE, DECODER_FILE)
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?:partial|old)-(?P<pid>\d+)-(?P<token>[0-9a-f]+)$")
_LOCK = re.compile(r"^\.(?P<name>.+)\.lock-(?P<pid>\d+)-(?P<token>[0-9a-f]+)$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def absolute(destination: str | Path) -> Path:
    """`destination` as an absolute, normalised path: "." / "./" / "" become the current
    directory's own path, whose parent holds the staging directory (a relative "." has no
    name, and its "parent" is itself: the staging directory would land inside it)."""
    return Path(os.path.abspath(os.fspath(destination) or "."))


def holds_cwd(destination: Path) -> bool:
    """True when `destination` is this process's working directory or one of its ancestors."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the working directory was removed
        return False
    target = destination.resolve()
    return cwd == target or target in cwd.parents


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(destination: Path) -> None:
    """Raise PackageError unless a package can be created beside `destination` (its staging
    directory is a sibling): the nearest existing ancestor must be a directory we can write."""
    ancestor = _nearest_existing(destination.parent)
    if not ancestor.is_dir():
        raise PackageError(
            f"cannot create {destination}: {ancestor} is a file, not a directory; choose an "
            "output path under a directory"
        )
    try:  # a probe, as permission bits do not tell (root, read-only mounts, ACLs)
        fd, probe = tempfile.mkstemp(prefix=".mobius-probe-", dir=ancestor)
    except OSError as exc:
        beside = (
            f" (the package is staged beside {destination}, in its parent)"
            if destination.exists()
            else ""
        )
        raise PackageError(
            f"cannot write in {ancestor}{beside} ({exc.strerror or exc}); choose an output "
            "directory you can write to"
        ) from None
    os.close(fd)
    os.unlink(probe)


def check_destination(destination: str | Path, overwrite: bool) -> None:
    """Raise PackageError now (before any large read or write) if `destination` is unusable."""
    destination = absolute(destination)
    check_writable(destination)
    if destination.is_symlink():
        raise PackageError(f"{destination} is a symbolic link; give the real directory path")
    if not destination.exists():
        return
    if not destination.is_dir():
        raise PackageError(
            f"{destination} is a file, not a directory; choose a directory path for the package"
        )
    check_replaceable(destination)
    if not any(destination.iterdir()):
        return
    if not overwrite:
        raise PackageError(
            f"{destination} exists and is not empty; choose another output, or allow replacing "
            "the package there (overwrite=True / --overwrite)"
        )
    if not any((destination / m).is_file() for m in PACKAGE_MARKERS):
        raise PackageError(
            f"{destination} is not empty and does not look like a package (no manifest.json or "
            "model.onnx); refusing to replace it even with overwrite. Remove it yourself or "
            "choose another output"
        )
    if holds_cwd(destination):
        raise PackageError(
            f"{destination} is the current directory (or holds it), so the package there cannot "
            "be replaced by the finished one; run the export from outside it (e.g. from "
            f"{destination.parent}, with the output {destination.name})"
        )


def _mount_points() -> set[str]:
    """Every mount point of this process (Linux /proc/self/mountinfo; empty elsewhere)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return set()
    # field 5 is the mount point, with spaces and the like written as octal escapes
    return {
        re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), line.split()[4])
        for line in lines
        if len(line.split()) > 4
    }


def check_replaceable(destination: Path) -> None:
    """Raise PackageError when the existing directory `destination` cannot be replaced by a
    rename from its parent (the way every package is published): a mount point (the rename
    fails with EBUSY or EXDEV), or, in a sticky directory, another user's directory."""
    resolved = destination.resolve()
    if os.path.ismount(resolved) or str(resolved) in _mount_points():
        raise PackageError(
            f"{destination} is a mount point, which a finished package cannot be renamed onto; "
            f"choose a directory inside it (e.g. {destination / 'package'}) or another output"
        )
    parent = resolved.parent.stat()
    own = resolved.stat()
    euid = os.geteuid()
    if parent.st_mode & stat.S_ISVTX and euid not in (0, own.st_uid, parent.st_uid):
        raise PackageError(
            f"{destination} belongs to another user in the sticky directory {resolved.parent}, "
            "so it cannot be replaced; choose another output"
        )


def is_staging_name(name: str) -> bool:
    """True for the hidden names of staging and replaced-package directories."""
    return _STAGING.match(name) is not None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _lock_path(parent: Path, name: str, pid: str | int, token: str) -> Path:
    return parent / f".{name}.lock-{pid}-{token}"


def _owner_gone(lock: Path, pid: int) -> bool:
    """True when the export that owns `lock` has ended (it holds an flock while it runs; the
    kernel drops it however the process dies). Without a lock file, the pid decides."""
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        return not _pid_alive(pid)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def sweep_stale(destination: Path) -> list[Path]:
    """Remove the staging/old directories (and lock files) of ended exports to `destination`."""
    removed: list[Path] = []
    parent = destination.parent
    if not parent.is_dir():
        return removed
    for entry in sorted(parent.iterdir()):
        match = _STAGING.match(entry.name)
        if not match or match["name"] != destination.name:
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue
        lock = _lock_path(parent, match["name"], match["pid"], match["token"])
        if _owner_gone(lock, int(match["pid"])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    for entry in sorted(parent.iterdir()):
        match = _LOCK.match(entry.name)
        if not match or match["name"] != destination.name or not entry.is_file():
            continue
        if _owner_gone(entry, int(match["pid"])):
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
            removed.append(entry)
    return removed


@contextlib.contextmanager
def staging_directory(destination: str | Path, needed: int = 0) -> Iterator[Path]:
    """A fresh hidden sibling of `destination`, locked while this export runs; removed if the
    block raises. `needed`: the bytes the package's weights take, checked against the free
    space first; a disk that fills anyway (ENOSPC, EDQUOT) becomes one PackageError naming
    the filesystem and the bytes still needed."""
    destination = absolute(destination)
    check_free_space(destination, needed)
    parent = destination.parent
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(destination)
    pid, token = os.getpid(), token_hex(4)
    lock = _lock_path(parent, destination.name, pid, token)
    fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = parent / f".{destination.name}.partial-{pid}-{token}"
        path.mkdir()
        try:
            yield path
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                shutil.rmtree(path, ignore_errors=True)
                raise
            written = written_bytes(path)
            shutil.rmtree(path, ignore_errors=True)
            raise no_space_error(destination, needed, written) from None
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)


def fsync_directory(path: Path) -> None:
    """Make entries created or renamed inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where the platform cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    rc = renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _disarm(old: Path) -> None:
    """Unlink a replaced package's manifest first, so that its remains never look like one."""
    with contextlib.suppress(FileNotFoundError):
        (old / MANIFEST_FILE).unlink()


def _discard(old: Path) -> None:
    """Remove a replaced (already disarmed) package."""
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive inside the block take effect when it ends, so the
    renames that put a package in place are never cut between them (main thread only:
    Python runs signal handlers there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous = {
        number: signal.signal(number, lambda signum, frame: arrived.append(signum))
        for number in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        if arrived:
            handler = previous[arrived[0]]
            if callable(handler):
                handler(arrived[0], None)
            elif handler in (signal.SIG_DFL, None):
                signal.raise_signal(arrived[0])


def publish(staging: Path, destination: str | Path, overwrite: bool) -> Path:
    """Move the complete package in `staging` to `destination` in one atomic step.

    A SIGINT / SIGTERM deferred during the renames takes effect after them: the exception it
    raises (KeyboardInterrupt) then carries `published` (the destination, now complete), so a
    caller can tell that the package is in place although it was interrupted."""
    destination = absolute(destination)
    published = None
    try:
        with signals_deferred():
            published = _publish(staging, destination, overwrite)
    except KeyboardInterrupt as exc:
        if published is not None:
            exc.published = published  # type: ignore[attr-defined]
        raise
    return published


def _move_into(staging: Path, destination: Path) -> None:
    """Publish into the empty working directory itself (`--output .`), which cannot be
    renamed without leaving the shell that started the export in a removed directory: each
    file is renamed into it, the manifest last, so a package is never seen without one."""
    entries = sorted(p for p in staging.iterdir() if p.name != MANIFEST_FILE)
    for entry in [*entries, staging / MANIFEST_FILE]:
        os.rename(entry, destination / entry.name)
    fsync_directory(destination)
    staging.rmdir()


def _replace(staging: Path, destination: Path) -> None:
    """Put the package in `staging` in the place of the package at `destination`."""
    if _exchange(staging, destination):
        old = staging  # after the swap the staging name holds the previous package
    else:
        # Two renames: between them the destination is briefly absent (never half-built).
        old = staging.with_name(staging.name.replace(".partial-", ".old-", 1))
        os.rename(destination, old)
        os.rename(staging, destination)
    _disarm(old)
    fsync_directory(destination.parent)
    _discard(old)


def _published_meanwhile(destination: Path) -> PackageError:
    return PackageError(
        f"another export published a package at {destination} while this one ran; it was kept "
        "and this export removed. Allow replacing it (overwrite=True / --overwrite) or choose "
        "another output"
    )


def _publish(staging: Path, destination: Path, overwrite: bool) -> Path:
    check_destination(destination, overwrite)  # again: something may have appeared meanwhile
    os.rename(staging / PENDING_MANIFEST, staging / MANIFEST_FILE)
    fsync_directory(staging)
    if destination.is_dir() and holds_cwd(destination):  # empty: check_destination said so
        _move_into(staging, destination)
    elif destination.exists() and any(destination.iterdir()):
        if not overwrite:  # it was empty or absent at the check just above
            raise _published_meanwhile(destination)
        _replace(staging, destination)
    else:
        # rename(2) replaces an empty directory atomically, and creates a missing one.
        try:
            os.rename(staging, destination)
        except OSError as exc:
            # another export to the same destination published since the check above
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            if not overwrite:
                raise _published_meanwhile(destination) from None
            _replace(staging, destination)  # the later of two overwriting exports wins
            return destination
        fsync_directory(destination.parent)
    return destination
