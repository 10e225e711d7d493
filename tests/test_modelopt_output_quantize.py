"""`mobius build --quantize-output TYPE` alone on ModelOpt checkpoints (docs/modelopt.md): lm_head,
which the releases keep dense, is quantized at export; every packed weight stays as stored.

The tiny NVFP4 / FP8 / MIXED_PRECISION checkpoints of reference_fixtures/modelopt_fixtures.py
(lm_head dense FP32 there, BF16 in the releases). Oracles, none of them the export's code:
gguf-py's `gguf.quants.quantize` (q8_0 and q4_0 bytes, bit-exact with ggml's reference quantizer);
MatMulNBits' symmetric int8 blocks written here from their definition (int8 bytes);
onnxruntime's own 4-bit quantizer, the one onnxruntime-genai's builder calls (int4 bytes);
the package built without the flag (every other initializer's bytes); transformers on the
fixtures' independently dequantized weights with lm_head replaced by the values its blocks
stand for (logits and caches under the FP32 gates); qualify, whose reference dequantizes
lm_head itself (evaluation/dense_reference.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from parity import drive_parity
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.nemotron_reference import make_reference
from test_modelopt_export import cli
from test_quantize_export import _initializers, _manifest
from test_quantize_nbits import ort_blocks, ort_dequantized

# end-to-end: builds packages and runs them against their reference
pytestmark = pytest.mark.slow

LM_HEAD = "lm_head.weight"
PROMPT = [5, 17, 33, 8, 61, 12, 40, 3, 77]
Q8_0 = gguf.GGMLQuantizationType.Q8_0
ROUTES = {"standard": (), "int8": ("--backend", "ort", "--activations", "int8")}
# (variant, --quantize-output, route) built once per module
BUILDS = [
    ("nvfp4", "q8_0", "standard"),
    ("nvfp4", "int8", "standard"),
    ("nvfp4", "q8_0", "int8"),
    ("nvfp4", "int8", "int8"),
    ("fp8", "q8_0", "standard"),
    ("fp8", "int8", "standard"),
    ("mixed", "q8_0", "standard"),
    ("mixed", "q8_0", "int8"),
    ("nvfp4", "q4_0", "standard"),
    ("nvfp4", "q4_0", "int8"),
    ("fp8", "int4", "standard"),
]
GGML_TYPES = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The checkpoints, and their packages by (variant, output type or None, route)."""
    root = tmp_path_factory.mktemp("modelopt_output")
    out: dict[str, Any] = {"root": root, "packages": {}}
    for variant in {v for v, _, _ in BUILDS}:
        mf.write_checkpoint(variant, root / variant)
    for variant, qtype, route in BUILDS:
        for flag in (qtype, None):
            if (variant, flag, route) in out["packages"]:
                continue
            package = root / f"{variant}-{flag}-{route}"
            args = ["build", "--model", str(root / variant), "--output", str(package), "-q"]
            extra = [] if flag is None else ["--quantize-output", flag]
            assert main([*args, *extra, *ROUTES[route]]) == 0
            out["packages"][variant, flag, route] = package
    return out


def _lm_head(work: dict[str, Any], variant: str) -> np.ndarray:
    return mf.read_tensors(work["root"] / variant)[LM_HEAD].astype(np.float32)


