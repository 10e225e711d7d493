"""SIGINT and SIGTERM sent to a real `mobius build` subprocess in the middle of writing the
weights, and an output directory that a rename cannot replace (a mount point).

Before: SIGTERM left the hidden staging directory (the package's full size, eventually) and its
lock until the next build; SIGINT printed a KeyboardInterrupt traceback; an empty mount point as
--output failed with EBUSY only after the whole export. Now: one line, exit status 2, no
staging directory, no lock, the old output untouched; the mount point is refused first.

The child pauses deterministically: it wraps the writer's per-tensor read so that the tenth
tensor waits (shards already on disk) after printing READY; the test sends the signal only then.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mobius_lite.cli.main import main
from reference_fixtures.nemotron_reference import make_reference

CHILD = textwrap.dedent(
    """\
    import sys, time
    from mobius_lite.cli.main import main
    from mobius_lite.sources import SafetensorsCheckpoint
    from mobius_lite.weights import writer

    mode = sys.argv[1]
    calls = 0
    original = writer.iter_source_bytes

    def paused(*args, **kwargs):
        global calls
        calls += 1
        if calls == 10:
            print("READY", flush=True)
            # short sleeps: a signal that lands between the print and a sleep's syscall runs
            # its handler at the next loop turn (one long sleep would hold it for an hour)
            for _ in range(36000):
                time.sleep(0.1)
        return original(*args, **kwargs)

    def refuse(self, name):
        raise AssertionError(f"tensor data of {name} was read before the error")

    if mode == "pause":
        writer.iter_source_bytes = paused
    else:  # the destination must be refused before any tensor data is read
        SafetensorsCheckpoint.read = refuse
        SafetensorsCheckpoint.byte_range = refuse
    sys.exit(main(sys.argv[2:]))
    """
)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("signals") / "checkpoint"
    make_reference(dict(layers_block_type=["mamba", "moe", "attention", "mlp"])).save_pretrained(
        directory
    )
    return directory


def tree(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def child(tmp_path: Path, mode: str, *args: str) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(script), mode, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.parametrize("overwrite", [False, True], ids=["fresh", "overwrite"])
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_signal_mid_write_leaves_nothing_behind(name, overwrite, checkpoint, tmp_path) -> None:
    parent = tmp_path / "out"
    parent.mkdir()
    destination = parent / "pkg"
    before = None
    if overwrite:
        assert main(["build", "--model", str(checkpoint), "--output", str(destination), "-q"]) == 0
        before = tree(destination)
    args = ["build", "--model", str(checkpoint), "--output", str(destination), "-q"]
    args += ["--shard-size", "8KB"] + (["--overwrite"] if overwrite else [])
    proc = child(tmp_path, "pause", *args)
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise AssertionError(f"the build did not reach the pause: {line!r} {proc.stderr.read()}")
    staging = [p for p in parent.iterdir() if ".partial-" in p.name]
    assert len(staging) == 1 and list(staging[0].glob("model.onnx-*.data"))  # mid-write
    proc.send_signal(getattr(signal, name))
    _, err = proc.communicate()
    assert proc.returncode == 2, err
    assert err.startswith(f"mobius build: interrupted by {name}; ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    left = sorted(p.name for p in parent.iterdir())
    if overwrite:
        assert left == ["pkg"] and tree(destination) == before
    else:
        assert left == []


def mount_tmpfs(directory: Path) -> list[str]:
    """A command prefix that runs its command with a fresh tmpfs mounted on `directory`, in a
    private mount namespace (unshare), or skip where this machine cannot."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here: cannot make a mount point")
    prefix = [unshare, "-m"] if os.geteuid() == 0 else [unshare, "-rm"]
    probe = subprocess.run(
        [*prefix, "sh", "-c", f"mount -t tmpfs none '{directory}'"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount in a private namespace here: {probe.stderr!r}")
    return prefix


def test_mount_point_output_is_refused_before_any_read(checkpoint, tmp_path) -> None:
    destination = tmp_path / "out"
    destination.mkdir()
    prefix = mount_tmpfs(destination)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    build = [sys.executable, str(script), "refuse-reads", "build", "--model", str(checkpoint)]
    build += ["--output", str(destination), "-q"]
    command = f"mount -t tmpfs none '{destination}' && exec \"$@\""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [*prefix, "sh", "-c", command, "sh", *build], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("mobius build: error: ") and proc.stderr.count("\n") == 1
    assert "is a mount point" in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["child.py", "out"]
    assert list(destination.iterdir()) == []
