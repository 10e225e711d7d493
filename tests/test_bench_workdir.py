"""The benchmarks delete their --workdir when they end: only a folder they made themselves.

Regression: bench_gguf.py and five other scripts removed whatever --workdir named, at start
and at the end, so a mistyped path (or another run's folder) lost its files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mobius_lite.bench.workdir import claim_workdir, release_workdir


def test_a_foreign_folder_is_refused_and_kept(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    with pytest.raises(SystemExit, match="non-empty folder that no benchmark created"):
        claim_workdir(tmp_path)
    release_workdir(tmp_path)  # not marked: left alone
    assert precious.read_text() == "keep me"


def test_a_benchmark_folder_is_emptied_reused_and_removed(tmp_path: Path) -> None:
    work = claim_workdir(tmp_path / "work")
    (work / "model.gguf").write_bytes(b"x")
    assert claim_workdir(work, fresh=False) == work and (work / "model.gguf").is_file()
    claim_workdir(work)  # a fresh run empties its own folder
    assert not (work / "model.gguf").exists()
    release_workdir(work)
    assert not work.exists()
    assert claim_workdir(tmp_path / "empty").is_dir()  # a new or empty folder is fine
