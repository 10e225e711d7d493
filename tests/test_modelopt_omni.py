"""ModelOpt NVFP4 / FP8 Omni checkpoints (NVIDIA's Nemotron-3-Nano-Omni-30B-A3B-*-NVFP4 / -FP8
layout): `mobius build` exports every Omni graph, the language model's packed weights on the
decoder's routes and the towers, projectors and embedding table dense in the build's dtype.

The checkpoints are a tiny transformers Omni model (C-RADIO, Parakeet, a Mamba / attention /
MoE text model) written by reference_fixtures/modelopt_fixtures.py `write_omni_checkpoint`:
its language model's linears quantized under `language_model.` (the Nano NVFP4 recipe, or FP8
everywhere but lm_head), every tower linear left dense and excluded. Oracles, none of them the
export's code: transformers' Omni model holding the weights dequantized independently
(ml_dtypes' float4 / float8 conversions) at prefill + 5 cached steps of a two-image prompt
under the FP32 gates; the fixture's stored tensors (the packed bytes); the dense Omni
package of the same model (the encoders); gguf-py's Q8_0 (lm_head under
`--quantize-output`); the exact package's greedy tokens (the int8 route).
"""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from mobius_lite.cli.main import main
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.formats.modelopt.quant_config import parse_quantization
from mobius_lite.formats.modelopt.storage import output_quantize_refusal
from mobius_lite.models.omni_names import DECODER_SCOPES
from mobius_lite.run.omni_session import Media, OmniSession
from mobius_lite.weights.verify import verify_package
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.nemotron_reference import pinned_torch
from test_modelopt_export import cli
from test_omni_package import IMAGE_TOKEN, drive, images, make_omni, prompt
from test_quantize_export import _initializers, _manifest

# end-to-end: builds packages and runs them against their reference (`-m "not slow"`
# leaves them out of a quick run)
pytestmark = pytest.mark.slow

