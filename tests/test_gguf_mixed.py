"""The mixed file this project exists for, in one GGUF: IQ2_XXS routed experts, Q8_0 Mamba and
attention projections, NVFP4 shared experts, latent projections and output matrix with their
`.scale` sidecars (ModelOpt-quantized, so far from 1), F16 embeddings, F32 norms. It exports
as one package whose packed bytes are the file's, and matches transformers holding gguf-py's
dequantized weights times their scales under the foundation gates on both backends and with
--dequantize."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from transformers import NemotronHForCausalLM

from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from parity import drive_parity
from reference_fixtures.gguf_fixtures import dequantized_state_dict
from reference_fixtures.gguf_nvfp4_fixtures import MIXED_NVFP4, write_mixed_gguf
from reference_fixtures.nemotron_reference import make_reference

MIXED_MODEL = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "hidden_size": 64,
    "moe_latent_size": 256,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 64,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
}
ROUTES = {
    "standard": ["--weights-backend", "standard"],
    "ort": ["--weights-backend", "ort"],
    "dequantize": ["--dequantize"],
}
EXPECTED_TYPES = {
    "ffn_up_exps": "IQ2_XXS",
    "ffn_down_exps": "IQ2_XXS",
    "ssm_in": "Q8_0",
    "ssm_out": "Q8_0",
    "attn_q": "Q8_0",
    "attn_k": "Q8_0",
    "attn_v": "Q8_0",
    "attn_output": "Q8_0",
    "ffn_up_shexp": "NVFP4",
    "ffn_down_shexp": "NVFP4",
    "ffn_latent_down": "NVFP4",
    "ffn_latent_up": "NVFP4",
    "output": "NVFP4",
    "token_embd": "F16",
    "attn_norm": "F32",
    "output_norm": "F32",
    "ssm_norm": "F32",
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gguf_mixed")
    model = make_reference(MIXED_MODEL)
    (file,) = write_mixed_gguf(root / "mixed.gguf", model)
    packages = {}
    for route, flags in ROUTES.items():
        packages[route] = root / route
        args = ["build", "--model", str(file), "--output", str(packages[route]), "-q"]
        assert main([*args, *flags]) == 0
    return {"model": model, "file": file, "packages": packages}


def _kind(name: str) -> str:
    parts = name.split(".")
    return parts[2] if name.startswith("blk.") else parts[0]


def test_the_file_is_the_mix(mixed: dict[str, Any]) -> None:
    tensors = {t.name: t for t in gguf.GGUFReader(mixed["file"]).tensors}
    for name, tensor in tensors.items():
        if name.endswith(".scale"):
            assert tensor.tensor_type.name == "F32" and list(tensor.shape) == [1]
            assert abs(float(tensor.data[0]) - 1.0) > 0.5  # ModelOpt's scale_2: ~amax / 2688
            assert MIXED_NVFP4.search(name.removesuffix(".scale") + ".weight")
        elif _kind(name) in EXPECTED_TYPES:
            assert tensor.tensor_type.name == EXPECTED_TYPES[_kind(name)], name
    scaled = {n.removesuffix(".scale") for n in tensors if n.endswith(".scale")}
    assert scaled == {n.removesuffix(".weight") for n in tensors if MIXED_NVFP4.search(n)}
    assert len(scaled) == 2 * 2 + 2 * 2 + 1  # shared up/down, latent down/up (2 layers), output


def _reference(mixed: dict[str, Any]) -> NemotronHForCausalLM:
    rebuilt = NemotronHForCausalLM(mixed["model"].config).eval()
    rebuilt.load_state_dict(dequantized_state_dict(mixed["file"]), strict=True)
    return rebuilt


@pytest.mark.parametrize("route", list(ROUTES))
def test_matches_transformers_on_the_scaled_dequantized_weights(
    mixed: dict[str, Any], route: str
) -> None:
    package = mixed["packages"][route]
    config = NemotronHConfig.from_file(package)
    run = drive_parity(_reference(mixed), config, package, prompt_length=9, decode_steps=5)
    assert len(run.comparisons) == 6 * (1 + 2 + 2)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [str(c) for c in failures[:8]]
    assert run.exported_tokens == run.reference_tokens


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_one_package_holds_the_files_packed_bytes(mixed: dict[str, Any], backend: str) -> None:
    """Every quantized tensor's bytes are in the package as they are in the file (verbatim,
    q / k rows moved whole, or Q8_0's MatMulNBits re-layout on ort), each scale is bound as an
    FP32 initializer, and verify re-derives all of them."""
    package = mixed["packages"][backend]
    manifest = json.loads((package / "manifest.json").read_text())
    sources = manifest["sources"]
    for tensor in gguf.GGUFReader(mixed["file"]).tensors:
        record = sources[tensor.name]
        data = bytes(np.asarray(tensor.data).view(np.uint8).reshape(-1))
        assert record["sha256"] == hashlib.sha256(data).hexdigest(), tensor.name
        if tensor.tensor_type.name in ("NVFP4", "IQ2_XXS"):
            assert record["transform"] == "identity", (tensor.name, record["transform"])
        if tensor.name.endswith(".scale"):
            assert record["initializer"].endswith("_output_scale")
    assert verify_package(package, mixed["file"]).ok


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_f16_package_stays_within_the_release_gates(
    mixed: dict[str, Any], backend: str, tmp_path: Path
) -> None:
    """--dtype f16 on both backends (the scaled NVFP4 linears compute in FP32 and round
    once): prefill logits against the same reference within the release gates."""
    import torch

    from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, compare
    from mobius_lite.run.decoder_session import DecoderSession
    from reference_fixtures.nemotron_reference import pinned_torch

    package = tmp_path / "f16"
    args = ["build", "--model", str(mixed["file"]), "--output", str(package), "-q"]
    assert main([*args, "--dtype", "f16", "--weights-backend", backend]) == 0
    config = NemotronHConfig.from_file(package)
    ids = np.random.default_rng(1).integers(3, config.vocab_size, size=(1, 9))
    ours = DecoderSession(package / "model.onnx").step(ids)["logits"]
    with pinned_torch():
        expected = _reference(mixed)(torch.from_numpy(ids)).logits.float().numpy()
    result = compare("f16 prefill logits", ours, expected)
    assert result.passes(RELEASE_NRMSE, RELEASE_COSINE), result
