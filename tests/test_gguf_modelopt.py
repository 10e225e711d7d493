"""A GGUF written as llama.cpp's converter writes it from a ModelOpt NVFP4 (and a
MIXED_PRECISION) checkpoint (reference_fixtures/gguf_nvfp4_fixtures.py) exports to a package
whose numbers match the package built from the ModelOpt checkpoint directly: every logits /
K / V / conv / SSM array at prefill and 5 cached steps within the FP32 gates, the same greedy
tokens. The repack itself is checked against ModelOpt's own dequantization, value for value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, Comparison, compare
from mobius_lite.run.decoder_session import DecoderSession
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.gguf_nvfp4_fixtures import write_modelopt_gguf

# Every linear's input width a whole number of NVFP4 superblocks (64): hidden, d_inner,
# heads x head_dim, expert and shared widths.
WIDE = {
    "hidden_size": 64,
    "mamba_head_dim": 16,
    "head_dim": 16,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
}
PROMPT, STEPS = 9, 5


@pytest.fixture(scope="module", params=["nvfp4", "mixed"])
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    variant = request.param
    root = tmp_path_factory.mktemp(f"gguf_modelopt_{variant}")
    checkpoint = root / "checkpoint"
    mf.write_checkpoint(variant, checkpoint, overrides=WIDE)
    (file,), _ = write_modelopt_gguf(checkpoint, root / f"{variant}.gguf", root)
    direct = root / "direct"
    assert main(["build", "--model", str(checkpoint), "--output", str(direct), "-q"]) == 0
    return {"variant": variant, "checkpoint": checkpoint, "file": file, "direct": direct}


def test_repacked_blocks_times_scale_are_modelopts_values(converted: dict[str, Any]) -> None:
    """gguf-py's NVFP4 decode of each repacked weight times its `.scale` equals ModelOpt's
    (e2m1 x e4m3) x weight_scale_2 exactly (q / k rows in the converter's permuted order are
    compared as a set of rows); a weight without `.scale` has weight_scale_2 = 1."""
    dense = mf.dequantized_state_dict(converted["checkpoint"])
    tensors = {t.name: t for t in gguf.GGUFReader(converted["file"]).tensors}
    checked = 0
    for name, tensor in tensors.items():
        if tensor.tensor_type.name != "NVFP4":
            continue
        values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        scale = tensors.get(name.removesuffix(".weight") + ".scale")
        if scale is not None:
            s = np.asarray(scale.data, np.float32)
            values = values * (s.reshape(-1, 1, 1) if values.ndim == 3 else s[0])
        expected = _modelopt_values(dense, name)
        if name.split(".")[-2] in ("attn_q", "attn_k"):
            values, expected = np.sort(values, axis=0), np.sort(expected, axis=0)
        np.testing.assert_array_equal(values, expected, err_msg=name)
        checked += 1
    assert checked >= (14 if converted["variant"] == "nvfp4" else 4)


def _modelopt_values(dense: dict[str, np.ndarray], gguf_name: str) -> np.ndarray:
    layer, kind = gguf_name.split(".")[1], gguf_name.split(".")[2]
    prefix = f"backbone.layers.{layer}.mixer."
    if kind.endswith("_exps"):
        proj = "up_proj" if kind.startswith("ffn_up") else "down_proj"
        experts = sorted(
            int(n[len(prefix + "experts.") :].split(".")[0])
            for n in dense
            if n.startswith(prefix + "experts.") and n.endswith(f".{proj}.weight")
        )
        return np.stack([dense[f"{prefix}experts.{e}.{proj}.weight"] for e in experts])
    module = {
        "ssm_in": "in_proj",
        "ssm_out": "out_proj",
        "attn_q": "q_proj",
        "attn_k": "k_proj",
        "attn_v": "v_proj",
        "attn_output": "o_proj",
        "ffn_up_shexp": "shared_experts.up_proj",
        "ffn_down_shexp": "shared_experts.down_proj",
    }[kind]
    return dense[f"{prefix}{module}.weight"]


def _steps(package: Path, config: NemotronHConfig, ids: np.ndarray):
    """Prefill then STEPS greedy steps; each step's outputs and the token it picked."""
    session = DecoderSession(package / "model.onnx")
    outputs = session.step(ids)
    yield outputs
    for _ in range(STEPS):
        token = outputs["logits"][:, -1].argmax(-1)[:, None]
        outputs = session.step(token)
        yield outputs


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_package_matches_the_modelopt_package(
    converted: dict[str, Any], backend: str, tmp_path: Path
) -> None:
    """The GGUF's package on either backend against the ModelOpt package (standard: its ort
    route needs 16-bit activations)."""
    package = tmp_path / "from-gguf"
    args = ["build", "--model", str(converted["file"]), "--output", str(package), "-q"]
    assert main([*args, "--weights-backend", backend]) == 0
    config = NemotronHConfig.from_file(converted["direct"])
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(1, PROMPT))
    comparisons: list[Comparison] = []
    tokens: dict[str, list[int]] = {"gguf": [], "direct": []}
    pairs = zip(_steps(package, config, ids), _steps(converted["direct"], config, ids), strict=True)
    for step, (ours, theirs) in enumerate(pairs):
        assert set(ours) == set(theirs)
        for name in ours:
            comparisons.append(compare(f"{step}/{name}", ours[name], theirs[name]))
        tokens["gguf"].append(int(ours["logits"][0, -1].argmax()))
        tokens["direct"].append(int(theirs["logits"][0, -1].argmax()))
    # logits + K/V of one attention layer + conv/SSM of three Mamba layers, per step
    assert len(comparisons) == (1 + STEPS) * (1 + 2 + 3 * 2)
    failures = [c for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]
    assert not failures, [str(c) for c in failures[:8]]
    assert tokens["gguf"] == tokens["direct"]