VARIANTS = tuple(mf.OMNI_VARIANTS)
LANGUAGE = mf.OMNI_LANGUAGE
# every linear's input width a whole number of NVFP4's 16-element blocks (TEXT's shared expert
# is 24 wide)
TEXT = {"moe_shared_expert_intermediate_size": 32}
INT8 = ("--backend", "ort", "--activations", "int8")
CUDA = ("--weights-backend", "ort", "--dtype", "f16", "--ep", "cuda")
TOWERS = ("vision_encoder", "video_encoder", "audio_encoder", "embedding")
PACKED = (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn))
EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>up_proj|down_proj)\.weight")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The Omni model, its dense checkpoint and package, its ModelOpt checkpoints, and
    `package(variant, *flags)`: each ModelOpt package built once with the CLI."""
    root = tmp_path_factory.mktemp("modelopt_omni")
    model = make_omni(audio=True, final_layernorm=False, rate=0.4, seed=0, text_overrides=TEXT)
    model.save_pretrained(root / "dense")
    dense = ["build", "--model", str(root / "dense"), "--output", str(root / "dense-pkg"), "-q"]
    assert main(dense) == 0
    for variant in VARIANTS:
        mf.write_omni_checkpoint(model, variant, root / variant)
    built: dict[tuple[str, ...], Path] = {}

    def package(variant: str, *flags: str) -> Path:
        key = (variant, *flags)
        if key not in built:
            out = root / "packages" / "-".join((variant, *flags)).replace("--", "")
            args = ["build", "--model", str(root / variant), "--output", str(out), "-q"]
            assert main([*args, *flags]) == 0
            built[key] = out
        return built[key]

    return {"root": root, "model": model, "package": package}


def _image_prompt() -> tuple[np.ndarray, Media, dict[str, torch.Tensor]]:
    """A two-image prompt: ids, the package's media, the reference's keyword arguments."""
    pixels, grid = images(1)
    tokens = [int(n) for n in grid.prod(-1) // 4]  # 2 x 2 pixel shuffle
    ids = prompt([(IMAGE_TOKEN, tokens[0]), (IMAGE_TOKEN, tokens[1])], seed=2)
    kwargs = dict(pixel_values=torch.from_numpy(pixels), image_grid_hw=torch.from_numpy(grid))
    return ids, Media(pixel_values=pixels, image_grid_hw=grid), kwargs


@pytest.fixture(scope="module")
def references(work: dict[str, Any]) -> Callable[[str], Any]:
    """variant -> transformers' Omni model on that checkpoint's dequantized weights."""
    loaded: dict[str, Any] = {}

    def reference(variant: str) -> Any:
        if variant not in loaded:
            root = work["root"]
            loaded[variant] = mf.dense_omni_reference(root / variant, root / f"{variant}-ref")
        return loaded[variant]

    return reference


@pytest.mark.parametrize("variant", VARIANTS)
def test_decoder_matches_transformers_on_the_decoded_weights(work, references, variant) -> None:
    """Prefill of a two-image prompt + 5 cached steps: logits and every cache array within the
    FP32 gates, greedy tokens identical (test_omni_package.drive); the quantization is in play
    (the dense model's logits are outside the gates)."""
    package, reference = work["package"](variant), references(variant)
    ids, media, kwargs = _image_prompt()
    drive(reference, OmniSession(package), ids, media, kwargs)
    with pinned_torch():
        decoded = reference(input_ids=torch.from_numpy(ids), **kwargs).logits.numpy()
        dense = work["model"](input_ids=torch.from_numpy(ids), **kwargs).logits.numpy()
    assert not compare("logits", decoded, dense).passes(FP32_NRMSE, FP32_COSINE)


def _graph_target(name: str) -> tuple[str, int | None]:
    """The decoder initializer a language-model tensor is bound to (graph names carry no
    language_model. prefix), and its expert index when experts are stacked."""
    bare = name.removeprefix(LANGUAGE)
    expert = EXPERT.match(bare)
    if expert is None:
        return bare, None
    return f"{expert['prefix']}.{expert['proj']}{bare[expert.end() :]}", int(expert["e"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_packed_bytes_are_the_checkpoints(work, variant) -> None:
    """Every U8 / F8_E4M3 tensor of the checkpoint is in the decoder's initializers as stored
    (routed experts: slice e of the stacked initializer), with its element type."""
    initializers = _initializers(work["package"](variant))
    tensors = mf.read_tensors(work["root"] / variant)
    packed = {n: t for n, t in tensors.items() if t.dtype in PACKED}
    assert packed and all(n.startswith(LANGUAGE) for n in packed)
    kinds = {np.dtype(np.uint8): "UINT8", np.dtype(ml_dtypes.float8_e4m3fn): "FLOAT8E4M3FN"}
    for name, array in packed.items():
        raw = np.ascontiguousarray(array).tobytes()
        target, expert = _graph_target(name)
        dtype, data = initializers[target]
        if expert is not None:
            data = data[expert * len(raw) : (expert + 1) * len(raw)]
        assert data == raw, name
        assert dtype == kinds[array.dtype], (name, dtype)


def _tower_inputs(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    """Random inputs for an encoder / embedding graph (sizes the tiny model accepts)."""
    rng = np.random.default_rng(7)
    pixels, grid = images(3)
    fixed = {
        "pixel_values": pixels,
        "image_grid_hw": grid,
        "pixel_values_videos": rng.standard_normal((1, 3, 6, 16, 16)).astype(np.float32),
        "input_features": rng.standard_normal((2, 40, 16)).astype(np.float32),
        "input_features_mask": np.array([[1] * 40, [1] * 27 + [0] * 13], dtype=np.int64),
        "input_ids": np.array([[5, 17, 33, 8]], dtype=np.int64),
    }
    feeds = {}
    for value in session.get_inputs():
        if value.name in fixed:
            feeds[value.name] = fixed[value.name]
        else:  # the embedding graph's media features: none (a text prompt)
            feeds[value.name] = np.zeros((0, int(value.shape[-1])), dtype=np.float32)
    return feeds


def _run(path: Path) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, _tower_inputs(session))


def _graph_initializers(package: Path, role: str) -> dict[str, tuple[str, bytes]]:
    names = _manifest(package)["graphs"][role]["initializers"]
    everything = _initializers(package)
    return {name: everything[name] for name in names}


@pytest.mark.parametrize("variant", VARIANTS)
def test_encoders_equal_the_dense_packages(work, variant) -> None:
    """The vision, video, audio and embedding graphs hold the dense package's initializers
    byte for byte, in f32, and compute exactly its outputs."""
    package, dense = work["package"](variant), work["root"] / "dense-pkg"
    for role in TOWERS:  # a graph's role is its file's stem
        ours = _graph_initializers(package, role)
        assert ours == _graph_initializers(dense, role), role
        assert {dtype for dtype, _ in ours.values()} <= {"FLOAT", "INT64"}, role
    for graph in TOWERS:
        for a, b in zip(
            _run(package / f"{graph}.onnx"), _run(dense / f"{graph}.onnx"), strict=True
        ):
            np.testing.assert_array_equal(a, b, err_msg=graph)


def test_verify_passes_and_names_a_flipped_byte(work, tmp_path, capsys) -> None:
    """verify compares every packed and dense tensor with the checkpoint; a flipped bit in one
    NVFP4 code initializer is a mismatch naming it, exit 1."""
    package, source = work["package"]("nvfp4"), work["root"] / "nvfp4"
    assert verify_package(package, source).ok
    copy = tmp_path / "flipped"
    shutil.copytree(package, copy)
    target = "backbone.layers.3.mixer.in_proj.weight"  # NVFP4 codes of the last Mamba layer
    spot = _manifest(copy)["graphs"]["decoder"]["initializers"][target]
    assert spot["dtype"] == "UINT8"
    data = bytearray((copy / spot["file"]).read_bytes())
    data[spot["offset"] + 5] ^= 0x10
    (copy / spot["file"]).write_bytes(bytes(data))
    report = verify_package(copy, source)
    assert [m for m in report.mismatches if target in m and "differ" in m], report.mismatches
    capsys.readouterr()
    assert main(["verify", str(copy), "--source", str(source), "-q"]) == 1
    assert re.search(rf"^MISMATCH .*{re.escape(target)}", capsys.readouterr().out, re.M)


def test_inspect_shows_the_packed_decoder_and_dense_towers(work, capsys) -> None:
    package = work["package"]("nvfp4")
    capsys.readouterr()
    assert main(["inspect", str(package)]) == 0
    out = capsys.readouterr().out
    assert "uint8 -> stack" in out and "float8_e4m3fn -> identity" in out
    sections = dict(re.findall(r"^(\w+)\.onnx .*?weight routes: ([^\n]*)", out, re.S | re.M))
    assert "standard decode" in sections["model"]
    assert all(re.fullmatch(r"dense \d+", sections[g]) for g in TOWERS), sections


def _nvfp4_linears(checkpoint: Path) -> int:
    """NVFP4 linears outside the routed experts (2-D block scales beside a weight)."""
    return sum(
        1
        for name, t in mf.read_tensors(checkpoint).items()
        if name.endswith(".weight_scale") and t.ndim == 2 and ".experts." not in name
    )


def test_nvfp4_on_the_int8_route(work) -> None:
    """`--backend ort --activations int8`: the NVFP4 linears on MatMulNBits (8 bits, block 16),
    the experts on QMoE; greedy tokens of a two-image prompt equal the exact package's or part
    at a near tie; the encoders compute the dense package's features within the FP32 gates;
    verify passes (the bytes are verbatim)."""
    int8, exact = work["package"]("nvfp4", *INT8), work["package"]("nvfp4")
    nodes = onnx.load(str(int8 / "model.onnx"), load_external_data=False).graph.node
    ops = Counter(n.op_type for n in nodes)
    assert ops["MatMulNBits"] == _nvfp4_linears(work["root"] / "nvfp4") and ops["QMoE"] == 1
    ids, media, _ = _image_prompt()
    tokens, calls = OmniSession(exact).generate(ids, media, 6, stop_at_eos=False)
    int8_tokens, int8_calls = OmniSession(int8).generate(ids, media, 6, stop_at_eos=False)
    for step, (a, b) in enumerate(zip(tokens, int8_tokens, strict=True)):
        if a != b:  # a near tie: the exact top-2 margin below twice the int8 deviation
            logits, ours = calls[step]["logits"][0, -1], int8_calls[step]["logits"][0, -1]
            top2 = np.sort(logits)[-2:]
            assert top2[1] - top2[0] < 2 * np.abs(ours - logits).max(), step
            break
    dense = work["root"] / "dense-pkg"
    for graph in TOWERS:
        for a, b in zip(_run(int8 / f"{graph}.onnx"), _run(dense / f"{graph}.onnx"), strict=True):
            assert compare(graph, a, b.astype(a.dtype)).passes(FP32_NRMSE, FP32_COSINE), graph
    assert verify_package(int8, work["root"] / "nvfp4").ok


@pytest.mark.parametrize("flags", [INT8, ("--dequantize",)], ids=["int8", "dequantize"])
def test_fp8_exact_routes_match_transformers(work, references, flags) -> None:
    """FP8 has no 8-bit integer layout, so `--activations int8` keeps its linears and experts
    exact; `--dequantize` writes the E4M3 values in f32 with weight_scale as the output scale.
    Both match the reference under the FP32 gates, and verify passes."""
    package = work["package"]("fp8", *flags)
    ops = {
        n.op_type
        for n in onnx.load(str(package / "model.onnx"), load_external_data=False).graph.node
    }
    assert not {"MatMulNBits", "QMoE"} & ops
    if flags == ("--dequantize",):
        dtypes = {d for d, _ in _graph_initializers(package, "decoder").values()}
        assert "FLOAT8E4M3FN" not in dtypes
    ids, media, kwargs = _image_prompt()
    drive(references("fp8"), OmniSession(package), ids, media, kwargs)
    assert verify_package(package, work["root"] / "fp8").ok


def test_quantize_output_quantizes_the_language_models_lm_head(work) -> None:
    """lm_head, which the checkpoint keeps dense (excluded as language_model.lm_head), becomes
    gguf-py's Q8_0 of it; every packed weight stays as stored; verify re-derives it."""
    package = work["package"]("nvfp4", "--quantize-output", "q8_0")
    lm_head = mf.read_tensors(work["root"] / "nvfp4")[LANGUAGE + "lm_head.weight"]
    q8_0 = gguf.quants.quantize(lm_head.astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    assert _initializers(package)["lm_head.weight"][1] == q8_0.tobytes()
    plain = _initializers(work["package"]("nvfp4"))
    ours = _initializers(package)
    assert {n: v for n, v in ours.items() if n != "lm_head.weight"} == {
        n: v for n, v in plain.items() if n != "lm_head.weight"
    }
    assert verify_package(package, work["root"] / "nvfp4").ok


def test_qualify_passes(work, tmp_path) -> None:
    """qualify's reference decodes the ModelOpt weights (SourceKind.reference of the ModelOpt
    kind) and loads them into transformers' Omni model: four PASS verdicts."""
    from mobius_lite.evaluation.qualify import qualify

    package = work["package"]("nvfp4")
    report = qualify(package, work["root"] / "nvfp4", steps=2, output=tmp_path / "q", quiet=True)
    statuses = {k: v.status for k, v in report.verdicts.items()}
    assert statuses == dict.fromkeys(statuses, "PASS"), report.verdicts


def test_qualify_does_not_gate_the_int8_route(work, tmp_path) -> None:
    """An Omni package on int8 activations is not exact by design: qualify reports its
    parity and tokens with the measured figures, NOT_GATED, as for a text package (before,
    the Omni path gated them and failed where the int8 kernels move the logits)."""
    from mobius_lite.evaluation.qualify import qualify

    package = work["package"]("nvfp4", *INT8)
    report = qualify(package, work["root"] / "nvfp4", steps=2, output=tmp_path / "q", quiet=True)
    statuses = {k: v.status for k, v in report.verdicts.items()}
    assert statuses["graph_validity"] == statuses["source_fidelity"] == "PASS", report.verdicts
    assert statuses["numerical_parity"] == statuses["generation"] == "NOT_GATED"
    assert "kernels compute with int8 activations" in report.verdicts["generation"].summary
    assert report.run["int8_activation_kernels"] > 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_cuda_route_graphs(work, variant) -> None:
    """`--weights-backend ort --dtype f16 --ep cuda` (built and checked here, not run: no GPU):
    every packed single linear on onnxruntime's CUDA kernel, the encoders dense f16."""
    package = work["package"](variant, *CUDA)
    kernel = {"nvfp4": "MatMulBlockQuantizedFp4Weight", "fp8": "MatMulBlockQuantizedFp8Weight"}
    for graph in ("model", *TOWERS):
        onnx.checker.check_model(str(package / f"{graph}.onnx"))
    nodes = onnx.load(str(package / "model.onnx"), load_external_data=False).graph.node
    tensors = mf.read_tensors(work["root"] / variant)
    single = {
        _graph_target(n)[0]
        for n, t in tensors.items()
        if n.endswith(".weight")
        and t.dtype in PACKED
        and not EXPERT.match(n.removeprefix(LANGUAGE))
    }
    assert {n.input[1] for n in nodes if n.op_type == kernel[variant]} == single
    for role in ("vision_encoder", "audio_encoder", "embedding"):
        dtypes = {d for d, _ in _graph_initializers(package, role).values()}
        assert dtypes <= {"FLOAT16", "INT64"}, (role, dtypes)


# --- refusals: one line, exit 2, nothing written ------------------------------------------------


def _without_lm_head_exclusion(directory: Path) -> None:
    for name in ("config.json", "hf_quant_config.json"):
        raw = json.loads((directory / name).read_text())
        body = (
            raw["quantization_config"]["quantization"]
            if name == "config.json"
            else raw["quantization"]
        )
        body["exclude_modules"].remove(LANGUAGE + "lm_head")
        (directory / name).write_text(json.dumps(raw))


def _packed_projector(directory: Path) -> None:
    """The vision projector's first linear stored NVFP4 although the config excludes mlp1*."""
    tensors = mf.read_tensors(directory)
    for suffix, value in mf.quantize_nvfp4(tensors.pop("mlp1.1.weight")).items():
        tensors[f"mlp1.1.{suffix}"] = value
    mf.save_tensors(tensors, directory / "model.safetensors")


REFUSALS = [
    ((), ("--dequantize",), r"--dequantize: the ModelOpt checkpoint is NVFP4"),
    ((), ("--quantize", "q8_0"), r"is a modelopt checkpoint, whose weights are already packed"),
    (
        (_without_lm_head_exclusion,),
        ("--quantize-output", "q8_0"),
        r"--quantize-output: the ModelOpt checkpoint stores lm_head as NVFP4 \(its quantization "
        r"config does not exclude it\)",
    ),
    ((_packed_projector,), (), r"unexpected dtype \(1\): mlp1\.1\.weight is uint8"),
    ((), ("--weights-backend", "ort"), r"takes float16 or bfloat16 activations"),
]


@pytest.mark.parametrize(
    ("edits", "flags", "message"),
    REFUSALS,
    ids=["dequantize-nvfp4", "quantize", "packed-lm-head", "packed-tower", "ort-f32"],
)
def test_refusals_are_one_line(work, edits, flags, message, tmp_path, capsys) -> None:
    checkpoint, package = tmp_path / "checkpoint", tmp_path / "package"
    shutil.copytree(work["root"] / "nvfp4", checkpoint)
    for edit in edits:
        edit(checkpoint)
    code, err = cli(["build", "--model", str(checkpoint), "--output", str(package), *flags], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mobius build: error: "), err
    assert re.search(message, lines[0]), lines[0]
    assert not package.exists() and not list(tmp_path.glob(".*package*"))


def _exclusions_without_the_prefix(directory: Path) -> None:
    for name in ("config.json", "hf_quant_config.json"):
        raw = json.loads((directory / name).read_text())
        body = raw["quantization_config"] if name == "config.json" else raw
        exclude = body["quantization"]["exclude_modules"]
        body["quantization"]["exclude_modules"] = [e.removeprefix(LANGUAGE) for e in exclude]
        (directory / name).write_text(json.dumps(raw))


def test_exclusions_may_leave_off_the_language_model_prefix(work, tmp_path) -> None:
    """A config naming the language model's modules as a text checkpoint's (`lm_head`,
    `backbone.layers.1.mixer*`, as the text Nano release does) describes the same checkpoint:
    the same package, lm_head still dense for `--quantize-output`."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(work["root"] / "nvfp4", checkpoint)
    _exclusions_without_the_prefix(checkpoint)
    exclude = json.loads((checkpoint / "hf_quant_config.json").read_text())["quantization"]
    assert "lm_head" in exclude["exclude_modules"]
    for flags in ((), ("--quantize-output", "q8_0")):
        package = tmp_path / "-".join(("package", *flags))
        args = ["build", "--model", str(checkpoint), "--output", str(package), "-q", *flags]
        assert main(args) == 0
        assert _initializers(package) == _initializers(work["package"]("nvfp4", *flags))


@pytest.mark.parametrize(
    ("exclusions", "lm_head_dense", "layer_0_dense"),
    [
        (["lm_head", "backbone.layers.0.mixer*"], True, True),  # the text release's spelling
        (["language_model.lm_head", "language_model.backbone.layers.0.mixer*"], True, True),
        (["*lm_head*"], True, False),
        (["model.layers.0.mixer*"], False, True),  # transformers' trunk name
        (["vision_model*"], False, False),
    ],
)
def test_a_decoder_module_is_excluded_by_either_name(
    exclusions, lm_head_dense, layer_0_dense
) -> None:
    """An Omni checkpoint's decoder modules match exclusions written with or without
    `language_model.` (DECODER_SCOPES); a packed lm_head refuses `--quantize-output`."""
    body = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": exclusions}
    quantization = parse_quantization(None, {"quantization": body}, DECODER_SCOPES)
    assert quantization is not None
    assert (output_quantize_refusal(quantization) is None) is lm_head_dense
    assert quantization.excluded("language_model.lm_head") is lm_head_dense
    in_proj = "language_model.backbone.layers.0.mixer.in_proj"
    assert quantization.excluded(in_proj) is layer_0_dense
    assert quantization.excluded("language_model.backbone.layers.1.mixer.in_proj") is False