def int8_blocks(w: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' symmetric int8 blocks by definition (onnxruntime-genai's builder, MLAS'
    quantizer): per block, m = its max if |max| > |min| else its min, scale = m / -128,
    code = clip(roundf(x * (1 / scale) + 128), 0, 255), roundf taking halves away from zero;
    B uint8 [N, K / block, block], scales float32 [N, K / block]."""
    x = w.astype(np.float32).reshape(len(w), -1, block)
    low, high = x.min(axis=-1), x.max(axis=-1)
    scale = (np.where(np.abs(high) > np.abs(low), high, low) / np.float32(-128)).astype(np.float32)
    inverse = np.where(scale != 0, np.float32(1) / np.where(scale != 0, scale, 1), 0)
    shifted = x * inverse.astype(np.float32)[..., None] + np.float32(128)
    magnitude = np.abs(shifted).astype(np.float64)  # + 0.5 exact in float64
    roundf = np.sign(shifted) * np.floor(magnitude + 0.5)
    return np.clip(roundf, 0, 255).astype(np.uint8), scale


def dequantized_lm_head(w: np.ndarray, qtype: str) -> np.ndarray:
    """The values lm_head's blocks stand for: gguf-py's Q8_0 / Q4_0 round trip, or the int8
    / int4 blocks' (code - zero point) * scale."""
    if qtype in GGML_TYPES:
        kind = GGML_TYPES[qtype]
        return gguf.quants.dequantize(gguf.quants.quantize(w, kind), kind).reshape(w.shape)
    if qtype == "int4":
        return ort_dequantized(w, 4, 32, symmetric=True)
    codes, scales = int8_blocks(w)
    return ((codes.astype(np.float32) - 128) * scales[..., None]).reshape(w.shape)


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("variant", ["nvfp4", "fp8", "mixed"])
def test_lm_head_is_llama_cpps_q8_0_and_recorded(work: dict[str, Any], variant: str) -> None:
    package = work["packages"][variant, "q8_0", "standard"]
    expected = gguf.quants.quantize(_lm_head(work, variant), Q8_0).tobytes()
    assert _initializers(package)[LM_HEAD] == ("UINT8", expected)
    manifest = _manifest(package)
    recipe = {"type": "q8_0", "block": 32, "symmetric": True}
    assert manifest["quantization"] == {"weights": None, "output": recipe, "fallbacks": []}
    quantized = {n: e["quantize"] for n, e in manifest["sources"].items() if "quantize" in e}
    assert quantized == {LM_HEAD: recipe}


