"""An Omni ModelOpt NVFP4 checkpoint that packs more than the fixtures' recipe: its MTP head
(`language_model.mtp.*`) and its vision tower's linears stored NVFP4, the config no longer
excluding `vision_model*` (docs/modelopt.md, "Omni checkpoints"). Which layout NVIDIA's Omni
releases use was not seen; both build as they are. The vision encoder and mtp.onnx hold the
stored codes, verify passes, and against transformers' Omni model and the independent head
reference (reference_fixtures/mtp_reference.py) on the weights decoded with ml_dtypes: the
image features, the decoder's prefill and cached steps of an image prompt, and the head's
arrays are within the FP32 gates; the dense model's image features are not (the packed tower
is computed, not replaced); speculation gives the plain greedy tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import mobius_lite
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.run.omni_session import OmniSession
from mobius_lite.weights.verify import verify_package
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.mtp_fixtures import (
    drive_head_parity,
    global_head_shape,
    head_reference,
    head_tensors,
    omni_embedder,
)
from reference_fixtures.nemotron_reference import pinned_torch
from test_modelopt_omni import EXPERT, TEXT, _image_prompt
from test_omni_package import drive, images, make_omni

pytestmark = pytest.mark.slow

LANGUAGE = mf.OMNI_LANGUAGE
HEAD = LANGUAGE + "mtp."
VISION = "vision_model."


def _pack(tensors: dict[str, np.ndarray], name: str, weight: np.ndarray) -> None:
    """Store one linear's weight as ModelOpt NVFP4 (codes, block and global scales, the
    static activation scale calibration writes, and a KV scale beside k_proj / v_proj as the
    recipe's FP8 KV cache has), in place of its dense weight."""
    module = name.removesuffix(".weight")
    tensors.pop(name, None)
    for suffix, value in mf.quantize_nvfp4(weight).items():
        tensors[f"{module}.{suffix}"] = value
    tensors[f"{module}.input_scale"] = np.array(0.01, np.float32)
    if module.startswith(LANGUAGE) and module.endswith(("k_proj", "v_proj")):
        tensors[f"{module}.{module[-6]}_scale"] = np.array(0.05, np.float32)


