"""A package is the same bytes on every build of the same source (reproducible builds).

Each build runs in its own interpreter with a different PYTHONHASHSEED, so anything that
follows set or dict-of-hash order into a written file shows up as a byte difference. The
multi-graph packages (decoder + MTP head, Omni's five graphs) declare shared tensors, the
place where set order once leaked into manifest.json.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mobius_lite.demo.write import write_demo

BUILD = "from mobius_lite.cli.main import main; raise SystemExit(main())"


def _build(source: Path, out: Path, seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    command = [sys.executable, "-c", BUILD, "build", "--model", str(source), "--output", str(out)]
    subprocess.run([*command, "--quiet"], env=env, check=True)
    return {
        str(path.relative_to(out)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }


@pytest.mark.parametrize("kind", ["mtp", "omni"])
def test_two_builds_write_the_same_bytes(kind: str, tmp_path: Path) -> None:
    source = write_demo(kind, tmp_path / "checkpoint")
    first = _build(source, tmp_path / "first", "1")
    second = _build(source, tmp_path / "second", "2")
    assert "manifest.json" in first
    assert first == second
