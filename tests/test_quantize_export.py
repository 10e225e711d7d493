"""`mobius build --quantize q8_0 / q4_0` (docs/quantize.md) against llama.cpp's own pure file.

The same tiny checkpoint is exported twice: (a) from its safetensors with `--quantize TYPE`,
(b) from the pure TYPE GGUF of it that gguf_fixtures writes as llama.cpp's converter and
`llama-quantize --pure` would (gguf-py's `gguf.quants.quantize`, which is bit-exact with
ggml's reference quantizer; llama.cpp's quantizer itself is checked outside CI, in
benchmarks/investigations/quantize_vs_llamacpp.py). Both packages must hold the same
initializers with the same bytes (the stored A = -exp(A_log) of the GGUF against the
checkpoint's A_log aside) and compute the same logits on every route: standard ops,
`--backend ort` and `--activations int8`. Oracles: gguf-py (quantize), the safetensors library
(source bytes), and the GGUF package.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

from mobius_lite.cli.main import main
from mobius_lite.formats.quantize.ggml_rows import QUANTIZERS
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.weights.verify import verify_package
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.nemotron_reference import make_reference

# every row holds whole 32-element blocks (hidden 64, expert and shared width 32, Mamba
# d_inner 64, attention 4 x 16)
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
HYBRID = {
    "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
    "hidden_size": 64,
    "intermediate_size": 64,
    "mamba_num_heads": 8,
    "mamba_head_dim": 8,
    "head_dim": 16,
    "vocab_size": 96,
}
CASES = {"moe": (MOE, "nemotron_h_moe"), "hybrid": (HYBRID, "nemotron_h")}
ROUTES = {
    "standard": ("--backend", "standard"),
    "ort": ("--backend", "ort"),
    "int8": ("--backend", "ort", "--activations", "int8"),
}
# llama-quantize --pure: every tensor whose name ends in "weight" (gguf_fixtures forces the
# norms, conv1d, ssm_a / ssm_d and the router to F32, as the converter and llama.cpp do)
PURE = r"weight$"
# fixed before the run: the graphs differ only in A (stored vs computed from A_log)
LOGITS_TOLERANCE = 1e-5  # of the largest |logit|
A_PAIR = ("mixer.A", "mixer.A_log")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per case: the checkpoint directory (safetensors, FP32) and a package cache."""
    tmp = tmp_path_factory.mktemp("quantize")
    out: dict[str, Any] = {"tmp": tmp, "packages": {}, "gguf": {}}
    for key, (overrides, _) in CASES.items():
        model = make_reference(overrides)
        model.save_pretrained(tmp / key)
        out[key] = model
    return out


def _gguf(work: dict[str, Any], key: str, qtype: str) -> Path:
    if (key, qtype) not in work["gguf"]:
        _, arch = CASES[key]
        path = work["tmp"] / f"{key}-{qtype}.gguf"
        work["gguf"][key, qtype] = write_gguf(path, work[key], arch, {PURE: qtype.upper()})[0]
    return work["gguf"][key, qtype]


def _package(work: dict[str, Any], key: str, qtype: str, route: str, from_gguf: bool) -> Path:
    """(b) from llama.cpp's pure GGUF when from_gguf, else (a) with --quantize."""
    cache = work["packages"]
    label = (key, qtype, route, from_gguf)
    if label not in cache:
        out = work["tmp"] / "-".join([key, qtype, route, "gguf" if from_gguf else "st"])
        source = _gguf(work, key, qtype) if from_gguf else work["tmp"] / key
        flags = [] if from_gguf else ["--quantize", qtype]
        args = ["build", "--model", str(source), "--output", str(out), "--quiet"]
        assert main([*args, *flags, *ROUTES[route]]) == 0
        cache[label] = out
    return cache[label]


def _manifest(package: Path) -> dict[str, Any]:
    return json.loads((package / "manifest.json").read_text())