def _packable(name: str, weight: np.ndarray) -> bool:
    """A linear weight NVFP4 can hold: 2-D, rows of whole 16-blocks (the router's single
    row stays dense, as ModelOpt keeps routers)."""
    return (
        name.endswith(".weight")
        and weight.ndim == 2
        and weight.shape[0] > 1
        and (weight.shape[1] % 16 == 0)
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The checkpoint (the fixtures' NVFP4 Omni, then a random head and the vision tower's
    linears packed), its package, and the references on the decoded weights."""
    root = tmp_path_factory.mktemp("modelopt_omni_packed")
    model = make_omni(audio=True, final_layernorm=True, rate=0.4, seed=0, text_overrides=TEXT)
    checkpoint = root / "checkpoint"
    mf.write_omni_checkpoint(model, "nvfp4", checkpoint)
    tensors = mf.read_tensors(checkpoint)
    head = head_tensors(global_head_shape(model.language_model.config), np.random.default_rng(9))
    for name, weight in head.items():
        if _packable(name, weight) and name.endswith("_proj.weight"):
            _pack(tensors, LANGUAGE + name, weight)
        else:
            tensors[LANGUAGE + name] = weight
    tower = [n for n, w in tensors.items() if n.startswith(VISION) and _packable(n, w)]
    for name in tower:
        _pack(tensors, name, tensors[name])
    mf.save_tensors(tensors, checkpoint / "model.safetensors")
    for file in ("config.json", "hf_quant_config.json"):
        raw = json.loads((checkpoint / file).read_text())
        body = raw["quantization_config"] if file == "config.json" else raw
        body = body.get("quantization", body)
        body["exclude_modules"] = [e for e in body["exclude_modules"] if e != "vision_model*"]
        (checkpoint / file).write_text(json.dumps(raw))
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    reference = mf.dense_omni_reference(checkpoint, root / "decoded")
    return {
        "checkpoint": checkpoint,
        "package": package,
        "model": model,
        "reference": reference,
        "decoded": mf.read_tensors(root / "decoded"),
        "stored": mf.read_tensors(checkpoint),
        "tower": tower,
    }


def _initializer_bytes(path: Path) -> dict[str, bytes]:
    model = onnx.load(str(path))
    return {t.name: onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer}


def _bound_names(package: Path) -> dict[str, str]:
    """Checkpoint tensor name -> the initializer it is bound to (the manifest's record; the
    graphs use transformers' module names, the checkpoint the released ones)."""
    sources = json.loads((package / "manifest.json").read_text())["sources"]
    return {name: entry["initializer"] for name, entry in sources.items()}


def _stored_codes(work: dict[str, Any], prefix: str) -> dict[str, np.ndarray]:
    """The checkpoint's NVFP4 codes under `prefix` (U8 weights)."""
    return {
        n: t
        for n, t in work["stored"].items()
        if n.startswith(prefix) and n.endswith(".weight") and t.dtype == np.uint8
    }


def test_verify_passes(work) -> None:
    assert verify_package(work["package"], work["checkpoint"]).ok


def test_the_packed_tower_keeps_its_codes_and_computes_them(work) -> None:
    """The vision and video encoders hold every packed vision linear's codes as stored; the image
    features equal transformers' on the decoded weights within the FP32 gates, and differ
    from the dense model's beyond them; an image prompt's prefill and cached steps match."""
    codes = _stored_codes(work, VISION)
    assert len(codes) == len(work["tower"]) > 0
    graph = {
        **_initializer_bytes(work["package"] / "vision_encoder.onnx"),
        **_initializer_bytes(work["package"] / "video_encoder.onnx"),
    }
    bound = _bound_names(work["package"])
    for name, array in codes.items():
        assert graph[bound[name]] == np.ascontiguousarray(array).tobytes(), name

    pixels, grid = images(1)
    session = ort.InferenceSession(
        str(work["package"] / "vision_encoder.onnx"), providers=["CPUExecutionProvider"]
    )
    (features,) = session.run(None, {"pixel_values": pixels, "image_grid_hw": grid})
    with pinned_torch(), torch.no_grad():
        args = (torch.from_numpy(pixels), torch.from_numpy(grid))
        decoded = torch.cat(work["reference"].get_image_features(*args).pooler_output).numpy()
        dense = torch.cat(work["model"].get_image_features(*args).pooler_output).numpy()
    assert compare("image_features", features, decoded).passes(FP32_NRMSE, FP32_COSINE)
    assert not compare("image_features", features, dense).passes(FP32_NRMSE, FP32_COSINE)

    ids, media, kwargs = _image_prompt()
    drive(work["reference"], OmniSession(work["package"]), ids, media, kwargs)


def test_the_packed_head_keeps_its_codes_and_matches_the_head_reference(work) -> None:
    """mtp.onnx holds the head's NVFP4 codes as stored (the routed experts' in their slices
    of the stacked initializers); the head's arrays match the head
    reference on the decoded weights (prefill and 5 cached steps) within the FP32 gates."""
    codes = _stored_codes(work, HEAD)
    assert codes
    graph = _initializer_bytes(work["package"] / "mtp.onnx")
    bound = _bound_names(work["package"])
    for name, array in codes.items():
        raw = np.ascontiguousarray(array).tobytes()
        data = graph[bound[name]]
        expert = EXPERT.match(name)
        if expert is not None:  # routed experts are stacked: slice e of the initializer
            e = int(expert["e"])
            data = data[e * len(raw) : (e + 1) * len(raw)]
        assert data == raw, name

    head = {n.removeprefix(LANGUAGE): t for n, t in work["decoded"].items() if n.startswith(HEAD)}
    text = work["reference"].language_model
    package = work["package"]
    config = OmniSession(package).config.text
    with torch.no_grad():
        comparisons = drive_head_parity(
            text, head_reference(text, head), package, config, decoder_input=omni_embedder(package)
        )
    assert comparisons
    failing = [c.name for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]
    assert failing == []


def test_speculation_gives_the_plain_tokens(work) -> None:
    ids, media, _ = _image_prompt()
    session = OmniSession(work["package"])
    plain = session.generate(ids, media, 24)
    tokens, _, stats = session.generate_speculative(ids, media, 24, 2, adaptive=False)
    assert tokens == plain.tokens and stats.proposed > 0
