"""llama.cpp's `.scale` / `.input_scale` sidecar tensors on a Nemotron-H GGUF, with block types
the package read before NVFP4 (Q8_0, Q4_0, F16): the scale semantics do not depend on the
weight's type. Each scale is an F32 [1] (or [E] for stacked experts) tensor; llama.cpp
multiplies the weight's matmul output by it. The reference is transformers holding gguf-py's
dequantized weights times their scales (reference_fixtures/gguf_fixtures.apply_sidecars), under the
foundation gates on both backends and with --dequantize."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from transformers import NemotronHForCausalLM

from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from parity import drive_parity
from reference_fixtures.gguf_fixtures import dequantized_state_dict, write_gguf
from reference_fixtures.nemotron_reference import make_reference

# Every weight kind llama.cpp scales (plus the latent projections, applied with the
# converter's meaning), in a MoE and a dense-MLP model.
MOE = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "moe_intermediate_size": 32,
    "moe_latent_size": 32,
    "moe_shared_expert_intermediate_size": 32,
}
HYBRID = {"layers_block_type": ["mamba", "attention", "mlp"], "intermediate_size": 64}
TYPES = {
    r"attn_[qkv]\.": "Q8_0",
    r"attn_output\.": "Q4_0",
    r"ssm_in\.": "Q8_0",
    r"ssm_out\.": "F16",
    r"ffn_(up|down)_exps\.": "Q8_0",
    r"ffn_(up|down)_shexp\.": "Q4_0",
    r"ffn_latent_": "F16",
    r"ffn_(up|down)\.": "Q8_0",
    r"^output\.": "Q8_0",
}
SCALED = {
    "moe": (
        "blk.0.ssm_in",
        "blk.0.ssm_out",
        "blk.1.ffn_up_exps",
        "blk.1.ffn_down_exps",
        "blk.1.ffn_up_shexp",
        "blk.1.ffn_down_shexp",
        "blk.1.ffn_latent_down",
        "blk.1.ffn_latent_up",
        "blk.2.attn_q",
        "blk.2.attn_k",
        "blk.2.attn_v",
        "blk.2.attn_output",
        "blk.3.ffn_down_exps",
    ),
    "hybrid": ("blk.0.ssm_in", "blk.1.attn_q", "blk.2.ffn_up", "blk.2.ffn_down"),
}
CASES = {"moe": (MOE, "nemotron_h_moe"), "hybrid": (HYBRID, "nemotron_h")}


def _scales(model: Any, names: tuple[str, ...], rng: np.random.Generator) -> dict[str, Any]:
    """Scale values far from 1, one per expert for stacked experts."""
    experts = model.config.n_routed_experts
    return {
        f"{n}.weight": rng.uniform(0.05, 4.0, size=experts if "_exps" in n else 1).astype(
            np.float32
        )
        for n in names
    }


def _write(tmp: Path, key: str, extra: dict[str, np.ndarray] | None = None) -> list[Path]:
    overrides, arch = CASES[key]
    model = make_reference(overrides)
    rng = np.random.default_rng(7)
    scales = _scales(model, SCALED[key], rng)
    return write_gguf(
        tmp / f"{key}.gguf", model, arch, TYPES, scales=scales, extra_tensors=extra
    ), model


def _export(file: Path, out: Path, *flags: str) -> int:
    return main(["build", "--model", str(file), "--output", str(out), "--quiet", *flags])


def _reference(model: Any, file: Path) -> NemotronHForCausalLM:
    config = model.config
    rebuilt = NemotronHForCausalLM(config).eval()
    rebuilt.load_state_dict(dequantized_state_dict(file), strict=True)
    return rebuilt


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("gguf_sidecars")
    input_scales = {
        "blk.0.ssm_in.input_scale": np.array([0.02], np.float32),
        "blk.1.ffn_up_exps.input_scale": np.full(8, 0.03, np.float32),
    }
    out = {}
    for key in CASES:
        files, model = _write(tmp, key, input_scales if key == "moe" else None)
        out[key] = {"files": files, "model": model, "tmp": tmp}
    return out


@pytest.mark.parametrize(
    "flags",
    [("--weights-backend", "standard"), ("--weights-backend", "ort"), ("--dequantize",)],
    ids=["standard", "ort", "dequantize"],
)
@pytest.mark.parametrize("key", list(CASES))
def test_scaled_weights_match_transformers(
    written: dict[str, Any], key: str, flags: tuple[str, ...], tmp_path: Path
) -> None:
    entry = written[key]
    package = tmp_path / "package"
    assert _export(entry["files"][0], package, *flags) == 0
    config = NemotronHConfig.from_file(package)
    reference = _reference(entry["model"], entry["files"][0])
    run = drive_parity(reference, config, package, prompt_length=9, decode_steps=5)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [str(c) for c in failures[:8]]
    assert run.exported_tokens == run.reference_tokens

    manifest = json.loads((package / "manifest.json").read_text())
    initializers = manifest["graphs"]["decoder"]["initializers"]
    scaled = [n for n in initializers if n.endswith("_output_scale")]
    assert len(scaled) == len(SCALED[key])
    for name in scaled:
        assert (
            initializers[name]["dtype"] == "FLOAT" and initializers[name]["transform"] == "identity"
        )
    assert verify_package(package, entry["files"][0]).ok


def test_input_scales_are_listed_unused(written: dict[str, Any], tmp_path: Path) -> None:
    entry = written["moe"]
    package = tmp_path / "package"
    assert _export(entry["files"][0], package) == 0
    manifest = json.loads((package / "manifest.json").read_text())
    unused = manifest["unused"]
    for name in ("blk.0.ssm_in.input_scale", "blk.1.ffn_up_exps.input_scale"):
        assert "weight-only" in unused[name]["reason"], unused


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"blk.0.attn_norm.scale": np.array([2.0], np.float32)}, "attn_norm takes no scale"),
        ({"token_embd.scale": np.array([2.0], np.float32)}, "token_embd takes no scale"),
        ({"output.scale": np.array([2.0], np.float32)}, "output.weight is Q8_0"),
        ({"blk.0.attn_q.scale": np.array([2.0], np.float32)}, "there is no blk.0.attn_q.weight"),
        ({"blk.1.attn_v.scale": np.ones(3, np.float32)}, "expected [1]"),
        ({"blk.2.ffn_up.input_scale": np.ones(2, np.float32)}, "expected [1]"),
        ({"blk.0.ssm_in.input_scale": np.ones(1, np.float16)}, "stored F16"),
    ],
)
def test_a_scale_on_any_other_tensor_is_one_clear_error(
    extra: dict[str, np.ndarray], message: str, tmp_path: Path, capsys
) -> None:
    files, _ = _write(tmp_path, "hybrid", extra)
    out = tmp_path / "out"
    assert _export(files[0], out) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_f16_graph_computes_scaled_products_in_float32(tmp_path: Path) -> None:
    """A scale of 2e-6 (ModelOpt's weight_scale_2 is amax / 2688: a few 1e-6 for small
    weights) makes the stored weights and unscaled products ~5e5 times the real ones, past
    float16's 65504. The scaled linears compute in FP32 and round once: every multiply by a
    scale is followed by the one cast to float16 (graph structure; onnxruntime's CPU provider
    runs float16 Gemm in float32 anyway, so CPU numbers alone would not show it), and the f16
    package's prefill logits are within the release gates."""
    import torch

    from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, compare
    from mobius_lite.run.decoder_session import DecoderSession
    from reference_fixtures.nemotron_reference import pinned_torch

    overrides, arch = CASES["hybrid"]
    model = make_reference(overrides)
    tiny = {f"{n}.weight": np.array([2e-6], np.float32) for n in SCALED["hybrid"]}
    files = write_gguf(tmp_path / "tiny.gguf", model, arch, TYPES, scales=tiny)
    package = tmp_path / "f16"
    assert _export(files[0], package, "--dtype", "f16") == 0
    config = NemotronHConfig.from_file(package)
    ids = np.random.default_rng(1).integers(3, config.vocab_size, size=(1, 9))
    session = DecoderSession(package / "model.onnx")
    ours = session.step(ids)["logits"]
    with pinned_torch():
        expected = _reference(model, files[0])(torch.from_numpy(ids)).logits.float().numpy()
    result = compare("f16 prefill logits", ours, expected)
    assert result.passes(RELEASE_NRMSE, RELEASE_COSINE), result

    graph = onnx.load(package / "model.onnx", load_external_data=False).graph
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    scaled = [n for n in graph.node if any(i.endswith("_output_scale") for i in n.input)]
    assert len(scaled) == len(SCALED["hybrid"])
    for node in scaled:
        assert node.op_type == "Mul"
        (after,) = consumers[node.output[0]]
        to = next(a.i for a in after.attribute if a.name == "to") if after.op_type == "Cast" else 0
        assert to == onnx.TensorProto.FLOAT16, (node.name, after.op_type)