def _initializers(package: Path) -> dict[str, tuple[str, bytes]]:
    """Every graph's external initializer: (dtype, bytes) by name."""
    out = {}
    for graph in _manifest(package)["graphs"].values():
        for name, entry in graph["initializers"].items():
            with open(package / entry["file"], "rb") as handle:
                handle.seek(entry["offset"])
                out[name] = (entry["dtype"], handle.read(entry["length"]))
    return out


def _logits(package: Path) -> np.ndarray:
    """Prefill of 9 tokens, then 4 decode steps: every position's logits, flattened."""
    session = DecoderSession(package / "model.onnx")
    session.reset(1)
    ids = np.random.default_rng(0).integers(3, 96, size=(1, 9))
    out = [session.step(ids)["logits"]]
    for token in (5, 17, 40, 88):
        out.append(session.step(np.array([[token]]))["logits"])
    return np.concatenate([o.reshape(-1) for o in out])


# ----------------------------------------------------------------------------- quantizer
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_the_quantizer_is_ggml_reference_bit_for_bit(qtype: str) -> None:
    """ggml_rows against gguf-py's quantize on BF16-valued blocks of many scales, with the
    edge cases of the definitions: all-zero blocks, constant blocks, a negative extreme, the
    first of two equal magnitudes (Q4_0's max keeps its sign) and exact halves (roundf)."""
    import ml_dtypes

    rng = np.random.default_rng(1)
    scale = np.exp(rng.uniform(-9, 3, size=(4096, 1)))
    x = (rng.standard_normal((4096, 32)) * scale).astype(ml_dtypes.bfloat16).astype(np.float32)
    x[0] = 0
    x[1] = 0.75
    x[2, 7] = -4 * np.abs(x[2]).max()
    x[3, 3], x[3, 9] = 2.0, -2.0
    x[4] = np.arange(32, dtype=np.float32) - 15.5
    x[5] = (np.arange(32, dtype=np.float32) - 16) * 127 / 16 / 2  # codes at exact halves
    ours = QUANTIZERS[qtype](x)
    reference = gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype])
    assert np.array_equal(ours, reference.reshape(ours.shape))


# ----------------------------------------------------------------------------- exactness
@pytest.mark.slow
@pytest.mark.parametrize(
    "key, qtype, route",
    [
        ("moe", "q8_0", "standard"),
        ("moe", "q8_0", "ort"),
        ("moe", "q8_0", "int8"),
        ("moe", "q4_0", "standard"),
        ("moe", "q4_0", "ort"),
        ("moe", "q4_0", "int8"),
        ("hybrid", "q4_0", "standard"),
        ("hybrid", "q8_0", "ort"),
    ],
)
def test_the_package_equals_the_one_from_llama_cpp_pure_gguf(
    workdir: dict[str, Any], key: str, qtype: str, route: str
) -> None:
    ours = _package(workdir, key, qtype, route, from_gguf=False)
    theirs = _package(workdir, key, qtype, route, from_gguf=True)
    a, b = _initializers(ours), _initializers(theirs)
    only_ours = {n for n in set(a) - set(b) if not n.endswith(A_PAIR[1])}
    only_theirs = {n for n in set(b) - set(a) if not n.endswith(A_PAIR[0])}
    assert not only_ours and not only_theirs, (only_ours, only_theirs)
    packed = [n for n in b if b[n][0] == "UINT8"]
    assert len(packed) >= 8  # the projections, experts, embedding, lm_head (or their parts)
    differ = [n for n in set(a) & set(b) if a[n] != b[n]]
    assert not differ, differ
    la, lb = _logits(ours), _logits(theirs)
    assert np.all(np.isfinite(la))
    assert np.abs(la - lb).max() <= LOGITS_TOLERANCE * np.abs(lb).max()


