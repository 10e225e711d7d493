"""Bad inputs to `mobius build` and the Python build API (issue 30), each one line, exit 2 from
the CLI, no traceback, nothing left behind: a disk too small or filling up, `--output .`,
mistyped local paths, configs lacking a field the tensors determine, broken tokenizer files,
routes that cannot run on the chosen provider (docs/bad_inputs_build.md lists them)."""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from mobius_lite.cli.main import main
from mobius_lite.sources import SafetensorsCheckpoint
from mobius_lite.weights import disk_space, writer

LAYERS = ["mamba", "moe", "attention", "mlp"]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(LAYERS).path


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line(code: int, err: str, *expected: str) -> None:
    assert code == 2, err
    assert err.startswith("mobius build: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, err


def tree(directory: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.iterdir())
        if p.is_file()
    }


def refuse_tensor_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self, name, *args, **kwargs):
        raise AssertionError(f"tensor data of {name} was read before the error")

    monkeypatch.setattr(SafetensorsCheckpoint, "read", refuse)
    monkeypatch.setattr(SafetensorsCheckpoint, "byte_range", refuse)


# --------------------------------------------------------------------------- item 3: disk space
Usage = namedtuple("Usage", "total used free")


def test_too_little_free_space_is_refused_before_any_read(
    checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Before: the export ran until the disk was full and ended in an OSError traceback."""
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda path: Usage(10**6, 10**6, 1000))
    refuse_tensor_reads(monkeypatch)
    out = tmp_path / "out" / "pkg"
    out.parent.mkdir()
    code, _, err = run_cli(["build", "--model", str(checkpoint), "--output", str(out)], capsys)
    assert_one_line(code, err, "not enough free space", "has 1000 bytes", "mounted at")
    needed = int(err.split("weights need ")[1].split(" bytes")[0])
    assert needed > 1000
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_disk_that_fills_during_the_export(checkpoint, tmp_path, monkeypatch, capsys) -> None:
    """ENOSPC from the shard writer (the disk filled after the check): one line naming the
    filesystem and the bytes still needed; the staging directory and its lock are gone."""
    original = writer._ShardWriter.write
    calls = []

    def fill(self, data) -> None:
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, data)

    monkeypatch.setattr(writer._ShardWriter, "write", fill)
    out = tmp_path / "out" / "pkg"
    out.parent.mkdir()
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q"]
    code, _, err = run_cli(args, capsys)
    assert_one_line(code, err, "filled up while writing", "still needed", "mounted at")
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_a_full_disk_keeps_the_old_package(checkpoint, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "pkg"
    assert main(["build", "--model", str(checkpoint), "--output", str(out), "-q"]) == 0
    before = tree(out)

    def full(self, data) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer._ShardWriter, "write", full)
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q", "--overwrite"]
    code, _, err = run_cli(args, capsys)
    assert_one_line(code, err, "filled up while writing")
    assert tree(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["pkg"]


# --------------------------------------------------------------------------- item 4: --output .
@pytest.mark.parametrize("output", [".", "./", ""])
def test_output_dot_in_an_empty_directory(output, checkpoint, tmp_path, monkeypatch) -> None:
    """Before: the package was staged inside "." and then refused as ". exists and is not
    empty", after the whole export."""
    from mobius_lite.weights.verify import verify_package

    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["build", "--model", str(checkpoint), "--output", output, "-q"]) == 0
    assert (here / "manifest.json").is_file() and (here / "model.onnx").is_file()
    assert Path.cwd().resolve() == here.resolve()  # the working directory itself, not a rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here"]  # no staging leftovers
    assert verify_package(here, SafetensorsCheckpoint(checkpoint), quiet=True).ok


