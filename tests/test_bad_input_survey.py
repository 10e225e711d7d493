"""The cases of issue 30's bad-input survey (docs/bad_inputs.md, tests/survey_bad_inputs.py)
that were fixed in the demo, qualify, inspect and the CLI's front end: each is one clear line
with exit status 2 (or the documented status), no traceback, nothing on disk lost. Each failed
on the code before the fix (traceback, silent acceptance, or a false exit status)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mobius_lite.cli import build_cmd
from mobius_lite.cli.main import main
from mobius_lite.demo import write_demo
from mobius_lite.errors import Interrupted


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The text demo checkpoint, its package and one qualify output of it."""
    root = tmp_path_factory.mktemp("survey")
    write_demo("text", root / "ckpt")
    assert main(["build", "--model", str(root / "ckpt"), "--output", str(root / "pkg"), "-q"]) == 0
    args = ["qualify", str(root / "pkg"), "--source", str(root / "ckpt"), "--steps", "1"]
    assert main([*args, "--output", str(root / "q1"), "-q"]) == 0
    return root


def _run(args: list[str], capsys) -> tuple[int, list[str]]:
    code = main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, [line for line in captured.err.splitlines() if line.strip()]


def _qualify(work: Path, *extra: str) -> list[str]:
    return ["qualify", str(work / "pkg"), "--source", str(work / "ckpt"), *extra]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--prompt", ""], "tokenizes to no tokens"),  # was an onnxruntime Reshape traceback
        (["--prompt-ids", ""], "--prompt-ids is empty"),  # was the default prompt, silently
    ],
)
def test_qualify_refuses_an_empty_prompt(work: Path, extra, expected, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    code, err = _run(_qualify(work, *extra, "--steps", "1", "--output", str(out)), capsys)
    assert code == 2 and len(err) == 1 and expected in err[0], err
    assert not out.exists()


def test_qualify_output_that_is_a_file(work: Path, tmp_path, capsys) -> None:
    """It was a NotADirectoryError traceback, exit 1."""
    target = tmp_path / "file.txt"
    target.write_text("not a directory")
    code, err = _run(_qualify(work, "--steps", "1", "--output", str(target)), capsys)
    assert code == 2 and len(err) == 1 and "is a file, not a directory" in err[0], err
    assert target.read_text() == "not a directory"


def test_qualify_output_is_replaced_only_with_overwrite(work: Path, tmp_path, capsys) -> None:
    earlier = json.loads((work / "q1" / "report.json").read_text())
    code, err = _run(_qualify(work, "--steps", "1", "--output", str(work / "q1")), capsys)
    assert code == 2 and len(err) == 1 and "--overwrite" in err[0], err

    # not a qualify output: refused even with --overwrite, untouched
    mine = tmp_path / "notes"
    mine.mkdir()
    (mine / "mine.txt").write_text("mine")
    code, err = _run(_qualify(work, "--output", str(mine), "--overwrite"), capsys)
    assert code == 2 and len(err) == 1 and "not a qualify output" in err[0], err
    assert (mine / "mine.txt").read_text() == "mine"

    # a run that fails (bad source) leaves the earlier output as it was, and no sibling
    bad = ["qualify", str(work / "pkg"), "--source", str(tmp_path / "nope"), "--steps", "2"]
    code, err = _run([*bad, "--output", str(work / "q1"), "--overwrite", "-q"], capsys)
    assert code == 2 and len(err) == 1, err
    assert json.loads((work / "q1" / "report.json").read_text()) == earlier
    assert not [p for p in work.iterdir() if p.name.startswith(".q1.")]

    # a finished run replaces it
    code, _ = _run(
        _qualify(work, "--steps", "2", "--output", str(work / "q1"), "--overwrite"), capsys
    )
    assert code == 0
    report = json.loads((work / "q1" / "report.json").read_text())
    assert report != earlier and report["run"]["steps"] == ["prefill", "decode0", "decode1"]
    assert not [p for p in work.iterdir() if p.name.startswith(".q1.")]

    code, err = _run(["qualify", "--rescore", str(work / "q1"), "--overwrite"], capsys)
    assert code == 2 and len(err) == 1 and "--rescore" in err[0], err


def test_qualify_refuses_a_prompt_for_an_omni_package(tmp_path: Path, capsys) -> None:
    """It was accepted and silently not used (Omni runs its own synthetic prompt)."""
    write_demo("omni", tmp_path / "omni")
    assert (
        main(["build", "--model", str(tmp_path / "omni"), "--output", str(tmp_path / "pkg"), "-q"])
        == 0
    )
    capsys.readouterr()
    args = ["qualify", str(tmp_path / "pkg"), "--source", str(tmp_path / "omni")]
    code, err = _run([*args, "--prompt", "hi", "--output", str(tmp_path / "run")], capsys)
    assert code == 2 and len(err) == 1 and "Omni package" in err[0], err
    assert not (tmp_path / "run").exists()


def test_generate_audio_for_an_omni_package_without_an_audio_tower(tmp_path: Path, capsys) -> None:
    """The demo Omni checkpoint has a vision tower only: --audio was a ValueError traceback
    from the audio config reader (exit 1); it is one line naming the missing encoder."""
    import wave

    import numpy as np

    write_demo("omni", tmp_path / "omni")
    build = ["build", "--model", str(tmp_path / "omni"), "--output", str(tmp_path / "pkg")]
    assert main([*build, "-q"]) == 0
    clip = tmp_path / "clip.wav"
    with wave.open(str(clip), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(16000)
        handle.writeframes(np.zeros(1600, dtype="<i2").tobytes())
    capsys.readouterr()
    args = ["generate", str(tmp_path / "pkg"), "--prompt", "<so_embedding> hi"]
    code, err = _run([*args, "--audio", str(clip)], capsys)
    assert code == 2 and len(err) == 1 and "no audio encoder" in err[0], err


@pytest.mark.parametrize("after_publish", [True, False])
def test_a_signal_after_the_package_is_complete(
    after_publish: bool, work: Path, tmp_path, monkeypatch, capsys
) -> None:
    """SIGTERM while build prints its summary (after publishing) was reported as an
    interrupted export, "removed", with exit status 2 (143 before the handler), although the
    package was complete; before publishing, the export is still undone."""
    real = build_cmd.run

    def run_then_signal(args):
        if after_publish:
            real(args)
        raise Interrupted("SIGTERM")

    monkeypatch.setattr(build_cmd, "run", run_then_signal)
    out = tmp_path / "pkg"
    code, err = _run(["build", "--model", str(work / "ckpt"), "--output", str(out), "-q"], capsys)
    if after_publish:
        assert code == 0 and err == [
            f"mobius build: interrupted by SIGTERM after {out} was complete; "
            "the package is in place"
        ]
        assert (out / "manifest.json").is_file()
        assert main(["verify", str(out), "-q"]) == 0
    else:
        assert code == 2 and len(err) == 1 and "unfinished export was removed" in err[0]
        assert not out.exists()