@pytest.mark.slow
def test_manifest_records_source_hash_and_recipe(workdir: dict[str, Any]) -> None:
    package = _package(workdir, "moe", "q4_0", "standard", from_gguf=False)
    manifest = _manifest(package)
    assert manifest["quantization"]["weights"] == {"type": "q4_0", "block": 32, "symmetric": True}
    checkpoint = load_file(workdir["tmp"] / "moe" / "model.safetensors")
    quantized = {n: e for n, e in manifest["sources"].items() if "quantize" in e}
    assert "lm_head.weight" in quantized and "backbone.embeddings.weight" in quantized
    kept = set(manifest["sources"]) - set(quantized)
    assert all(
        ("norm" in n or "gate.weight" in n or "conv1d" in n or n.endswith(("A_log", "D", "bias")))
        for n in kept
    ), kept
    for name, entry in quantized.items():
        raw = np.ascontiguousarray(checkpoint[name]).tobytes()
        assert entry["sha256"] == hashlib.sha256(raw).hexdigest()
        assert entry["quantize"] == {"type": "q4_0", "block": 32, "symmetric": True}
        assert entry["dtype"] == "float32"


@pytest.mark.slow
@pytest.mark.parametrize("route", ["standard", "ort"])
def test_verify_quantizes_again_and_catches_a_flipped_byte(
    workdir: dict[str, Any], route: str, tmp_path: Path
) -> None:
    package = _package(workdir, "moe", "q8_0", route, from_gguf=False)
    source = workdir["tmp"] / "moe"
    report = verify_package(package, source)
    assert report.ok, report.mismatches
    sources = _manifest(package)["sources"].values()
    segments = sum(len(e.get("parts", [None])) for e in sources)  # a re-laid-out one per part
    assert report.checked == segments
    assert (segments > len(sources)) == (route == "ort")  # MatMulNBits B and scales
    copy = tmp_path / "flipped"
    shutil.copytree(package, copy)
    target = "backbone.layers.0.mixer.in_proj.weight" + ("_nbits_b" if route == "ort" else "")
    spot = _manifest(copy)["graphs"]["decoder"]["initializers"][target]
    data = bytearray((copy / spot["file"]).read_bytes())
    data[spot["offset"] + 7] ^= 0x01
    (copy / spot["file"]).write_bytes(bytes(data))
    flipped = verify_package(copy, source)
    assert any(target in m and "differ" in m for m in flipped.mismatches), flipped.mismatches
    assert main(["verify", str(package), "--source", str(source), "-q"]) == 0
    assert main(["verify", str(copy), "--source", str(source), "-q"]) == 1


@pytest.mark.slow
def test_inspect_shows_the_recipe(workdir: dict[str, Any], capsys: pytest.CaptureFixture) -> None:
    package = _package(workdir, "moe", "q4_0", "standard", from_gguf=False)
    capsys.readouterr()
    assert main(["inspect", str(package)]) == 0
    out = capsys.readouterr().out
    assert "quantized at export: weights q4_0, lm_head q4_0" in out
    assert "float32 -> quantize q4_0 (block 32, symmetric)" in out
    assert "float32 -> stack+quantize q4_0 (block 32, symmetric)" in out


