"""A table of bad inputs: each fails with its own one-line error, before any tensor data is read,
and leaves nothing behind (the output directory absent, or untouched when it already existed)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.errors import CheckpointError, ConfigError, MobiusError, PackageError, RouteError
from mobius_lite.sources import SafetensorsCheckpoint
from mobius_lite.sources.hub import HubError

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])
SENTINEL = b"an earlier package that must survive\n"


@pytest.fixture(scope="module")
def good_checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(LAYERS["layers_block_type"]).path


def edit_config(ck: Path, **changes) -> None:
    config = json.loads((ck / "config.json").read_text())
    config.update(changes)
    (ck / "config.json").write_text(json.dumps(config))


def edit_tensors(ck: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(str(ck / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(ck / "model.safetensors"))


def truncate(ck: Path) -> None:
    path = ck / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])


def wrong_shape(t: dict[str, np.ndarray]) -> None:
    name = "backbone.layers.2.mixer.q_proj.weight"
    t[name] = np.zeros((t[name].shape[0] + 8, t[name].shape[1]), t[name].dtype)


def missing(t: dict[str, np.ndarray]) -> None:
    del t["backbone.layers.3.mixer.down_proj.weight"]


def extra(t: dict[str, np.ndarray]) -> None:
    t["backbone.layers.3.mixer.adapter.weight"] = np.ones((4, 4), np.float32)


def fp8(t: dict[str, np.ndarray]) -> None:
    name = "backbone.layers.2.mixer.q_proj.weight"
    t[name] = t[name].astype(ml_dtypes.float8_e4m3fn)


def existing_output(ck: Path, out: Path) -> None:
    out.mkdir()
    (out / "model.onnx").write_bytes(SENTINEL)


@dataclass
class Case:
    name: str
    expected: tuple[str, ...]  # substrings of the one-line message
    error: type[MobiusError] | None  # what the Python API raises (None: a CLI-only case)
    mutate: Callable[[Path], None] = lambda ck: None
    cli_args: tuple[str, ...] = ()
    api_kwargs: dict = field(default_factory=dict)
    prepare_output: Callable[[Path, Path], None] | None = None
    model: str | None = None  # instead of the checkpoint directory


CASES = [
    Case(
        "missing config",
        ("no config.json at", "Hugging Face checkpoint directory"),
        ConfigError,
        mutate=lambda ck: (ck / "config.json").unlink(),
    ),
    Case(
        "wrong model_type",
        ("model_type 'llama' is not supported", "supported: nemotron_h"),
        ConfigError,
        mutate=lambda ck: edit_config(ck, model_type="llama"),
    ),
    Case(
        "truncated safetensors",
        ("truncated safetensors file", "re-download it"),
        CheckpointError,
        mutate=truncate,
    ),
    Case(
        "tensor of the wrong shape",
        ("tensors of the wrong shape", "layers.2.mixer.q_proj.weight: checkpoint [40, 32]"),
        CheckpointError,
        mutate=lambda ck: edit_tensors(ck, wrong_shape),
    ),
    Case(
        "missing tensor",
        ("missing tensors: backbone.layers.3.mixer.down_proj.weight",),
        CheckpointError,
        mutate=lambda ck: edit_tensors(ck, missing),
    ),
    Case(
        "extra unused tensor",
        ("tensors the config does not use: backbone.layers.3.mixer.adapter.weight",),
        CheckpointError,
        mutate=lambda ck: edit_tensors(ck, extra),
    ),
    Case(
        "unsupported quantized weight format",
        ("quantized weight format", "quant_method='gptq'", "BF16"),
        RouteError,
        mutate=lambda ck: edit_config(ck, quantization_config={"quant_method": "gptq"}),
    ),
    Case(
        "packed tensor without quantization_config",
        ("packed or integer format", "q_proj.weight (float8_e4m3fn)", "supported source dtypes"),
        RouteError,
        mutate=lambda ck: edit_tensors(ck, fp8),
    ),
    Case(
        "bf16 on the default cpu provider",
        ("dtype bf16 cannot run on the cpu execution provider", "--ep cuda", "--dtype f32"),
        RouteError,
        cli_args=("--dtype", "bf16"),
        api_kwargs={"dtype": "bf16"},
    ),
    Case(
        "revision with a local directory",
        ("--revision abc was given with the local directory", "drop --revision"),
        ConfigError,
        cli_args=("--revision", "abc"),
        api_kwargs={"revision": "abc"},
    ),
    Case(
        "neither a directory nor a hub id",
        ("no such directory, and not a Hugging Face model id",),
        ConfigError,
        model="./no/such/../checkpoint",
    ),
    Case(
        "output exists without --overwrite",
        ("exists and is not empty", "--overwrite"),
        None,
        prepare_output=existing_output,
    ),
]


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse usage errors
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.err


@pytest.fixture
def no_data_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any read of tensor data fails the test: every error must come from headers/config."""

    def refuse(self, name):
        raise AssertionError(f"tensor data of {name} was read before the error")

    monkeypatch.setattr(SafetensorsCheckpoint, "read", refuse)
    monkeypatch.setattr(SafetensorsCheckpoint, "byte_range", refuse)


def prepare(case: Case, good: Path, tmp_path: Path) -> tuple[str, Path]:
    import shutil

    ck = tmp_path / "checkpoint"
    shutil.copytree(good, ck)
    case.mutate(ck)
    out = tmp_path / "out"
    if case.prepare_output:
        case.prepare_output(ck, out)
    return case.model or str(ck), out


def assert_nothing_left(case: Case, out: Path) -> None:
    if case.prepare_output:
        assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]
        assert (out / "model.onnx").read_bytes() == SENTINEL
    else:
        assert not out.exists()
    assert not [p for p in out.parent.iterdir() if ".partial" in p.name]