def test_output_dot_overwrite_inside_a_package_is_refused_up_front(
    checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Before: the whole export ran, then the rename of "." failed with an EBUSY traceback."""
    here = tmp_path / "here"
    assert main(["build", "--model", str(checkpoint), "--output", str(here), "-q"]) == 0
    before = tree(here)
    monkeypatch.chdir(here)
    refuse_tensor_reads(monkeypatch)
    args = ["build", "--model", str(checkpoint), "--output", ".", "--overwrite", "-q"]
    code, _, err = run_cli(args, capsys)
    assert_one_line(code, err, "is the current directory", f"with the output {here.name}")
    assert tree(here) == before and sorted(p.name for p in tmp_path.iterdir()) == ["here"]


def test_api_errors_name_no_cli_flag_alone(checkpoint, tmp_path) -> None:
    """The Python API's refusal names the keyword argument (it said "pass --overwrite")."""
    import mobius_lite
    from mobius_lite.errors import PackageError

    out = tmp_path / "pkg"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(PackageError, match=r"overwrite=True"):
        mobius_lite.build(checkpoint).save(out)


def copy_checkpoint(checkpoint: Path, tmp_path: Path, **edits) -> Path:
    copy = tmp_path / "checkpoint"
    shutil.copytree(checkpoint, copy)
    config = json.loads((copy / "config.json").read_text())
    for key, value in edits.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


# --------------------------------------------------------------------------- item 8: paths
@pytest.mark.parametrize("model", ["ck/dens", "ck/dens.gguf"])
def test_mistyped_relative_path_says_the_path_not_the_network(
    model, checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """`ck/` exists, `ck/dens` does not. Before: taken for a hub id, and the message blamed
    the network ("could not be fetched ... check the network connection"), or for a .gguf
    name "is a hub repository: name its GGUF file with --gguf-file"."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # tests never download
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ck").mkdir()
    shutil.copytree(checkpoint, tmp_path / "ck" / "dense")
    code, _, err = run_cli(["build", "--model", model, "--output", "out", "-q"], capsys)
    name = model.split("/")[1]
    assert_one_line(code, err, f"{model}: no such file or directory", f"holds no {name!r}")
    assert "network" not in err and not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- item 9: fields
@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("hidden_size", "its tensors say 32 (backbone.embeddings.weight is [97, 32])"),
        ("vocab_size", "its tensors say 97 (backbone.embeddings.weight is [97, 32])"),
        ("mamba_num_heads", "its tensors say 4 (backbone.layers.0.mixer.A_log is [4])"),
        ("intermediate_size", "its tensors say 48 (backbone.layers.3.mixer.up_proj.weight"),
    ],
)
def test_a_field_the_tensors_determine_is_named(
    field, says, checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Before: the default (hidden_size 4096, as transformers) was taken, and the error listed
    about 30 wrong-shape tensors (1,849 characters) without naming the field."""
    config = json.loads((checkpoint / "config.json").read_text())
    assert (config["hidden_size"], config["vocab_size"]) == (32, 97)  # what `says` expects
    broken = copy_checkpoint(checkpoint, tmp_path, **{field: None})
    refuse_tensor_reads(monkeypatch)
    out = tmp_path / "out"
    code, _, err = run_cli(["build", "--model", str(broken), "--output", str(out)], capsys)
    assert_one_line(code, err, f"config.json has no {field}; {says}", f'add "{field}"')
    assert len(err) < 300 and not out.exists()


# --------------------------------------------------------------------------- item 11: Python API
@pytest.mark.parametrize(
    ("module", "config", "expected"),
    [
        ("linear", None, "the Linear module has no config"),
        ("object", None, "takes a torch module"),
        ("linear", 3, "config must be a dict or a transformers config"),
    ],
)
def test_build_from_module_of_something_else(module, config, expected) -> None:
    """Before: build_from_module(torch.nn.Linear(2, 2)) raised a raw AttributeError."""
    import torch

    import mobius_lite
    from mobius_lite.errors import ConfigError

    given = torch.nn.Linear(2, 2) if module == "linear" else object()
    with pytest.raises(ConfigError, match=expected):
        mobius_lite.build_from_module(given, config=config)


def test_api_route_errors_name_the_keyword_arguments(checkpoint) -> None:
    """A Python caller is told the keyword arguments, not only the CLI flags."""
    import mobius_lite
    from mobius_lite.errors import RouteError

    with pytest.raises(RouteError, match=r"ep='cuda'.*dtype='f32'"):
        mobius_lite.build(checkpoint, dtype="bf16")
    with pytest.raises(RouteError, match=r"weights_backend='ort'"):
        mobius_lite.build(checkpoint, activations="int8")


# --------------------------------------------------------------------------- item 5: --ep
@pytest.mark.parametrize(
    ("variant", "kernel"),
    [("nvfp4", "MatMulBlockQuantizedFp4Weight"), ("fp8", "MatMulBlockQuantizedFp8Weight")],
)
def test_modelopt_ort_route_is_refused_for_cpu(
    variant, kernel, tmp_path, monkeypatch, capsys
) -> None:
    """Before: `--backend ort --dtype f16` on a ModelOpt checkpoint built (exit 0) a package for
    the default --ep cpu, whose kernels exist only on CUDA; qualify and generate then failed."""
    from reference_fixtures import modelopt_fixtures as mf

    checkpoint = tmp_path / variant
    mf.write_checkpoint(variant, checkpoint)
    capsys.readouterr()  # save_pretrained's progress bar
    refuse_tensor_reads(monkeypatch)
    out = tmp_path / "out"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--backend", "ort"]
    code, _, err = run_cli([*args, "--dtype", "f16"], capsys)
    assert_one_line(code, err, kernel, "no kernel on the cpu execution provider", "--ep cuda")
    assert not out.exists()


def tiny_kernel_model(kernel: str) -> bytes:
    """One `kernel` node with f16 activations [1, 16] and a [4, 16] weight in its layout."""
    import numpy as np
    from onnx import TensorProto, helper

    if kernel == "MatMulBlockQuantizedFp4Weight":
        weights = [
            helper.make_tensor("w", TensorProto.UINT8, [4, 8], np.zeros(32, np.uint8)),
            helper.make_tensor("s", TensorProto.UINT8, [4, 1], np.zeros(4, np.uint8)),
            helper.make_tensor("s2", TensorProto.FLOAT, [], [1.0]),
        ]
        attributes = {"block_size": 16}
    else:
        weights = [
            helper.make_tensor("w", TensorProto.FLOAT8E4M3FN, [4, 16], [0.0] * 64),
            helper.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
        ]
        attributes = {}
    inputs = ["x", *(w.name for w in weights)]
    node = helper.make_node(kernel, inputs, ["y"], domain="com.microsoft", **attributes)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
        weights,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def test_missing_cpu_kernels_are_onnxruntime_facts() -> None:
    """Every operator routes.py lists as having no CPU kernel is an operator onnxruntime knows
    (its schema is registered) whose CPU session creation fails with NOT_IMPLEMENTED."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.capi import _pybind_state

    from mobius_lite.routes import PROVIDER_MISSING_KERNELS

    schemas = {s.name for s in _pybind_state.get_all_operator_schema()}
    for kernel in PROVIDER_MISSING_KERNELS["cpu"]:
        assert kernel in schemas, kernel
        with pytest.raises(Exception, match=f"NOT_IMPLEMENTED.*{kernel}"):
            ort.InferenceSession(tiny_kernel_model(kernel), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- item 6: tokenizer
@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}', "EOF while parsing"),
        ('{"version": "1.0", "model": {"type": "Nope"}}', "did not match any variant"),
        ("", "EOF while parsing"),
    ],
    ids=["cut", "unknown-model", "empty"],
)
def test_broken_tokenizer_is_refused_at_build(
    text, reason, checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Before: published without a word (exit 0); generate then failed on it (and the
    onnxruntime-genai example with a traceback). The `tokenizers` library is the judge."""
    from tokenizers import Tokenizer

    broken = copy_checkpoint(checkpoint, tmp_path)
    (broken / "tokenizer.json").write_text(text)
    with pytest.raises(Exception, match=reason):
        Tokenizer.from_file(str(broken / "tokenizer.json"))
    refuse_tensor_reads(monkeypatch)
    out = tmp_path / "out"
    code, _, err = run_cli(["build", "--model", str(broken), "--output", str(out)], capsys)
    assert_one_line(code, err, "tokenizer.json cannot be loaded as a tokenizer", reason)
    assert "remove it to export a package without a tokenizer" in err and not out.exists()
    # as the message says: without the file, the export goes through
    monkeypatch.undo()
    (broken / "tokenizer.json").unlink()
    assert main(["build", "--model", str(broken), "--output", str(out), "-q"]) == 0


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Add"])
def test_no_bf16_cpu_kernels_is_an_onnxruntime_fact(op) -> None:
    """routes.PROVIDER_PRECISIONS keeps bf16 off the CPU provider because its session
    creation fails (NOT_IMPLEMENTED) for these operators; checked on the installed one."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    from mobius_lite.enums import Precision
    from mobius_lite.routes import PROVIDER_PRECISIONS

    assert Precision.BF16 not in PROVIDER_PRECISIONS["cpu"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.BFLOAT16, [2, 2]) for n in "ab"]
    output = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, None)
    graph = helper.make_graph([helper.make_node(op, ["a", "b"], ["y"])], "g", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(Exception, match=f"NOT_IMPLEMENTED.*{op}"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


# --------------------------------------------------------------------------- item 7: GGUF tokens
def test_gguf_tokenizer_holds_only_the_files_tokens(tmp_path, capsys) -> None:
    """A byte-level BPE GGUF (llama.cpp's converter layout) whose tokens equal the model's
    vocabulary and that has no <|endoftext|>. Before: the rebuilt tokenizer.json appended
    <|endoftext|> after the last id, and every build warned that the tokenizer may not
    belong to the checkpoint. Reference: the token list gguf-py reads from the file."""
    import gguf
    from tokenizers import Tokenizer

    from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, write_gguf
    from reference_fixtures.nemotron_reference import make_reference

    corpus = ["the quick brown fox jumps over the lazy dog", "state space models"] * 4
    source = build_bpe_tokenizer(corpus, vocab_size=300)
    size = source.get_vocab_size()
    assert "<|endoftext|>" not in source.get_vocab()
    model = make_reference({"layers_block_type": ["mamba", "attention"], "vocab_size": size})
    path = write_gguf(tmp_path / "m.gguf", model, "nemotron_h", {}, tokenizer=source)[0]
    field = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    file_tokens = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
    assert len(file_tokens) == size
    capsys.readouterr()
    out = tmp_path / "pkg"
    code, _, err = run_cli(["build", "--model", str(path), "--output", str(out), "-q"], capsys)
    assert code == 0 and err == "", err  # no "may not belong" warning
    rebuilt = Tokenizer.from_file(str(out / "tokenizer.json"))
    vocab = rebuilt.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    assert by_id == [(t, i) for i, t in enumerate(file_tokens)]


# --------------------------------------------------------------------------- absent MTP head
def test_a_declared_but_absent_mtp_head_is_said(tmp_path, capsys) -> None:
    """num_nextn_predict_layers: 1 with no mtp.* tensors (what save_pretrained writes). Before:
    built without mtp.onnx and without a word. The checkpoint's own tensor names are the
    reference: the head's fusion weight is absent; with it added, no warning and mtp.onnx."""
    import mobius_lite
    from mobius_lite.build import BuildWarning
    from reference_fixtures.mtp_fixtures import HEAD_PATTERN, write_nemotron_h_mtp_checkpoint
    from reference_fixtures.nemotron_reference import make_reference

    bare = tmp_path / "bare"
    model = make_reference({"layers_block_type": HEAD_PATTERN, "num_nextn_predict_layers": 1})
    model.save_pretrained(bare)
    assert not any(n.startswith("mtp.") for n in SafetensorsCheckpoint(bare).names())
    capsys.readouterr()
    out = tmp_path / "pkg"
    code, _, err = run_cli(["build", "--model", str(bare), "--output", str(out), "-q"], capsys)
    assert code == 0 and err.startswith("warning: ") and err.count("\n") == 1, err
    assert "num_nextn_predict_layers=1" in err and "no mtp.onnx" in err
    assert not (out / "mtp.onnx").exists() and (out / "manifest.json").is_file()
    with pytest.warns(BuildWarning, match="multi-token-prediction head"):
        mobius_lite.build(bare)

    head = tmp_path / "head"
    write_nemotron_h_mtp_checkpoint(head)
    capsys.readouterr()
    out = tmp_path / "pkg-head"
    code, _, err = run_cli(["build", "--model", str(head), "--output", str(out), "-q"], capsys)
    assert code == 0 and err == "", err
    assert (out / "mtp.onnx").is_file()


# --------------------------------------------------------------------------- signals after publish
SIGNAL_CHILD = """\
import os, signal, sys
from mobius_lite.cli import build_cmd, main as cli_main
from mobius_lite.weights import publish as publish_module

moment = sys.argv[1]
sys.argv = ["mobius", *sys.argv[2:]]  # the process entry: main() reads sys.argv itself

if moment == "during-publish":  # arrives while the renames run, so it is deferred past them
    original = publish_module._publish
    def publish_then_signal(*args, **kwargs):
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)
        return result
    publish_module._publish = publish_then_signal
elif moment == "after-wrote":  # arrives while `wrote ...` is printed
    def print_then_signal(*args, **kwargs):
        print(*args, **kwargs)
        if args and str(args[0]).startswith("wrote "):
            os.kill(os.getpid(), signal.SIGTERM)
    build_cmd.print = print_then_signal
code = cli_main.main()
if moment == "after-main":  # arrives during the interpreter's exit
    signal.raise_signal(signal.SIGTERM)
sys.exit(code)
"""


@pytest.mark.parametrize("moment", ["during-publish", "after-wrote", "after-main"])
def test_sigterm_after_the_package_is_complete(moment, checkpoint, tmp_path) -> None:
    """Before: a SIGTERM landing after `wrote ...` exited 143 (or 2, "the unfinished export
    was removed") although the package was complete. Now: exit 0, the package in place and
    whole (every weight byte checked against the checkpoint)."""
    import os
    import subprocess
    import sys

    from mobius_lite.weights.verify import verify_package

    script = tmp_path / "child.py"
    script.write_text(SIGNAL_CHILD)
    out = tmp_path / "pkg"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [sys.executable, str(script), moment, "build", "--model", str(checkpoint)]
    proc = subprocess.run([*args, "--output", str(out)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"wrote {out}" in proc.stdout or moment == "during-publish", proc.stdout
    assert "Traceback" not in proc.stderr
    if moment != "after-main":
        assert f"interrupted by SIGTERM after {out} was complete" in proc.stderr, proc.stderr
    assert verify_package(out, SafetensorsCheckpoint(checkpoint), quiet=True).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["child.py", "pkg"]


# --------------------------------------------------------------------------- concurrent --overwrite
@pytest.mark.parametrize("moment", ["at-the-check", "at-the-rename"])
@pytest.mark.parametrize("overwrite", [True, False], ids=["overwrite", "fresh"])
def test_another_export_publishing_first(
    overwrite, moment, checkpoint, tiny_checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Another export to the same destination publishes just before this one's rename (the
    race two concurrent builds run). Before: an ENOTEMPTY traceback, or the other package
    replaced without overwrite. Now, with overwrite the later export wins, whole; without,
    it is refused in one line and the other package is kept, whole. Each package is checked
    byte for byte against its own checkpoint."""
    import os

    from mobius_lite.weights import publish as publish_module
    from mobius_lite.weights.verify import verify_package

    other_checkpoint = tiny_checkpoint(LAYERS, seed=1).path
    other = tmp_path / "other"
    assert main(["build", "--model", str(other_checkpoint), "--output", str(other), "-q"]) == 0
    out = tmp_path / "pkg"
    if moment == "at-the-check":
        real_check = publish_module.check_destination

        def check_then_other(destination, overwrite_arg) -> None:
            real_check(destination, overwrite_arg)
            shutil.copytree(other, out)

        monkeypatch.setattr(publish_module, "check_destination", check_then_other)
    else:
        real_rename = os.rename

        def other_then_rename(source, target) -> None:
            if Path(target) == out and ".partial-" in Path(source).name and not out.exists():
                shutil.copytree(other, out)
            real_rename(source, target)

        monkeypatch.setattr(os, "rename", other_then_rename)
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q"]
    code, _, err = run_cli(args + (["--overwrite"] if overwrite else []), capsys)
    monkeypatch.undo()
    if overwrite:
        assert code == 0, err
        winner = checkpoint
    else:
        assert_one_line(code, err, "another export published a package at", "overwrite=True")
        winner = other_checkpoint
    assert verify_package(out, SafetensorsCheckpoint(winner), quiet=True).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "pkg"]


# --------------------------------------------------------------------------- survey
def test_config_with_a_safetensors_checkpoint_is_refused(
    checkpoint, tmp_path, monkeypatch, capsys
) -> None:
    """Before: `--config` with a safetensors checkpoint was silently ignored (exit 0), even a
    file that is not JSON at all."""
    config = tmp_path / "c.json"
    config.write_text("{")
    refuse_tensor_reads(monkeypatch)
    out = tmp_path / "out"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--config", str(config)]
    code, _, err = run_cli(args, capsys)
    assert_one_line(code, err, "is a safetensors checkpoint, whose own config.json is used")
    assert not out.exists()


def test_an_empty_model_string(tmp_path, monkeypatch, capsys) -> None:
    """Before: "" was the working directory: "no config.json at <cwd>/config.json"."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["build", "--model", "", "--output", "out"], capsys)
    assert_one_line(code, err, "the model is an empty string")
