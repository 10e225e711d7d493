"""`mobius build --quantize int4 | int8` (docs/quantize.md): onnxruntime-genai's builder's
MatMulNBits blocks.

Oracles: onnxruntime's own `quantize_matmul_4bits` / `quantize_matmul_8bits` (the quantizer
the builder calls) for the bytes; transformers running the weights those bytes stand for
(decoded with numpy from MatMulNBits' definition, (code - zero point) * scale) for the
logits and every cache array, under the FP32 gates; the CUDA build by its structure (ONNX
checker, operator domains and dtypes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from onnxruntime.capi import _pybind_state as ort_c
from safetensors.numpy import load_file, save_file
from transformers import NemotronHForCausalLM

from mobius_lite.cli.main import main
from mobius_lite.configs.loader import load_config_file
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from parity import drive_parity
from reference_fixtures.nemotron_reference import make_reference

pytestmark = pytest.mark.slow

MOE = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "hidden_size": 64,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "head_dim": 16,
    "vocab_size": 96,
}
VARIANTS = {
    "int4": ["--quantize", "int4"],
    "int4-asym-b16": ["--quantize", "int4", "--quantize-asymmetric", "--quantize-block-size", "16"],
    "int8-b64": ["--quantize", "int8", "--quantize-block-size", "64"],
    "int8": ["--quantize", "int8"],
    "int4-head8": ["--quantize", "int4", "--quantize-output", "int8"],
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("nbits")
    make_reference(MOE).save_pretrained(tmp / "ckpt")
    return {"tmp": tmp, "packages": {}}


def _package(work: dict[str, Any], variant: str, backend: str, *extra: str) -> Path:
    key = (variant, backend, extra)
    if key not in work["packages"]:
        out = work["tmp"] / "-".join([variant, backend, *extra]).replace("--", "")
        args = ["build", "--model", str(work["tmp"] / "ckpt"), "--output", str(out), "-q"]
        assert main([*args, *VARIANTS[variant], "--backend", backend, *extra]) == 0
        work["packages"][key] = out
    return work["packages"][key]


def ort_blocks(
    w: np.ndarray, bits: int, block: int, symmetric: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's own quantizer (the one onnxruntime-genai's builder calls) on w [N, K]:
    B uint8 [N, K / block, block * bits / 8] (4 bits: two codes a byte, low nibble first),
    scales float32 [N, K / block], packed zero points."""
    n, k = w.shape
    k_blocks = k // block
    b = np.zeros((n, k_blocks, block * bits // 8), np.uint8)
    zero = np.zeros((n, (k_blocks * bits + 7) // 8), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    quantize = ort_c.quantize_matmul_8bits if bits == 8 else ort_c.quantize_matmul_4bits
    quantize(b, np.ascontiguousarray(w.T, np.float32), scales, zero, block, n, k, symmetric)
    return b, scales, zero


def ort_dequantized(w: np.ndarray, bits: int, block: int, symmetric: bool) -> np.ndarray:
    """onnxruntime's quantizer on w [N, K], decoded by MatMulNBits' definition."""
    n, k = w.shape
    k_blocks = k // block
    b, scales, zero = ort_blocks(w, bits, block, symmetric)
    if bits == 4:
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, k_blocks, block)
        zp = np.stack([zero & 15, zero >> 4], axis=-1).reshape(n, -1)[:, :k_blocks]
    else:
        codes, zp = b, zero
    zp = zp if not symmetric else np.full((n, k_blocks), 1 << (bits - 1))
    values = (codes.astype(np.float32) - zp[..., None]) * scales[..., None]
    return values.reshape(n, k)


def _manifest(package: Path) -> dict[str, Any]:
    return json.loads((package / "manifest.json").read_text())


def _reference(work: dict[str, Any], package: Path, dequantize: bool) -> NemotronHForCausalLM:
    """transformers on the checkpoint, with every tensor the package quantized replaced by its
    dequantized value (or as is)."""
    tensors = load_file(work["tmp"] / "ckpt" / "model.safetensors")
    if dequantize:
        for name, entry in _manifest(package)["sources"].items():
            recipe = entry.get("quantize")
            if recipe is not None:
                bits = 8 if recipe["type"] == "int8" else 4
                tensors[name] = ort_dequantized(
                    tensors[name], bits, recipe["block"], recipe["symmetric"]
                )
    directory = package.parent / f"{package.name}-ref-{dequantize}"
    directory.mkdir(exist_ok=True)
    (directory / "config.json").write_bytes((work["tmp"] / "ckpt" / "config.json").read_bytes())
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    model = NemotronHForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).eval()
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "int8"])
@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_the_graph_computes_what_its_weights_say(
    work: dict[str, Any], variant: str, backend: str
) -> None:
    package = _package(work, variant, backend)
    report = verify_package(package, work["tmp"] / "ckpt")  # bytes: onnxruntime's quantizer
    assert report.ok, report.mismatches
    config = load_config_file(package)
    run = drive_parity(_reference(work, package, True), config, package, prompt_length=9)
    assert all(c.finite for c in run.comparisons)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [(c.name, c.nrmse, c.cosine) for c in failures[:5]]


