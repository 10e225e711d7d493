"""`mobius demo KIND OUT` writes real checkpoints: each kind builds and verifies; the text,
MoE, MTP and Puzzle ones load in transformers (no missing or unexpected tensor) and the
package's logits, caches and greedy tokens match transformers' within the FP32 gates; the MTP
head matches the independent head reference; the Omni one loads in transformers' Omni model;
the GGUF one names its tensors as gguf-py's NEMOTRON_H map does. The demo needs only the base
install (torch and onnxruntime unimportable)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_config_file
from mobius_lite.demo import DEMO_KINDS, write_demo
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from parity import drive_parity

ROOT = Path(__file__).resolve().parents[1]
# A child interpreter where torch, onnxruntime and Pillow are not installed, as on the base
# install: importing them fails and importlib finds no spec (transformers' own check).
BLOCKED_CHILD = """
import importlib.util, sys
blocked = ("torch", "onnxruntime", "PIL")
for name in blocked:
    sys.modules[name] = None
real = importlib.util.find_spec
importlib.util.find_spec = lambda n, p=None: None if n.split(".")[0] in blocked else real(n, p)
from mobius_lite.cli.main import main
"""


def _build(checkpoint: Path, out: Path) -> Path:
    package = mobius_lite.build(checkpoint, dtype="f32")
    saved = package.save(out)
    report = verify_package(saved, checkpoint)
    assert report.ok, report.mismatches
    return saved


def _transformers(checkpoint: Path):
    from transformers import NemotronHForCausalLM

    model, info = NemotronHForCausalLM.from_pretrained(
        checkpoint, output_loading_info=True, attn_implementation="eager"
    )
    assert not any(info.values()), info  # every tensor loaded, none left over
    model.config._experts_implementation = "eager"
    return model.float().eval()


def _assert_parity(model, checkpoint: Path, package: Path) -> None:
    run = drive_parity(model, load_config_file(checkpoint), package)
    assert not run.failures(FP32_NRMSE, FP32_COSINE), run.failures(FP32_NRMSE, FP32_COSINE)
    assert run.exported_tokens == run.reference_tokens


@pytest.mark.parametrize("kind", ["text", "moe"])
def test_text_kinds_are_transformers_checkpoints(kind: str, tmp_path: Path) -> None:
    checkpoint = write_demo(kind, tmp_path / kind)
    package = _build(checkpoint, tmp_path / "pkg")
    _assert_parity(_transformers(checkpoint), checkpoint, package)


def test_mtp_kind_head_matches_the_reference(tmp_path: Path) -> None:
    from reference_fixtures.mtp_fixtures import drive_head_parity, head_reference

    checkpoint = write_demo("mtp", tmp_path / "mtp")
    package = _build(checkpoint, tmp_path / "pkg")
    assert (package / "mtp.onnx").is_file()
    model = _transformers(checkpoint)
    _assert_parity(model, checkpoint, package)
    head = {k: v for k, v in load_file(checkpoint / "model.safetensors").items() if "mtp." in k}
    assert len(head) > 10
    comparisons = drive_head_parity(
        model, head_reference(model, head), package, NemotronHConfig.from_file(checkpoint)
    )
    failed = [c for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]
    assert not failed, failed


def test_puzzle_kind_matches_the_per_block_reference(tmp_path: Path) -> None:
    from mobius_lite.evaluation.puzzle_reference import build_puzzle_reference

    checkpoint = write_demo("puzzle", tmp_path / "puzzle")
    raw = json.loads((checkpoint / "config.json").read_text())
    model = build_puzzle_reference(raw)
    tensors = load_file(checkpoint / "model.safetensors")
    state = {}
    for name, value in model.state_dict().items():
        if name.endswith((".experts.up_proj", ".experts.down_proj")):
            prefix, proj = name.rsplit(".", 1)
            count = value.shape[0]
            state[name] = np.stack(
                [tensors.pop(f"{prefix}.{e}.{proj}.weight") for e in range(count)]
            )
        else:
            state[name] = tensors.pop(name)
    assert not tensors, sorted(tensors)  # every checkpoint tensor has a place in the model
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    package = _build(checkpoint, tmp_path / "pkg")
    _assert_parity(model.float().eval(), checkpoint, package)


def test_omni_kind_loads_in_transformers_and_builds(tmp_path: Path) -> None:
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3,
    )

    checkpoint = write_demo("omni", tmp_path / "omni")
    _, info = NemotronH_Omni_Reasoning_V3.from_pretrained(checkpoint, output_loading_info=True)
    assert not any(info.values()), info
    package = _build(checkpoint, tmp_path / "pkg")
    for graph in ("vision_encoder.onnx", "embedding.onnx", "model.onnx"):
        assert (package / graph).is_file()
    # its preprocessor_config.json fits the tower: an image runs through every graph
    from PIL import Image

    Image.new("RGB", (20, 12), (200, 30, 30)).save(tmp_path / "red.png")
    args = [
        "generate",
        str(package),
        "--prompt",
        "<image> hi",
        "--image",
        str(tmp_path / "red.png"),
    ]
    assert main([*args, "--max-new-tokens", "2"]) == 0


def test_gguf_kind_is_a_converter_layout_file(tmp_path: Path) -> None:
    import gguf

    path = write_demo("gguf", tmp_path / "demo.gguf")
    reader = gguf.GGUFReader(path)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    assert arch == "nemotron_h"
    known = {
        gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH.NEMOTRON_H]
    }  # name templates ("blk.{bid}.ssm_in")
    for tensor in reader.tensors:
        stem = (
            tensor.name.rsplit(".", 1)[0]
            if tensor.name.endswith((".weight", ".bias"))
            else tensor.name
        )
        template = stem.replace(stem.split(".")[1], "{bid}", 1) if stem.startswith("blk.") else stem
        assert template in known, tensor.name
    _build(path, tmp_path / "pkg")


def test_demo_needs_only_the_base_install(tmp_path: Path) -> None:
    """Demo, build and verify with torch, onnxruntime and Pillow unimportable (transformers
    then sees no torch and, imported by the GGUF tokenizer rebuild, would print its "PyTorch
    was not found" line); -q leaves stderr empty of it."""
    commands = [
        ["demo", "text", "ckpt"],
        ["demo", "gguf", "demo.gguf"],
        ["build", "--model", "ckpt", "--output", "pkg", "-q"],
        ["build", "--model", "demo.gguf", "--output", "gguf-pkg", "-q"],
        ["verify", "pkg", "--source", "ckpt"],
        ["verify", "gguf-pkg", "--source", "demo.gguf"],
    ]
    child = BLOCKED_CHILD + f"print([main(a) for a in {commands!r}])\n"
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.stdout.strip().splitlines()[-1] == "[0, 0, 0, 0, 0, 0]", done.stderr[-2000:]
    assert "PyTorch was not found" not in done.stderr


def test_demo_refuses_a_used_destination(tmp_path: Path, capsys) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "notes.txt").write_text("mine")
    assert main(["demo", "text", str(used)]) == 2
    assert main(["demo", "gguf", str(tmp_path / "demo.bin")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert "exists and is not empty" in err[0] and ".gguf" in err[1]
    assert (used / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["used"]  # no staging left behind
    assert set(DEMO_KINDS) == {"text", "moe", "puzzle", "mtp", "omni", "gguf"}
