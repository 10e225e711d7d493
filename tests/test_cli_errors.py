"""Bad inputs to inspect / verify / generate / build that printed a traceback: each is now one
line on stderr, exit status 2, and nothing is left behind (docs/cli.md's table)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from mobius_lite.cli.main import main
from mobius_lite.errors import MobiusError
from mobius_lite.media.audio_file import load_wav
from reference_fixtures.nemotron_reference import make_reference

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])
VOCAB = 97  # nemotron_reference.TINY_BASE


def word_tokenizer(path: Path, size: int) -> None:
    """A word-level tokenizer with ids 0 .. size - 1 (w0 is id 1)."""
    vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(size - 1)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, command: str, *expected: str) -> None:
    assert code == 2, err
    assert err.startswith(f"mobius {command}: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("errors") / "checkpoint"
    make_reference(LAYERS, seed=0).save_pretrained(directory)
    word_tokenizer(directory / "tokenizer.json", VOCAB)
    return directory


@pytest.fixture(scope="module")
def package(checkpoint: Path) -> Path:
    out = checkpoint.parent / "pkg"
    assert main(["build", "--model", str(checkpoint), "--output", str(out), "-q"]) == 0
    assert main(["generate", str(out), "--prompt", "w1 w2", "--ids"]) == 0
    return out


# --------------------------------------------------------------------------- package files
def damaged(package: Path, tmp_path: Path, how: str) -> tuple[Path, str]:
    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    data = sorted(copy.glob("model.onnx*.data"))[-1]
    if how == "data-missing":
        data.unlink()
        return copy, f"external data file {data.name} is missing"
    if how == "data-truncated":
        os.truncate(data, data.stat().st_size // 3)
        return copy, f"{data.name} has {data.stat().st_size} bytes; the manifest recorded"
    if how == "graph-missing":
        (copy / "model.onnx").unlink()
        return copy, "its graph file model.onnx is missing"
    os.truncate(copy / "model.onnx", 3000)
    return copy, "its graph file model.onnx is not a readable ONNX model"


@pytest.mark.parametrize("how", ["data-missing", "data-truncated", "graph-missing", "graph-cut"])
@pytest.mark.parametrize("command", ["generate", "verify", "inspect", "qualify"])
def test_incomplete_package_is_one_clear_error(
    command, how, package, checkpoint, tmp_path, capsys
) -> None:
    """Before: generate raised onnxruntime's Fail / NoSuchFile / InvalidProtobuf traceback,
    verify a FileNotFoundError or DecodeError traceback (or 34 MISMATCH lines for a cut data
    file), inspect exited 0, qualify ran and reported failed verdicts. Now the shared package
    reader says what is missing first."""
    broken, expected = damaged(package, tmp_path, how)
    args = {
        "generate": ["generate", str(broken), "--prompt", "w1", "--ids"],
        "verify": ["verify", str(broken), "--source", str(checkpoint), "-q"],
        "inspect": ["inspect", str(broken)],
        "qualify": ["qualify", str(broken), "--source", str(checkpoint), "-q"],
    }[command]
    code, _, err = run_cli(args, capsys)
    if command == "inspect" and how.startswith("graph"):
        expected = "model.onnx is not a readable ONNX model"  # inspect reads the graph itself
    assert_one_line(code, err, command, expected)


def test_generate_on_a_checkpoint_says_what_to_run(checkpoint, capsys) -> None:
    code, _, err = run_cli(["generate", str(checkpoint), "--prompt", "w1"], capsys)
    assert_one_line(code, err, "generate", "is a checkpoint", "not a package", "mobius build")
    assert f"--model {checkpoint}" in err


# --------------------------------------------------------------------------- vocabulary
def test_tokenizer_larger_than_the_vocabulary(checkpoint, tmp_path, capsys) -> None:
    """build warns, naming both sizes; generate refuses a prompt id past the vocabulary (it
    raised onnxruntime's Gather "indices element out of data bounds")."""
    big = tmp_path / "checkpoint"
    shutil.copytree(checkpoint, big)
    word_tokenizer(big / "tokenizer.json", VOCAB + 20)
    out = tmp_path / "pkg"
    code, _, err = run_cli(["build", "--model", str(big), "--output", str(out), "-q"], capsys)
    assert code == 0
    assert err.startswith("warning: ") and err.count("\n") == 1, err
    assert f"{VOCAB + 20} token ids" in err and f"vocabulary has {VOCAB}" in err
    code, _, err = run_cli(["generate", str(out), "--prompt", "w2 w100", "--ids"], capsys)
    assert_one_line(code, err, "generate", "token id 101", f"ids 0 to {VOCAB - 1}")
    # ids inside the vocabulary still generate
    assert run_cli(["generate", str(out), "--prompt", "w2 w50", "--ids"], capsys)[0] == 0


# --------------------------------------------------------------------------- WAV files
def wav_bytes(samples: int) -> bytes:
    path_like = __import__("io").BytesIO()
    with wave.open(path_like, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(16000)
        handle.writeframes(np.zeros(samples, "<i2").tobytes())
    return path_like.getvalue()


WAVS = {
    # name: (bytes, what the message must say)
    "empty": (b"", "ends inside its header: 0 bytes"),
    "not-riff": (b"ID3" + bytes(200), "file does not start with RIFF id"),
    "riff-garbage": (b"RIFF" + wav_bytes(10)[4:12] + bytes(range(60)), "not a readable WAV"),
    "truncated-to-3-percent": (wav_bytes(4000)[: 44 + 240], "header declares 4000 samples"),
    "header-only": (wav_bytes(4000)[:44], "the file holds 0"),
}


@pytest.mark.parametrize("name", sorted(WAVS))
def test_bad_wav_is_refused_with_its_reason(name, tmp_path) -> None:
    """Before: a traceback (RuntimeError, EOFError), "not a readable WAV file ()", or a
    clip truncated to 3% of its data accepted silently."""
    data, expected = WAVS[name]
    path = tmp_path / "clip.wav"
    path.write_bytes(data)
    with pytest.raises(MobiusError) as info:
        load_wav(path, 16000)
    message = str(info.value)
    assert expected in message and "()" not in message, message
    assert len(load_wav(_write(tmp_path / "good.wav", wav_bytes(4000)), 16000)) == 4000


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- optional packages
@pytest.mark.parametrize(
    ("module", "args", "pip"),
    [
        ("onnxruntime", ["generate", "{pkg}", "--prompt", "w1"], "onnxruntime"),
        ("tokenizers", ["generate", "{pkg}", "--prompt", "w1"], "tokenizers"),
    ],
)
def test_missing_optional_package_names_it_and_its_extra(
    module, args, pip, package, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    code, _, err = run_cli([a.format(pkg=package) for a in args], capsys)
    assert_one_line(code, err, args[0], f"needs {pip}", "pip install 'mobius-lite[runtime]'")


@pytest.mark.parametrize("module", ["torch", "transformers"])
def test_qualify_without_the_reference_packages(
    module, package, checkpoint, tmp_path, monkeypatch, capsys
):
    """Before: qualify ran the package, then reported NOT_RUN verdicts and exited 0."""
    monkeypatch.setitem(sys.modules, module, None)
    args = ["qualify", str(package), "--source", str(checkpoint), "--output", str(tmp_path / "q")]
    code, _, err = run_cli(args, capsys)
    assert_one_line(code, err, "qualify", f"needs {module}", "mobius-lite[reference]")
    assert not (tmp_path / "q").exists()


def test_missing_pillow_for_an_image(tmp_path, monkeypatch) -> None:
    from mobius_lite.media.image import load_image

    monkeypatch.setitem(sys.modules, "PIL", None)
    monkeypatch.delitem(sys.modules, "PIL.Image", raising=False)
    with pytest.raises(MobiusError, match=r"needs pillow.*mobius-lite\[runtime\]"):
        load_image(tmp_path / "x.png")


# --------------------------------------------------------------------------- broken pipe
def test_inspect_into_a_closed_pipe_exits_quietly(package) -> None:
    """`mobius inspect PKG | head -1`: the reader is gone before the report is written (its end
    of the pipe is closed before the child starts), so the write fails with EPIPE every
    time. Before: a BrokenPipeError traceback and exit status 1."""
    read, write = os.pipe()
    os.close(read)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mobius_lite.cli.main", "inspect", str(package)],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    finally:
        os.close(write)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


# --------------------------------------------------------------------------- start-up
LIGHT_PROBE = """\
import sys
from mobius_lite.cli.main import main
try:
    main([{arg!r}])
except SystemExit:
    pass
heavy = ("torch", "transformers", "onnxruntime", "onnx_ir", "onnxscript", "onnx", "tokenizers")
print(",".join(m for m in heavy if m in sys.modules))
"""


@pytest.mark.parametrize("arg", ["--version", "--help"])
def test_help_and_version_import_no_heavy_package(arg) -> None:
    """Before: every command imported onnx, onnx_ir and onnxscript (and the package's whole
    export path) at start-up, even --version."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", LIGHT_PROBE.format(arg=arg)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    *_, imported = proc.stdout.splitlines() or [""]
    assert imported == "", f"{arg} imported {imported}"


def test_commands_import_no_torch_until_they_need_it() -> None:
    """Each command module (what `mobius COMMAND` imports) leaves torch, transformers and
    onnxruntime alone; qualify and generate import them when they run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    probe = (
        "import sys, importlib\n"
        "for c in ('build', 'inspect', 'verify', 'qualify', 'generate'):\n"
        "    importlib.import_module(f'mobius_lite.cli.{c}_cmd')\n"
        "print(','.join(m for m in ('torch', 'transformers', 'onnxruntime') if m in sys.modules))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True
    )
    assert proc.stdout.strip() == ""


def test_package_manifest_not_json_is_one_line(package, tmp_path, capsys) -> None:
    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    (copy / "manifest.json").write_text(json.dumps({"format": "something else"}))
    code, _, err = run_cli(["generate", str(copy), "--prompt", "w1"], capsys)
    assert_one_line(code, err, "generate", "manifest.json")