def test_which_tensors_and_what_layout(work: dict[str, Any]) -> None:
    package = _package(work, "int4-head8", "ort")
    manifest = _manifest(package)
    recipes = {n: e["quantize"] for n, e in manifest["sources"].items() if "quantize" in e}
    assert recipes["lm_head.weight"] == {"type": "int8", "block": 32, "symmetric": True}
    assert recipes["backbone.layers.0.mixer.in_proj.weight"]["type"] == "int4"
    assert "backbone.embeddings.weight" not in recipes  # the builder quantizes MatMuls only
    assert not any("gate.weight" in n or "conv1d" in n or "norm" in n for n in recipes)
    model = onnx.load(str(package / "model.onnx"), load_external_data=False)
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and all(n.domain == "com.microsoft" for n in nbits)
    bits = {dict((a.name, a.i) for a in n.attribute)["bits"] for n in nbits}
    assert bits == {4, 8}  # lm_head at 8 bits


@pytest.mark.parametrize("variant", ["int4", "int4-asym-b16", "int8-b64"])
def test_cuda_f16_packages_are_well_formed(work: dict[str, Any], variant: str) -> None:
    """--ep cuda --dtype f16 --backend ort: MatMulNBits (com.microsoft) with f16 activations
    and scales; no GPU needed to check the structure (benchmarks/gpu_check.py runs it)."""
    package = _package(work, variant, "ort", "--ep", "cuda", "--dtype", "f16")
    model = onnx.load(str(package / "model.onnx"))
    onnx.checker.check_model(model)
    initializers = {t.name: t for t in model.graph.initializer}
    nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) >= 6 and all(n.domain == "com.microsoft" for n in nbits)
    for node in nbits:
        assert initializers[node.input[2]].data_type == onnx.TensorProto.FLOAT16  # scales
        assert initializers[node.input[1]].data_type == onnx.TensorProto.UINT8
    genai = json.loads((package / "genai_config.json").read_text())
    assert "cuda" in json.dumps(genai["model"]["decoder"]["session_options"])
    assert verify_package(package, work["tmp"] / "ckpt").ok


@pytest.mark.parametrize("variant", ["q4_0", "int4"])
def test_qualify_holds_the_graph_to_its_dequantized_weights(
    work: dict[str, Any], variant: str, tmp_path: Path
) -> None:
    """qualify: the four verdicts PASS against transformers on the dequantized weights, and
    the quantization's own error against the unquantized source is a separate figure."""
    from mobius_lite.evaluation.qualify import DEQUANTIZED_WEIGHTS, qualify

    flags = ["--quantize", variant]
    out = work["tmp"] / f"qualify-{variant}"
    args = ["build", "--model", str(work["tmp"] / "ckpt"), "--output", str(out), "-q"]
    assert main([*args, *flags]) == 0
    report = qualify(out, work["tmp"] / "ckpt", steps=3, output=tmp_path / "report")
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert statuses == dict.fromkeys(statuses, "PASS"), report.verdicts
    assert report.run["reference"]["weights"] == DEQUANTIZED_WEIGHTS
    error = report.run["quantization_error"]
    assert error["gated"] is False and len(error["steps"]) == 4  # prefill + 3 decode steps
    assert 0 < error["logits_nrmse_mean"] < 10
    assert (
        main(
            [
                "qualify",
                str(out),
                "--source",
                str(work["tmp"] / "ckpt"),
                "--steps",
                "1",
                "--output",
                str(tmp_path / "cli"),
            ]
        )
        == 0
    )


def test_qualify_a_quantized_package_with_its_mtp_head(tmp_path: Path) -> None:
    """The MTP head's reference reads the dequantized weights too (the head quantizes)."""
    from mobius_lite.evaluation.qualify import qualify
    from reference_fixtures.mtp_fixtures import write_nemotron_h_mtp_checkpoint

    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "pkg"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q"]
    assert main([*args, "--quantize", "q8_0"]) == 0
    recipes = {n for n, e in _manifest(out)["sources"].items() if "quantize" in e}
    assert "mtp.layers.0.eh_proj.weight" in recipes
    report = qualify(out, checkpoint, steps=2, output=tmp_path / "report")
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert "mtp_head" in statuses
    assert statuses == dict.fromkeys(statuses, "PASS"), report.verdicts
    assert report.run["quantization_error"]["logits_nrmse_mean"] > 0


@pytest.mark.parametrize("variant", ["int4", "int4-asym-b16"])
def test_int4_experts_on_qmoe_compute_what_their_weights_say(
    work: dict[str, Any], variant: str
) -> None:
    """--activations exact-fused: the experts on QMoE (fc1 rows twice), the linears on
    MatMulNBits, f32 activations: the FP32 gates against the dequantized weights."""
    package = _package(work, variant, "ort", "--activations", "exact-fused")
    model = onnx.load(str(package / "model.onnx"), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    assert {"QMoE", "MatMulNBits"} <= ops
    assert verify_package(package, work["tmp"] / "ckpt").ok
    config = load_config_file(package)
    run = drive_parity(_reference(work, package, True), config, package, prompt_length=9)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [(c.name, c.nrmse, c.cosine) for c in failures[:5]]


def test_int8_experts_take_qmoe_on_the_int8_route_only(work: dict[str, Any]) -> None:
    fused = _package(work, "int8", "ort", "--activations", "exact-fused")
    int8 = _package(work, "int8", "ort", "--activations", "int8")
    ops = {
        name: {
            n.op_type for n in onnx.load(str(p / "model.onnx"), load_external_data=False).graph.node
        }
        for name, p in (("fused", fused), ("int8", int8))
    }
    assert "QMoE" not in ops["fused"] and "QMoE" in ops["int8"]
    assert verify_package(int8, work["tmp"] / "ckpt").ok
