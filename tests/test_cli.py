"""The `mobius` command line: help and version, build end to end, inspect against onnx itself."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
import torch

import mobius_lite
from mobius_lite.cli import main as cli_main
from mobius_lite.cli.main import main, make_parser
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.run.decoder_session import DecoderSession
from reference_fixtures.nemotron_reference import pinned_torch

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    checkpoint = tiny_checkpoint(LAYERS["layers_block_type"])
    return checkpoint.model, checkpoint.path


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def subcommand_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = make_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


# --------------------------------------------------------------------------- help / version
def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"mobius {mobius_lite.__version__}"


def test_top_level_help_lists_every_command(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for name in subcommand_parsers():
        assert name in out
    assert "examples:" in out and "mobius build --model" in out


def test_every_subcommand_is_registered():
    assert set(subcommand_parsers()) == {
        m.__name__.rsplit(".", 1)[-1].removesuffix("_cmd") for m in cli_main.SUBCOMMANDS
    }


@pytest.mark.parametrize("name", sorted(subcommand_parsers()))
def test_subcommand_help_describes_every_option(name, capsys):
    parser = subcommand_parsers()[name]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and len(action.help) > 10, (name, action.dest)
    assert parser.description and parser.epilog and "examples:" in parser.epilog
    code, out, _ = run([name, "--help"], capsys)
    assert code == 0
    for action in parser._actions:
        for option in action.option_strings:
            assert option in out, (name, option)
    assert f"mobius {name}" in out  # an example of the command itself


def test_missing_required_arguments_is_a_usage_error(capsys):
    code, _, err = run(["build", "--output", "x"], capsys)
    assert code == 2 and "the following arguments are required: --model" in err


# --------------------------------------------------------------------------- build
def _assert_logits_match(model, checkpoint, package) -> None:
    """The package's prefill logits against the reference model's, FP32 gates."""
    config = NemotronHConfig.from_file(checkpoint)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(1, 9)).astype(np.int64)
    ours = DecoderSession(package / "model.onnx").step(ids)["logits"]
    with pinned_torch():
        expected = model(torch.from_numpy(ids)).logits.float().numpy()
    result = compare("logits", ours, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


def test_build_runs_and_matches_transformers(reference, tmp_path, capsys):
    model, checkpoint = reference
    out = tmp_path / "pkg"
    code, stdout, err = run(["build", "--model", str(checkpoint), "--output", str(out)], capsys)
    assert code == 0, err
    assert f"source: {checkpoint.resolve()}" in stdout
    assert "revision: (local directory, no revision)" in stdout
    _assert_logits_match(model, checkpoint, out)


@pytest.mark.parametrize("flag", ["--backend", "--weights-backend"])
def test_build_ort_backend_runs_the_mamba_kernels_of_onnxruntime(flag, reference, tmp_path, capsys):
    """--backend ort (alias --weights-backend) emits the com.microsoft conv / SSD kernels and the
    package still matches transformers."""
    model, checkpoint = reference
    out = tmp_path / "pkg"
    code, _, err = run(
        ["build", "--model", str(checkpoint), "--output", str(out), flag, "ort"], capsys
    )
    assert code == 0, err
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    kernels = [n for n in graph.node if n.op_type in ("LinearAttention", "CausalConvWithState")]
    assert kernels and {n.domain for n in kernels} == {"com.microsoft"}
    _assert_logits_match(model, checkpoint, out)


def test_build_shard_size_and_inspect_against_onnx(reference, tmp_path, capsys):
    _, checkpoint = reference
    out = tmp_path / "pkg"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--shard-size", "20KB"]
    code, _, err = run(args + ["-q"], capsys)
    assert code == 0, err
    code, stdout, _ = run(["inspect", str(out), "--json"], capsys)
    assert code == 0
    report = json.loads(stdout)
    (m,) = report["models"]

    # independent reference: the model loaded by onnx with its external data
    full = onnx.load(str(out / "model.onnx"))
    data_files = sorted(p.name for p in out.iterdir() if p.name.endswith(".data"))
    assert len(data_files) > 1  # 20 KB shards: several files
    assert sorted(m["external_data"]) == data_files
    assert all(f["complete"] and f["regular_file"] for f in m["external_data"].values())
    for f in m["external_data"].values():
        assert f["size_on_disk"] <= 20_000 or f["tensors"] == 1  # a big tensor gets its own
    by_dtype: dict[str, int] = {}
    for t in full.graph.initializer:
        arr = onnx.numpy_helper.to_array(t)
        key = arr.dtype.name
        by_dtype[key] = by_dtype.get(key, 0) + arr.nbytes
    assert {k: v["bytes"] for k, v in m["weights"].items()} == by_dtype
    # node counts: onnx_ir's recursive iterator is the reference for subgraph contents
    graph = ir.load(str(out / "model.onnx")).graph
    main_ops = Counter(n.op_type for n in graph)
    all_ops = Counter(n.op_type for n in ir.traversal.RecursiveGraphIterator(graph))
    assert m["nodes"]["main"] == dict(main_ops) and m["nodes"]["main_total"] == len(graph)
    assert m["nodes"]["subgraphs"] == dict(all_ops - main_ops)
    assert m["nodes"]["subgraphs_total"] == sum((all_ops - main_ops).values()) > 0
    inputs = {v["name"]: v for v in m["inputs"]}
    assert inputs["input_ids"] == {
        "name": "input_ids",
        "dtype": "int64",
        "shape": ["batch", "sequence"],
    }
    # the one input with an initializer is optional; its default is what the graph holds
    (keep,) = [t for t in full.graph.initializer if t.name == "logits_to_keep"]
    optional = {name: v["default"] for name, v in inputs.items() if "default" in v}
    assert optional == {"logits_to_keep": onnx.numpy_helper.to_array(keep).tolist()}
    assert optional["logits_to_keep"] == 0
    assert [v["name"] for v in m["outputs"]] == [o.name for o in full.graph.output]
    assert report["genai_config.json"]["providers"] == ["cpu"]


def test_build_cuda_bf16_route(reference, tmp_path, capsys):
    _, checkpoint = reference
    out = tmp_path / "pkg"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--dtype", "bf16"]
    code, _, err = run(args + ["--ep", "cuda", "-q"], capsys)
    assert code == 0, err
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["session_options"]["provider_options"] == [{"cuda": {}}]
    code, stdout, _ = run(["inspect", str(out)], capsys)
    assert code == 0
    assert "genai_config: type decoder, providers cuda" in stdout
    full = onnx.load(str(out / "model.onnx"), load_external_data=False)
    weights = [t for t in full.graph.initializer if t.name.startswith(("backbone.", "lm_head"))]
    # the MoE router stays FP32 as in the source; every other weight is bf16
    assert {t.data_type for t in weights if ".gate." not in t.name} == {onnx.TensorProto.BFLOAT16}
    assert {t.data_type for t in weights if ".gate." in t.name} == {onnx.TensorProto.FLOAT}
    assert "bfloat16:" in stdout


def test_inspect_reads_no_weight_data(reference, tmp_path, capsys):
    _, checkpoint = reference
    out = tmp_path / "pkg"
    assert run(["build", "--model", str(checkpoint), "--output", str(out), "-q"], capsys)[0] == 0
    (out / "model.onnx.data").write_bytes(b"")  # weights gone: inspect must still describe it
    code, stdout, err = run(["inspect", str(out / "model.onnx")], capsys)
    assert "model.onnx.data:" in stdout and "[TRUNCATED]" in stdout
    # ...and say in one line (exit 2) that nothing can run it
    assert code == 2 and err.count("\n") == 1 and "model.onnx.data is truncated" in err
    (out / "model.onnx.data").unlink()
    code, stdout, _ = run(["inspect", str(out), "--json"], capsys)
    files = json.loads(stdout)["models"][0]["external_data"]
    assert files["model.onnx.data"]["exists"] is False


@pytest.mark.parametrize("target", ["missing-dir", "empty-dir", "not-onnx.onnx"])
def test_inspect_bad_target(target, tmp_path, capsys):
    path = tmp_path / target
    if target == "empty-dir":
        path.mkdir()
    if target == "not-onnx.onnx":
        path.write_bytes(b"\xff\x00 definitely not a protobuf")
    code, _, err = run(["inspect", str(path)], capsys)
    assert code == 2 and err.startswith("mobius inspect: error: ") and "Traceback" not in err


def test_cli_subprocess_error_has_no_traceback(reference, tmp_path):
    _, checkpoint = reference
    cmd = [sys.executable, "-m", "mobius_lite.cli.main", "build", "--model", str(checkpoint)]
    result = subprocess.run(
        cmd + ["--output", str(tmp_path / "pkg"), "--dtype", "bf16"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--ep cuda" in result.stderr and "--dtype f32" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_build_warns_when_onnxruntime_genai_cannot_run_the_package(tmp_path, capsys):
    """A Puzzle package whose Mamba layers differ in state shape is exported (it runs in
    onnxruntime) with a warning naming what onnxruntime-genai 0.18 cannot hold."""
    from reference_fixtures.puzzle_fixtures import (
        HETEROGENEOUS_BLOCKS,
        puzzle_raw_config,
        write_puzzle_checkpoint,
    )

    checkpoint, _ = write_puzzle_checkpoint(
        puzzle_raw_config(HETEROGENEOUS_BLOCKS), tmp_path / "checkpoint"
    )
    args = ["build", "--model", str(checkpoint), "--output", str(tmp_path / "pkg"), "-q"]
    code, _, err = run(args, capsys)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2
    assert "conv_state" in warnings[0] and "recurrent_state" in warnings[1]
    assert (tmp_path / "pkg" / "model.onnx").is_file()