@pytest.mark.usefixtures("no_data_reads")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_reports_one_clear_error(case: Case, good_checkpoint, tmp_path, capsys):
    model, out = prepare(case, good_checkpoint, tmp_path)
    code, err = run_cli(["build", "--model", model, "--output", str(out), *case.cli_args], capsys)
    assert code == 2
    assert err.startswith("mobius build: error: ") and err.count("\n") == 1, err
    for text in case.expected:
        assert text in err, (text, err)
    assert "Traceback" not in err
    assert_nothing_left(case, out)


@pytest.mark.usefixtures("no_data_reads")
@pytest.mark.parametrize("case", [c for c in CASES if c.error], ids=lambda c: c.name)
def test_python_api_raises_the_same_error(case: Case, good_checkpoint, tmp_path):
    model, out = prepare(case, good_checkpoint, tmp_path)
    with pytest.raises(case.error) as err:
        mobius_lite.build(model, **case.api_kwargs)
    for text in case.expected:
        assert text in str(err.value)
    assert_nothing_left(case, out)


def test_every_case_has_its_own_message(good_checkpoint, tmp_path, capsys):
    messages = set()
    for i, case in enumerate(CASES):
        model, out = prepare(case, good_checkpoint, tmp_path / str(i))
        code, err = run_cli(
            ["build", "--model", model, "--output", str(out), *case.cli_args], capsys
        )
        assert code == 2
        messages.add(err.replace(str(tmp_path / str(i)), "<tmp>"))
    assert len(messages) == len(CASES)


@pytest.mark.parametrize(
    "size, expected",
    [
        ("12XB", "invalid size '12XB'"),
        ("0", "size must be positive"),
        ("ten", "invalid size 'ten'"),
    ],
)
def test_bad_shard_size_is_a_usage_error(size, expected, good_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["build", "--model", str(good_checkpoint), "--output", str(out), "--shard-size", size]
    code, err = run_cli(args, capsys)
    assert code == 2
    assert "argument --shard-size" in err and expected in err and "Traceback" not in err
    assert not out.exists()


def test_unknown_execution_provider_is_a_usage_error(good_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["build", "--model", str(good_checkpoint), "--output", str(out), "--ep", "rocm"]
    code, err = run_cli(args, capsys)
    assert code == 2 and "argument --ep: invalid choice: 'rocm'" in err
    with pytest.raises(RouteError, match="execution provider 'rocm' is not supported"):
        mobius_lite.build(good_checkpoint, ep="rocm")
    assert not out.exists()


def test_output_is_a_file(good_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    out.write_bytes(SENTINEL)
    code, err = run_cli(["build", "--model", str(good_checkpoint), "--output", str(out)], capsys)
    assert code == 2 and "is a file, not a directory; choose a directory path" in err
    assert out.read_bytes() == SENTINEL


def read_only_directory(tmp_path: Path) -> Path:
    """A directory this process cannot create files in. Permission bits do not stop root, so
    as root the kernel's /sys (read-only to everyone) stands in."""
    if os.geteuid() != 0:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o555)
        return directory
    probe = Path("/sys") / f"mobius-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return Path("/sys")
    probe.rmdir()
    pytest.skip("running as root on a machine whose /sys is writable: no read-only directory")


@pytest.mark.usefixtures("no_data_reads")
@pytest.mark.parametrize("where", ["under-a-file", "read-only"])
def test_unwritable_output_is_one_clear_error(where, good_checkpoint, tmp_path, capsys):
    """Regression: these printed a traceback and exited 1. Now: one line, exit 2, checked before
    any tensor is read (no_data_reads), and nothing is created."""
    if where == "under-a-file":
        blocker = tmp_path / "a-file"
        blocker.write_bytes(SENTINEL)
        out, expected = blocker / "pkg", "is a file, not a directory"
    else:
        out, expected = read_only_directory(tmp_path) / "pkg", "cannot write in"
    code, err = run_cli(["build", "--model", str(good_checkpoint), "--output", str(out)], capsys)
    assert code == 2, err
    assert err.startswith("mobius build: error: ") and err.count("\n") == 1, err
    assert expected in err and "Traceback" not in err
    assert not out.exists()
    with pytest.raises(PackageError, match=expected):
        mobius_lite.build(good_checkpoint).save(out, quiet=True)
    if where == "under-a-file":
        assert blocker.read_bytes() == SENTINEL


def test_hub_id_missing_offline(good_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    out = tmp_path / "out"
    code, err = run_cli(["build", "--model", "someorg/absent", "--output", str(out)], capsys)
    assert code == 2 and "someorg/absent@main is not in the local Hugging Face cache" in err
    with pytest.raises(HubError):
        mobius_lite.build("someorg/absent")
    assert not out.exists()


def test_existing_output_refused_by_save_then_replaced_with_overwrite(
    good_checkpoint, tmp_path, capsys
):
    out = tmp_path / "out"
    existing_output(good_checkpoint, out)
    with pytest.raises(PackageError, match="exists and is not empty"):
        mobius_lite.build(good_checkpoint).save(out)
    assert (out / "model.onnx").read_bytes() == SENTINEL
    code, _ = run_cli(
        ["build", "--model", str(good_checkpoint), "--output", str(out), "--overwrite", "-q"],
        capsys,
    )
    assert code == 0
    assert (out / "model.onnx").read_bytes() != SENTINEL
    assert (out / "genai_config.json").is_file()


def test_unsupported_task(good_checkpoint):
    with pytest.raises(ConfigError, match="task 'embedding' is not supported"):
        mobius_lite.build(good_checkpoint, task="embedding")
