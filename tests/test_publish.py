"""Atomic publish: refusal to overwrite, replacement only at the end, and SIGKILL of a real
export subprocess at several points leaving the destination absent, untouched or complete,
with no leftover that looks like a package."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mobius_lite
from mobius_lite.errors import PackageError
from mobius_lite.weights import publish as publish_module
from mobius_lite.weights.manifest import read_manifest
from mobius_lite.weights.verify import verify_package

CHILD = textwrap.dedent(
    """\
    import sys, time
    from pathlib import Path
    import mobius_lite
    from mobius_lite import package as package_module
    from mobius_lite.weights import publish as publish_module, writer as writer_module

    checkpoint, destination, stage, overwrite = sys.argv[1:5]

    def pause_before(module, attr, after_calls=1):
        original = getattr(module, attr)
        calls = 0
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == after_calls:
                print("READY", stage, flush=True)
                time.sleep(3600)
            return original(*args, **kwargs)
        setattr(module, attr, wrapper)

    if stage == "mid-data":
        pause_before(writer_module, "iter_source_bytes", after_calls=15)
    elif stage == "before-manifest":
        pause_before(package_module, "write_manifest")
    elif stage == "before-publish":
        pause_before(package_module, "publish")
    elif stage == "after-swap":
        pause_before(publish_module, "_discard")
    package = mobius_lite.build(checkpoint, dtype="f32")
    package.save(destination, shard_size="8KB", overwrite=overwrite == "1", quiet=True)
    print("DONE", flush=True)
    """
)


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(["mamba", "moe", "attention", "mlp"]).path


def tree(directory: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under `directory`."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def leftovers(parent: Path, destination: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name != destination.name]


def assert_no_fake_package(parent: Path, destination: Path) -> None:
    for path in leftovers(parent, destination):
        assert path.name.startswith("."), path
        assert not (path / "manifest.json").exists(), path
        with pytest.raises(PackageError):
            read_manifest(path)


# --------------------------------------------------------------------------- refusal
def test_refuses_non_empty_destination_before_writing(checkpoint: Path, tmp_path: Path) -> None:
    parent = tmp_path / "out"
    destination = parent / "pkg"
    destination.mkdir(parents=True)
    (destination / "keep.txt").write_text("precious")
    package = mobius_lite.build(checkpoint, dtype="f32")
    with pytest.raises(PackageError, match="not empty"):
        package.save(destination, quiet=True)
    # Even --overwrite will not replace something that is not a package.
    with pytest.raises(PackageError, match="does not look like a package"):
        package.save(destination, overwrite=True, quiet=True)
    assert tree(destination) == {"keep.txt": hashlib.sha256(b"precious").hexdigest()}
    assert leftovers(parent, destination) == []
    (destination / "keep.txt").unlink()  # an empty directory is fine
    package.save(destination, quiet=True)
    assert verify_package(destination, checkpoint).ok


def test_refuses_a_file_destination(checkpoint: Path, tmp_path: Path) -> None:
    target = tmp_path / "pkg"
    target.write_text("x")
    with pytest.raises(PackageError, match="not a directory"):
        mobius_lite.build(checkpoint, dtype="f32").save(target, quiet=True, overwrite=True)
    assert target.read_text() == "x"


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_overwrite_replaces_a_package(
    checkpoint: Path, tmp_path: Path, monkeypatch, exchange: bool
) -> None:
    if not exchange:
        monkeypatch.setattr(publish_module, "_exchange", lambda a, b: False)
    parent = tmp_path / "out"
    destination = parent / "pkg"
    package = mobius_lite.build(checkpoint, dtype="f32")
    package.save(destination, quiet=True)
    with pytest.raises(PackageError, match="not empty"):
        package.save(destination, quiet=True, shard_size="8KB")
    package.save(destination, quiet=True, shard_size="8KB", overwrite=True)
    assert len(list(destination.glob("model.onnx-*-of-*.data"))) > 1
    assert not (destination / "model.onnx.data").exists()
    assert verify_package(destination, checkpoint).ok
    assert leftovers(parent, destination) == []


# --------------------------------------------------------------------------- SIGKILL
def run_until(script: Path, checkpoint: Path, destination: Path, stage: str, overwrite: bool):
    """Start an export subprocess that stops at `stage`; return it once it got there."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(checkpoint),
            str(destination),
            stage,
            str(int(overwrite)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise AssertionError(f"export did not reach {stage}: {line!r} {proc.stderr.read()}")
    return proc


STAGES = ["mid-data", "before-manifest", "before-publish"]


@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
def test_sigkill_leaves_destination_absent_or_untouched(
    checkpoint: Path, tmp_path: Path, overwrite: bool
) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    parent = tmp_path / "out"
    destination = parent / "pkg"
    parent.mkdir()
    if overwrite:
        mobius_lite.build(checkpoint, dtype="f32").save(destination, quiet=True)
        before = tree(destination)
    for stage in STAGES:
        proc = run_until(script, checkpoint, destination, stage, overwrite)
        staging = [p for p in leftovers(parent, destination) if ".partial-" in p.name]
        assert len(staging) == 1
        if stage == "mid-data":  # killed while shards are being written
            assert list(staging[0].glob("model.onnx-*.data"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if overwrite:
            assert tree(destination) == before, stage
        else:
            assert not destination.exists(), stage
        assert_no_fake_package(parent, destination)
    # The next export sweeps the dead processes' staging directories and publishes.
    mobius_lite.build(checkpoint, dtype="f32").save(destination, quiet=True, overwrite=overwrite)
    assert leftovers(parent, destination) == []
    assert verify_package(destination, checkpoint).ok


def test_sigkill_after_swap_leaves_the_new_package(checkpoint: Path, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    parent = tmp_path / "out"
    destination = parent / "pkg"
    mobius_lite.build(checkpoint, dtype="f32").save(destination, quiet=True)
    assert (destination / "model.onnx.data").exists()
    proc = run_until(script, checkpoint, destination, "after-swap", True)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # The new package (8 KB shards) is in place and complete; the old one's remains are
    # hidden and carry no manifest.
    assert not (destination / "model.onnx.data").exists()
    assert len(list(destination.glob("model.onnx-*-of-*.data"))) > 1
    assert verify_package(destination, checkpoint).ok
    rest = leftovers(parent, destination)
    assert sorted(p.name.split("-")[0] for p in rest) == [".pkg.lock", ".pkg.partial"]
    assert_no_fake_package(parent, destination)
    # The next export removes them (their owner's lock is free).
    mobius_lite.build(checkpoint, dtype="f32").save(destination, quiet=True, overwrite=True)
    assert leftovers(parent, destination) == []


def test_sweep_spares_a_running_export_and_removes_an_ended_one(tmp_path: Path) -> None:
    """Liveness is the flock the export holds, not the pid (which may be another namespace's
    or reused): a held lock protects the staging directory, a free one marks it stale."""
    destination = tmp_path / "pkg"
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process here
    staging = tmp_path / f".pkg.partial-{dead_pid}-00ff"
    staging.mkdir()
    lock = tmp_path / f".pkg.lock-{dead_pid}-00ff"
    with open(lock, "w") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        assert publish_module.sweep_stale(destination) == []
        assert staging.is_dir() and lock.exists()
    # The lock is free once its holder is gone: both are removed.
    assert sorted(publish_module.sweep_stale(destination)) == sorted([staging, lock])
    assert list(tmp_path.iterdir()) == []