def test_lm_head_on_matmulnbits_holds_the_q8_0_blocks(work: dict[str, Any]) -> None:
    """The int8 route re-lays Q8_0 losslessly for MatMulNBits: codes + 128, fp16 d as f32."""
    package = work["packages"]["nvfp4", "q8_0", "int8"]
    blocks = gguf.quants.quantize(_lm_head(work, "nvfp4"), Q8_0).reshape(-1, 34)
    written = _initializers(package)
    codes = (blocks[:, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    assert written[LM_HEAD + "_nbx_b"] == ("UINT8", codes.tobytes())
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    assert written[LM_HEAD + "_nbx_scales"] == ("FLOAT", scales.tobytes())


@pytest.mark.parametrize("variant, route", [("nvfp4", "standard"), ("fp8", "standard")])
def test_lm_head_int8_is_the_matmulnbits_definition(
    work: dict[str, Any], variant: str, route: str
) -> None:
    package = work["packages"][variant, "int8", route]
    codes, scales = int8_blocks(_lm_head(work, variant))
    written = _initializers(package)
    assert written[LM_HEAD + "_q_b"] == ("UINT8", codes.tobytes())
    assert written[LM_HEAD + "_q_scales"] == ("FLOAT", scales.tobytes())


def test_lm_head_is_llama_cpps_q4_0(work: dict[str, Any]) -> None:
    package = work["packages"]["nvfp4", "q4_0", "standard"]
    expected = gguf.quants.quantize(_lm_head(work, "nvfp4"), GGML_TYPES["q4_0"]).tobytes()
    assert _initializers(package)[LM_HEAD] == ("UINT8", expected)
    recipe = {"type": "q4_0", "block": 32, "symmetric": True}
    assert _manifest(package)["quantization"]["output"] == recipe


def test_lm_head_int4_is_onnxruntimes_quantizer(work: dict[str, Any]) -> None:
    package = work["packages"]["fp8", "int4", "standard"]
    packed, scales, _ = ort_blocks(_lm_head(work, "fp8"), 4, 32, symmetric=True)
    written = _initializers(package)
    assert written[LM_HEAD + "_q_b"] == ("UINT8", packed.tobytes())
    assert written[LM_HEAD + "_q_scales"] == ("FLOAT", scales.tobytes())
    recipe = {"type": "int4", "block": 32, "symmetric": True}
    assert _manifest(package)["quantization"]["output"] == recipe


@pytest.mark.parametrize("variant, qtype, route", BUILDS)
def test_every_other_tensor_is_the_package_without_the_flag(
    work: dict[str, Any], variant: str, qtype: str, route: str
) -> None:
    ours = _initializers(work["packages"][variant, qtype, route])
    plain = _initializers(work["packages"][variant, None, route])
    assert LM_HEAD in plain  # the plain package keeps lm_head dense
    others = {n for n in plain if n != LM_HEAD}
    assert {n for n in ours if not n.startswith(LM_HEAD)} == others
    assert [n for n in others if ours[n] != plain[n]] == []
    sources, plain_sources = (
        _manifest(work["packages"][variant, f, route])["sources"] for f in (qtype, None)
    )
    assert {n: e["sha256"] for n, e in sources.items()} == {
        n: e["sha256"] for n, e in plain_sources.items()
    }


# ----------------------------------------------------------------------------- verify
@pytest.mark.parametrize(
    "variant, qtype, route, target",
    [
        ("nvfp4", "q8_0", "standard", LM_HEAD),
        ("nvfp4", "q8_0", "int8", LM_HEAD + "_nbx_b"),
        ("nvfp4", "q4_0", "standard", LM_HEAD),
        ("fp8", "int4", "standard", LM_HEAD + "_q_b"),
    ],
)
def test_verify_rederives_lm_head_and_catches_a_flipped_byte(
    work: dict[str, Any], variant: str, qtype: str, route: str, target: str, tmp_path: Path, capsys
) -> None:
    package, source = work["packages"][variant, qtype, route], work["root"] / variant
    code, err = cli(["verify", str(package), "--source", str(source), "-q"], capsys)
    assert code == 0, err
    copy = tmp_path / "flipped"
    shutil.copytree(package, copy)
    spot = _manifest(copy)["graphs"]["decoder"]["initializers"][target]
    data = bytearray((copy / spot["file"]).read_bytes())
    data[spot["offset"] + 5] ^= 0x01
    (copy / spot["file"]).write_bytes(bytes(data))
    flipped = verify_package(copy, source)
    assert [m for m in flipped.mismatches if target in m and "differ" in m], flipped.mismatches
    code, _ = cli(["verify", str(copy), "--source", str(source), "-q"], capsys)
    assert code == 1


def test_inspect_says_lm_head_only(work: dict[str, Any], capsys) -> None:
    package = work["packages"]["nvfp4", "q8_0", "standard"]
    capsys.readouterr()
    assert main(["inspect", str(package)]) == 0
    out = capsys.readouterr().out
    assert "quantized at export: lm_head q8_0 only" in out
    assert "float32 -> quantize q8_0 (block 32, symmetric): 1 tensors" in out


# ----------------------------------------------------------------------------- numerics
def _reference(work: dict[str, Any], variant: str, qtype: str, out: Path) -> Any:
    """transformers on the fixtures' dequantized weights, lm_head as its blocks stand for."""
    from transformers import NemotronHForCausalLM

    checkpoint = work["root"] / variant
    tensors = mf.dequantized_state_dict(checkpoint)
    tensors[LM_HEAD] = dequantized_lm_head(tensors[LM_HEAD], qtype)
    out.mkdir(parents=True)
    config = json.loads((checkpoint / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, out / "model.safetensors")
    model = NemotronHForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model.eval()


@pytest.mark.parametrize(
    "variant, qtype",
    [
        ("nvfp4", "q8_0"),
        ("fp8", "int8"),
        ("mixed", "q8_0"),
        ("nvfp4", "int8"),
        ("nvfp4", "q4_0"),
        ("fp8", "int4"),
    ],
)
def test_matches_transformers_on_the_dequantized_lm_head(
    work: dict[str, Any], variant: str, qtype: str, tmp_path: Path
) -> None:
    package = work["packages"][variant, qtype, "standard"]
    reference = _reference(work, variant, qtype, tmp_path / "reference")
    config = NemotronHConfig.from_file(work["root"] / variant)
    run = drive_parity(reference, config, package)
    assert len({c.name.split("/")[0] for c in run.comparisons}) == 6  # prefill + 5 steps
    assert run.failures(FP32_NRMSE, FP32_COSINE) == []
    assert run.exported_tokens == run.reference_tokens
    # the quantization is visible: the plain package's logits differ beyond the gates
    plain = drive_parity(reference, config, work["packages"][variant, None, "standard"])
    assert any(c.name.endswith("logits") for c in plain.failures(FP32_NRMSE, FP32_COSINE))


def test_qualify_dequantizes_lm_head_in_its_reference(work: dict[str, Any], tmp_path) -> None:
    from mobius_lite.evaluation.qualify import qualify
    from mobius_lite.evaluation.qualify_report import VERDICTS

    package = work["packages"]["nvfp4", "q8_0", "standard"]
    report = qualify(
        package, work["root"] / "nvfp4", prompt_ids=PROMPT, steps=2, output=tmp_path / "q"
    )
    statuses = {name: report.verdicts[name].status for name in VERDICTS}
    assert statuses == dict.fromkeys(VERDICTS, "PASS"), report.as_dict()
    assert report.run["quantization_error"]["logits_nrmse_max"] > FP32_NRMSE


def test_a_dense_checkpoint_quantizes_lm_head_alone(tmp_path: Path) -> None:
    """The output-only plan on a dense safetensors checkpoint: lm_head q8_0, the rest as is."""
    from safetensors.numpy import load_file

    model = make_reference({"layers_block_type": ["mamba", "attention"], "hidden_size": 64})
    model.save_pretrained(tmp_path / "ckpt")
    package = tmp_path / "pkg"
    args = ["build", "--model", str(tmp_path / "ckpt"), "--output", str(package), "-q"]
    assert main([*args, "--quantize-output", "q8_0"]) == 0
    checkpoint = load_file(tmp_path / "ckpt" / "model.safetensors")
    written = _initializers(package)
    expected = gguf.quants.quantize(checkpoint[LM_HEAD], Q8_0).tobytes()
    assert written.pop(LM_HEAD) == ("UINT8", expected)
    assert all(dtype == "FLOAT" for dtype, _ in written.values()), written.keys()
    assert verify_package(package, tmp_path / "ckpt").ok


# ----------------------------------------------------------------------------- refusals
def _refused(args: list[str], said: str, out: Path, capsys) -> None:
    capsys.readouterr()
    code, err = cli([*args, "--output", str(out)], capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and said in lines[0], lines
    assert not out.exists()


def test_a_gguf_source_is_refused_with_one_line(tmp_path: Path, capsys) -> None:
    model = make_reference({"layers_block_type": ["mamba", "attention"]})
    (path,) = write_gguf(tmp_path / "tiny.gguf", model, "nemotron_h", {r"weight$": "Q8_0"})
    args = ["build", "--model", str(path), "--quantize-output", "q8_0"]
    _refused(args, "already stored as a GGUF type", tmp_path / "pkg", capsys)


def test_a_packed_lm_head_is_refused_with_one_line(tmp_path: Path, capsys) -> None:
    """lm_head quantized to NVFP4 (not excluded by the config): nothing dense to quantize."""

    def quantize_lm_head(tensors, config, hf) -> None:
        for key, value in mf.quantize_nvfp4(tensors.pop(LM_HEAD)).items():
            tensors[f"lm_head.{key}"] = value
        config["quantization_config"]["ignore"] = []
        hf["quantization"]["exclude_modules"] = []

    mf.write_checkpoint("nvfp4", tmp_path / "ckpt", edit=quantize_lm_head)
    args = ["build", "--model", str(tmp_path / "ckpt"), "--quantize-output", "q8_0"]
    _refused(args, "stores lm_head as NVFP4", tmp_path / "pkg", capsys)


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--quantize", "q8_0", "--quantize-output", "q8_0"], "already packed"),
        (["--quantize", "int8"], "already packed"),
        (["--quantize-output", "q8_0", "--dequantize"], "exclude each other"),
    ],
)
def test_quantize_on_a_modelopt_source_stays_refused(
    work: dict[str, Any], tmp_path: Path, capsys, flags: list[str], said: str
) -> None:
    args = ["build", "--model", str(work["root"] / "fp8"), *flags]
    _refused(args, said, tmp_path / "pkg", capsys)


def test_a_tied_checkpoint_has_no_lm_head_to_quantize(tmp_path: Path, capsys) -> None:
    """A tied checkpoint stored without lm_head.weight (its logits use the embedding table)."""
    from safetensors.numpy import load_file

    model = make_reference(
        {"layers_block_type": ["mamba", "attention"], "tie_word_embeddings": True}
    )
    model.save_pretrained(tmp_path / "ckpt")
    file = tmp_path / "ckpt" / "model.safetensors"
    tensors = load_file(file)
    tensors.pop(LM_HEAD, None)
    save_file(tensors, file, metadata={"format": "pt"})
    args = ["build", "--model", str(tmp_path / "ckpt"), "--quantize-output", "q8_0"]
    _refused(args, "no lm_head.weight", tmp_path / "pkg", capsys)