# ----------------------------------------------------------------------------- options
@pytest.mark.slow
def test_quantize_output_keeps_lm_head_at_q8_0(workdir: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "pkg"
    args = ["build", "--model", str(workdir["tmp"] / "moe"), "--output", str(out), "--quiet"]
    assert main([*args, "--quantize", "q4_0", "--quantize-output", "q8_0"]) == 0
    checkpoint = load_file(workdir["tmp"] / "moe" / "model.safetensors")
    written = _initializers(out)
    for name, qtype in (("lm_head.weight", "Q8_0"), ("backbone.embeddings.weight", "Q4_0")):
        source = checkpoint[name]
        expected = gguf.quants.quantize(source, gguf.GGMLQuantizationType[qtype])
        assert written[name] == ("UINT8", expected.tobytes()), name
    assert verify_package(out, workdir["tmp"] / "moe").ok


@pytest.mark.slow
def test_rows_that_are_not_whole_blocks_stay_dense_and_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """nemotron_reference's tiny base: expert width 16, shared width 24 (not whole blocks)."""
    make_reference({"layers_block_type": ["mamba", "moe"]}).save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "pkg"
    args = ["build", "--model", str(tmp_path / "ckpt"), "--output", str(out), "--quiet"]
    capsys.readouterr()
    assert main([*args, "--quantize", "q8_0"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    named = {line.split()[1].rstrip(":") for line in notes}
    assert "backbone.layers.1.mixer.experts.0.down_proj.weight" in named
    assert "backbone.layers.1.mixer.shared_experts.down_proj.weight" in named
    written = _initializers(out)
    assert written["backbone.layers.1.mixer.experts.down_proj"][0] == "FLOAT"
    assert written["backbone.layers.1.mixer.experts.up_proj"][0] == "UINT8"
    assert _manifest(out)["quantization"]["fallbacks"] == [n.removeprefix("note: ") for n in notes]
    assert verify_package(out, tmp_path / "ckpt").ok


@pytest.mark.slow
def test_a_gguf_source_is_refused_with_one_line(
    workdir: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "pkg"
    gguf_file = _gguf(workdir, "moe", "q8_0")
    capsys.readouterr()
    code = main(["build", "--model", str(gguf_file), "--output", str(out), "--quantize", "q4_0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "already packed" in err[0], err
    assert not out.exists()


def test_dequantize_with_quantize_is_refused(tmp_path: Path, capsys) -> None:
    code = main(
        ["build", "--model", str(tmp_path), "--output", str(tmp_path / "o"), "--quantize", "q8_0"]
        + ["--dequantize"]
    )
    assert code == 2
    assert "exclude each other" in capsys.readouterr().err


# ----------------------------------------------------------------------------- Puzzle, Omni
# Puzzle blocks whose rows are whole 32-element blocks (hidden 32; the converter's GGUF of it
# is per-layer, gguf_fixtures' puzzle=True)
PUZZLE_BLOCKS: list[dict[str, Any]] = [
    {"block_type": "mamba"},
    {"block_type": "moe", "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    {"block_type": "attention"},
    {"block_type": "moe", "num_experts_per_tok": 3, "moe_intermediate_size": 64},
]
PUZZLE_GLOBALS = {"moe_latent_size": 32, "moe_shared_expert_intermediate_size": 32}


@pytest.mark.slow
def test_a_puzzle_package_equals_the_one_from_its_pure_gguf(tmp_path: Path) -> None:
    from reference_fixtures.puzzle_fixtures import puzzle_raw_config, write_puzzle_checkpoint

    raw = puzzle_raw_config(PUZZLE_BLOCKS, chunk_size=128, **PUZZLE_GLOBALS)
    checkpoint, model = write_puzzle_checkpoint(raw, tmp_path / "checkpoint")
    (file,) = write_gguf(tmp_path / "p.gguf", model, "nemotron_h_moe", {PURE: "Q4_0"}, puzzle=True)
    ours, theirs = tmp_path / "a", tmp_path / "b"
    common = ["--quiet", "--backend", "ort"]
    assert (
        main(
            [
                "build",
                "--model",
                str(checkpoint),
                "--output",
                str(ours),
                "--quantize",
                "q4_0",
                *common,
            ]
        )
        == 0
    )
    assert main(["build", "--model", str(file), "--output", str(theirs), *common]) == 0
    a, b = _initializers(ours), _initializers(theirs)
    assert sum(dtype == "UINT8" for dtype, _ in a.values()) >= 10
    assert not [n for n in set(a) & set(b) if a[n] != b[n]]
    assert {n for n in a if not n.endswith(A_PAIR[1])} == {
        n for n in b if not n.endswith(A_PAIR[0])
    }
    la, lb = _logits(ours), _logits(theirs)
    assert np.abs(la - lb).max() <= LOGITS_TOLERANCE * np.abs(lb).max()
    assert verify_package(ours, checkpoint).ok


@pytest.mark.slow
def test_omni_quantizes_its_language_model_and_head_only(tmp_path: Path) -> None:
    """Omni with an MTP head: the language model's projections and the head quantize; the
    vision tower, the projector and the embedding table (its own graph looks rows up) keep
    the build's dtype; every graph creates a session and verify re-derives the bytes."""
    import onnxruntime as ort

    from reference_fixtures.mtp_fixtures import write_omni_mtp_checkpoint

    checkpoint, _, _ = write_omni_mtp_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "pkg"
    assert (
        main(
            ["build", "--model", str(checkpoint), "--output", str(out), "-q", "--quantize", "q8_0"]
        )
        == 0
    )
    manifest = _manifest(out)
    quantized = {n for n, e in manifest["sources"].items() if "quantize" in e}
    assert quantized and all(n.startswith("language_model.") for n in quantized)
    assert "language_model.mtp.layers.0.eh_proj.weight" in quantized
    assert "language_model.lm_head.weight" in quantized
    assert "language_model.backbone.embeddings.weight" not in quantized
    assert any(n.startswith("language_model.mtp.layers.0.mixer") for n in quantized)
    for graph in manifest["graphs"].values():
        ort.InferenceSession(str(out / graph["file"]), providers=["CPUExecutionProvider"])
    assert verify_package(out, checkpoint).ok


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--quantize-block-size", "64"], "need a quantization"),
        (["--quantize", "q8_0", "--quantize-block-size", "64"], "apply to int4 / int8"),
        (["--quantize", "q4_0", "--quantize-asymmetric"], "apply to int4 / int8"),
        (["--quantize", "int4", "--quantize-block-size", "48"], "is not one of"),
        (["--quantize", "int4", "--quantize-output", "q8_0"], "same family"),
        (["--quantize", "int8", "--dtype", "bf16", "--ep", "cuda"], "f32 or f16"),
    ],
)
def test_quantize_options_are_checked_before_anything_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], said: str
) -> None:
    out = tmp_path / "pkg"
    code = main(["build", "--model", str(tmp_path / "absent"), "--output", str(out), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and said in err[0], err
    assert not out.exists()


@pytest.mark.slow
def test_qualify_an_omni_package_quantized_at_export(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Omni's reference (language model and MTP head) reads the dequantized weights; the
    quantization's own error against the unquantized source is reported beside, as for text.
    The package runs once; the dequantized reference (and its head) once, for the verdicts,
    and the unquantized source once, for the quantization's error."""
    from mobius_lite.evaluation import mtp_reference, reference
    from mobius_lite.evaluation.metrics import FP32_NRMSE
    from mobius_lite.evaluation.qualify import qualify
    from mobius_lite.run.omni_session import OmniSession
    from reference_fixtures.mtp_fixtures import write_omni_mtp_checkpoint

    checkpoint, model, _ = write_omni_mtp_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "pkg"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q"]
    assert main([*args, "--quantize", "q8_0"]) == 0
    calls: dict[str, list[Any]] = {"sessions": [], "prepares": [], "loads": [], "heads": []}
    monkeypatch.setattr(OmniSession, "__init__", _counted(OmniSession.__init__, calls["sessions"]))
    monkeypatch.setattr(OmniSession, "prepare", _counted(OmniSession.prepare, calls["prepares"]))
    monkeypatch.setattr(
        reference, "load_reference", _counted(reference.load_reference, calls["loads"])
    )
    monkeypatch.setattr(
        mtp_reference, "MtpReference", _counted(mtp_reference.MtpReference, calls["heads"])
    )
    report = qualify(out, checkpoint, steps=2, output=tmp_path / "report")
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert "mtp_head" in statuses
    assert statuses == dict.fromkeys(statuses, "PASS"), report.verdicts
    assert len(calls["sessions"]) == 1 and len(calls["prepares"]) == 1  # the package: once
    loaded = [Path(args[0]) for args in calls["loads"]]  # the dequantized copy, then the source
    assert len(loaded) == 2 and loaded[0] != checkpoint and loaded[1] == checkpoint
    assert len(calls["heads"]) == 1  # the reference head reads the dequantized copy only
    # the quantization's own error against the unquantized source: reported, not gated, and
    # beyond the FP32 gates (the graph is held to its dequantized weights by the verdicts)
    error = report.run["quantization_error"]
    assert error["gated"] is False and len(error["steps"]) == 3  # prefill + 2 decode steps
    assert FP32_NRMSE < error["logits_nrmse_max"] < 10
    # and it is the relative L2 error of the package's logits (onnxruntime, run here) against
    # the fixture's own transformers model (the unquantized source), each fed its own tokens
    expected = _omni_logits_error(out, model, steps=2)
    reported = {step["array"]: step["nrmse"] for step in error["steps"]}
    assert reported.keys() == expected.keys()
    for name, nrmse in expected.items():
        assert reported[name] == pytest.approx(nrmse, rel=1e-6), name
    assert error["logits_nrmse_max"] == pytest.approx(max(expected.values()), rel=1e-6)


def _counted(function: Any, calls: list[Any]) -> Any:
    """`function`, recording the arguments of every call into `calls`."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return function(*args, **kwargs)

    return counted


def _omni_logits_error(package: Path, model: Any, steps: int) -> dict[str, float]:
    """||ours - theirs|| / ||theirs|| of the logits at the prefill of qualify's two-image
    prompt and `steps` greedy steps: the package through OmniSession, `model` in torch."""
    import torch

    from mobius_lite.evaluation.qualify_omni import synthetic_media, synthetic_prompt
    from mobius_lite.run.omni_session import Media, OmniSession

    session = OmniSession(package)
    media = synthetic_media(session.config)
    pixels, grid = (torch.from_numpy(media[k]) for k in ("pixel_values", "image_grid_hw"))
    with torch.no_grad():
        image_tokens = sum(len(f) for f in model.get_image_features(pixels, grid).pooler_output)
        ids = synthetic_prompt(session.config, image_tokens, seed=1)
        prepared = session.prepare(
            ids, Media(pixel_values=media["pixel_values"], image_grid_hw=media["image_grid_hw"])
        )
        session.decoder.reset(1)
        ours = [session.decoder.step(prepared.inputs_embeds)["logits"]]
        out = model(
            input_ids=torch.from_numpy(ids), pixel_values=pixels, image_grid_hw=grid, use_cache=True
        )
        theirs = [out.logits.float().numpy()]
        length = ids.shape[1]
        for _ in range(steps):
            token = int(ours[-1][0, -1].argmax())
            ours.append(session.decoder.step(session.embed_token(token))["logits"])
            length += 1
            out = model(
                input_ids=torch.tensor([[int(out.logits[0, -1].argmax())]]),
                cache=out.cache,
                use_cache=True,
                attention_mask=torch.ones(1, length, dtype=torch.long),
                position_ids=torch.tensor([[length - 1]]),
            )
            theirs.append(out.logits.float().numpy())
    names = ["prefill"] + [f"decode{i}" for i in range(steps)]
    return {
        f"{name}/logits": float(
            np.linalg.norm(np.float64(a) - np.float64(e)) / np.linalg.norm(np.float64(e))
        )
        for name, a, e in zip(names, ours, theirs, strict=True)
    }


def test_a_modelopt_source_is_refused_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from reference_fixtures import modelopt_fixtures

    modelopt_fixtures.write_checkpoint("nvfp4", tmp_path / "nvfp4")
    out = tmp_path / "pkg"
    capsys.readouterr()
    args = ["build", "--model", str(tmp_path / "nvfp4"), "--output", str(out)]
    assert main([*args, "--quantize", "int4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "modelopt checkpoint" in err[0] and "already packed" in err[0]
    assert not out.exists()
