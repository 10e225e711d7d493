"""The fused CPU routes of issue 22 (`--activations exact-fused | int8`, components/moe_fused.py,
formats/ggml/relayout/exact_codes.py): exactness against independent references, and the int8 route
against llama.cpp's own error on the same weights.

References, none of them the code under test: a float64 numpy ReLU^2 MoE over gguf-py's
dequantized weights; llama.cpp's activation quantization (quantize_row_q8_0 for 32-block
types, quantize_row_q8_K for the 256-block ones, written here from ggml-quants.c's definition)
applied before a float64 product, which is the error llama.cpp's CPU dot products carry; the
exact route's package (itself held to transformers by tests/test_gguf_export.py).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from formats.emit_harness import run_emitter
from formats.q4_k_blocks import q4_k_quantize
from mobius_lite.cli.main import main
from mobius_lite.components.moe_fused import dense_fused_experts, quantized_fused_experts
from mobius_lite.configs.layers import MoESpec
from mobius_lite.evaluation.metrics import (
    FP32_COSINE,
    FP32_NRMSE,
    compare,
    int8_activation_gate,
)
from mobius_lite.formats.ggml.relayout.exact_codes import exact_codes
from mobius_lite.formats.ggml.relayout.exact_layout import NBitsLayout, to_nbits_layout
from mobius_lite.formats.ggml.relayout.exact_matmulnbits import emit_exact_nbits_matmul
from mobius_lite.formats.ggml.relayout.qmoe_experts import QMoEExperts
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.ggml.weight import GGMLWeight
from mobius_lite.formats.parts import CodeLayout, Operand
from mobius_lite.run.decoder_session import DecoderSession
from reference_fixtures.gguf_fixtures import random_blocks, write_gguf
from reference_fixtures.nemotron_reference import make_reference

QTYPE = GGMLQuantizationType
FC1, FC2 = Operand.FC1.value, Operand.FC2.value  # the fused-experts slot kinds
F32 = ir.DataType.FLOAT
CONTRIB = {"com.microsoft": 1}
# llama.cpp's vec_dot_type on CPU: the format its activations are quantized to per weight type
LLAMACPP_ACTIVATION_QUANT = {
    "Q4_0": "q8_0",
    "Q8_0": "q8_0",
    "Q4_K": "q8_K",
    "Q6_K": "q8_K",
    "IQ2_XXS": "q8_K",
    "MXFP4": "q8_0",
    "NVFP4": "q8_0",
}


# ----------------------------------------------------------------------------- llama.cpp
def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_0_ref: per 32 values d = amax / 127 (stored fp16), q = roundf(x / d)
    (half away from zero) with id = 1 / d; the value llama.cpp computes with is fp16(d) * q."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), np.float32(0))
    scaled = blocks * inv
    q = np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))  # roundf
    return (q * d.astype(np.float16).astype(np.float32)).reshape(x.shape)


def quantize_q8_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q8_K_ref: per 256 values, `max` the value of largest magnitude,
    iscale = -127 / max, q = min(127, nearest_int(iscale * x)) (round half to even),
    d = 1 / iscale (float32); the value is d * q."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, 256)
    at = np.abs(blocks).argmax(axis=-1)[..., None]
    peak = np.take_along_axis(blocks, at, axis=-1)
    safe = np.where(peak == 0, np.float32(1), peak)
    iscale = np.float32(-127) / safe
    q = np.minimum(np.rint(iscale * blocks), np.float32(127))
    d = np.where(peak == 0, np.float32(0), np.float32(1) / iscale)
    return (q * d).reshape(x.shape)


def quantize_int8_blocks(x: np.ndarray, block: int = 32) -> np.ndarray:
    """MatMulNBits' accuracy-4 activations as its definition has them: per `block` values of
    x, s = amax / 127, q = round(x / s); the value is s * q (checked against the kernel below)."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, block)
    s = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    q = np.rint(np.where(s > 0, blocks / np.where(s > 0, s, 1), 0))
    return (q * s).reshape(x.shape)


def llamacpp_activations(type_name: str, x: np.ndarray) -> np.ndarray:
    kind = LLAMACPP_ACTIVATION_QUANT[type_name]
    return quantize_q8_0(x) if kind == "q8_0" else quantize_q8_k(x)


# ----------------------------------------------------------------------------- weights
def exact_weight(type_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """ggml rows whose values ARE the blocks' (the comparison measures the kernel): gguf-py's
    quantization of Gaussian values where it has one, else valid random blocks."""
    if type_name in ("Q4_0", "Q8_0"):
        return quantize(rng.standard_normal(shape).astype(np.float32), QTYPE[type_name])
    return random_blocks(type_name, shape, rng)


def values_of(type_name: str, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return np.asarray(dequantize(rows, QTYPE[type_name]), dtype=np.float64).reshape(shape)


def relu2_moe(x, indices, weights, up, down, quant=None) -> np.ndarray:
    """float64 sum_k w_k * down_e @ relu(up_e @ x)^2; `quant` quantizes each expert's input
    as llama.cpp does before its matmuls (fc1 input and fc2 input)."""
    q = quant or (lambda a: a)
    out = np.zeros((x.shape[0], down.shape[1]))
    for row in range(x.shape[0]):
        for e, w in zip(indices[row], weights[row], strict=True):
            hidden = up[e] @ q(x[row : row + 1].astype(np.float32))[0].astype(np.float64)
            act = np.maximum(hidden, 0.0) ** 2
            out[row] += w * (down[e] @ q(act[None].astype(np.float32))[0].astype(np.float64))
    return out


def routing(rows: int, n_experts: int, k: int, rng: np.random.Generator):
    indices = np.stack([rng.choice(n_experts, size=k, replace=False) for _ in range(rows)])
    weights = (rng.random((rows, k)) * 2 + 0.1).astype(np.float32)  # not normalized: scaled
    return indices.astype(np.int64), weights


SPEC = MoESpec(
    n_routed_experts=8,
    num_experts_per_tok=3,
    moe_intermediate_size=256,
    shared_intermediate_size=0,
    n_shared_experts=0,
    n_group=1,
    topk_group=1,
    norm_topk_prob=False,
    routed_scaling_factor=1.0,
    bias=False,
    latent_size=None,
)
WIDTH = 256
ROWS = 32  # enough rows that two same-scheme quantizations' NRMSE agree within 1e-4


def test_moe_f32_swiglu_form_is_relu2() -> None:
    rng = np.random.default_rng(0)
    e, i, rows = SPEC.n_routed_experts, SPEC.moe_intermediate_size, 5
    up = (rng.standard_normal((e, i, WIDTH)) / 16).astype(np.float32)
    down = (rng.standard_normal((e, WIDTH, i)) / 8).astype(np.float32)
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    indices, weights = routing(rows, e, SPEC.num_experts_per_tok, rng)

    def emit(op, xv, iv, wv, upv, downv):
        return dense_fused_experts(op, SPEC, upv, downv)(op, xv, iv, wv)

    (y,) = run_emitter(
        emit, [x, indices, weights, up, down], opset_imports=CONTRIB, constant_from=3
    )
    expected = relu2_moe(x, indices, weights, up.astype(np.float64), down.astype(np.float64))
    result = compare("moe", y, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


def _qmoe(type_up: str, type_down: str, accuracy: int, seed: int):
    """QMoE (SwiGLU form) on exact ggml experts -> (output, x, routing, float64 weights)."""
    rng = np.random.default_rng(seed)
    e, i, rows = SPEC.n_routed_experts, SPEC.moe_intermediate_size, ROWS
    up_rows = exact_weight(type_up, (e, i, WIDTH), rng)
    down_rows = exact_weight(type_down, (e, WIDTH, i), rng)
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    indices, weights = routing(rows, e, SPEC.num_experts_per_tok, rng)
    fmt = {}
    arrays: list[np.ndarray] = []
    names: list[tuple[str, str]] = []
    for attr, t, kind, data, shape in (
        ("up", type_up, FC1, up_rows, (e, i, WIDTH)),
        ("down", type_down, FC2, down_rows, (e, WIDTH, i)),
    ):
        exact = GGMLWeight.choose(GGML_TYPES[t], F32, "ort", shape)
        fmt[attr] = QMoEExperts(GGML_TYPES[t], F32, shape, kind, exact)
        layout = to_nbits_layout(t, data, repeat=2 if kind == FC1 else 1)
        for part, array in layout.arrays().items():
            if part == "b":
                array = array.reshape(*array.shape[:-2], -1)
            names.append((attr, CodeLayout(Operand.of_experts(kind)).part(part).suffix))
            arrays.append(array)

    def emit(op, xv, iv, wv, *parts):
        params: dict[str, dict[str, Any]] = {"up": {}, "down": {}}
        for (attr, suffix), value in zip(names, parts, strict=True):
            params[attr][suffix] = value
        up, down = (fmt["up"], params["up"]), (fmt["down"], params["down"])
        return quantized_fused_experts(op, SPEC, up, down, accuracy)(op, xv, iv, wv)

    (y,) = run_emitter(emit, [x, indices, weights, *arrays], opset_imports=CONTRIB, constant_from=3)
    up = values_of(type_up, up_rows, (e, i, WIDTH))
    down = values_of(type_down, down_rows, (e, WIDTH, i))
    return y, x, indices, weights, up, down


def test_qmoe_4bit_accuracy0_swiglu_form_is_relu2() -> None:
    y, x, indices, weights, up, down = _qmoe("Q4_0", "Q4_0", accuracy=0, seed=1)
    result = compare("qmoe q4_0", y, relu2_moe(x, indices, weights, up, down))
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


def test_cpu_qmoe_refuses_swiglu_with_a_separate_fc3() -> None:
    """The SwiGLU form of ReLU^2 with fc3 given as fc1's own initializer (swiglu_fusion 0)
    would store and read the up rows once instead of twice. onnxruntime 1.32's CPU QMoE
    refuses it at session creation, so the package repeats the rows in fc1
    (docs/cpu_routes.md). If this fails, the kernel changed: measure that form
    (benchmarks/investigations/cpu_kernel_gaps.py records the refusal)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mobius_lite.formats.contrib import CONTRIB_DOMAIN, CONTRIB_OPSET

    e, d, i = 2, 32, 32
    node = helper.make_node(
        "QMoE", ["x", "probs", "up", "s", "", "down", "s", "", "up", "s", ""], ["y"],
        domain=CONTRIB_DOMAIN, k=1, expert_weight_bits=8, activation_type="swiglu",
        swiglu_fusion=0, activation_alpha=1e30, activation_beta=0.0,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "fc3",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, e]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, d])],
        [
            numpy_helper.from_array(np.zeros((e, i, d), np.uint8), "up"),
            numpy_helper.from_array(np.zeros((e, d, i), np.uint8), "down"),
            numpy_helper.from_array(np.ones((e, i, 1), np.float32), "s"),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid(CONTRIB_DOMAIN, CONTRIB_OPSET),
        ],
    )
    options = ort.SessionOptions()
    options.log_severity_level = 4
    with pytest.raises(Exception, match="swiglu_fusion=1"):
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    ("type_up", "type_down", "accuracy"),
    [
        ("Q4_0", "Q4_0", 4),
        ("Q8_0", "Q8_0", 0),
        ("IQ2_XXS", "IQ2_XXS", 0),
        ("Q6_K", "Q6_K", 4),
        ("MXFP4", "MXFP4", 4),
        ("NVFP4", "NVFP4", 4),
    ],
)
def test_qmoe_int8_error_is_at_most_llamacpps(type_up: str, type_down: str, accuracy: int) -> None:
    """8-bit experts use int8 activations at every accuracy level (the schema); 4-bit at 4."""
    y, x, indices, weights, up, down = _qmoe(type_up, type_down, accuracy, seed=2)
    exact = relu2_moe(x, indices, weights, up, down)
    llamacpp = relu2_moe(
        x, indices, weights, up, down, quant=lambda a: llamacpp_activations(type_up, a)
    )
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5  # int8 activations really were used (not an exact path)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ2_XXS", "MXFP4", "NVFP4"])
def test_matmulnbits_int8_error_is_at_most_llamacpps(type_name: str) -> None:
    rng = np.random.default_rng(3)
    n, k, m = 64, 1024, 16
    rows = exact_weight(type_name, (n, k), rng)
    layout = to_nbits_layout(type_name, rows, center_mins=True)  # the package's layout
    w = values_of(type_name, rows, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = _int8_matmulnbits(layout, x, n, k)
    exact = x.astype(np.float64) @ w.T
    llamacpp = llamacpp_activations(type_name, x).astype(np.float64) @ w.T
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5


def _int8_matmulnbits(layout: NBitsLayout, x: np.ndarray, n: int, k: int) -> np.ndarray:
    """onnxruntime's MatMulNBits at accuracy 4 (with the min term where there is one)."""
    names = list(layout.arrays())

    def emit(op, xv, *parts):
        params = dict(zip(names, parts, strict=True))
        return emit_exact_nbits_matmul(
            op, xv, params, k, n, layout.bits, layout.block_size, accuracy_level=4
        )

    inputs = [x, *layout.arrays().values()]
    return run_emitter(emit, inputs, opset_imports=CONTRIB, constant_from=1)[0]


@pytest.mark.parametrize(("n", "k", "m"), [(64, 1024, 16), (96, 2048, 4), (32, 512, 8)])
def test_q4_k_centered_zero_points_have_llamacpps_int8_error(n: int, k: int, m: int) -> None:
    """A quantized Gaussian's Q4_K on the int8 route: with per-block zero points round(b / a)
    the error is at most llama.cpp's (Q8_K activations, min term from them too); the
    uncentered form (zero point 0, the whole min b on float x) errs more on the same data,
    by numpy math: x~ @ (a q)^T - sum_block(x) @ b^T, x~ the kernel's int8 blocks."""
    rng = np.random.default_rng(n + k + m)
    rows = q4_k_quantize(rng.standard_normal((n, k)).astype(np.float32))
    w = values_of("Q4_K", rows, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    layout = to_nbits_layout("Q4_K", rows, center_mins=True)
    y = _int8_matmulnbits(layout, x, n, k)
    exact = x.astype(np.float64) @ w.T
    llamacpp = llamacpp_activations("Q4_K", x).astype(np.float64) @ w.T
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)

    code = exact_codes("Q4_K", rows)
    a, b = code.scales.astype(np.float64), code.mins.astype(np.float64)
    q = code.codes.astype(np.float64)  # [n, k / 32, 32]
    x_int8 = quantize_int8_blocks(x).astype(np.float64).reshape(m, -1, 32)
    block_sums = x.astype(np.float64).reshape(m, -1, 32).sum(axis=-1)
    uncentered = np.einsum("mjl,njl->mn", x_int8, a[..., None] * q) - block_sums @ b.T
    z = np.rint(b / a)  # every block of a quantized Gaussian centers (the relayout test)
    centered = np.einsum("mjl,njl->mn", x_int8, a[..., None] * (q - z[..., None]))
    centered -= block_sums @ (b - a * z).T
    # the emulation is the kernel: same activations, same products
    emulation = compare("kernel vs emulation", y, centered)
    assert emulation.passes(FP32_NRMSE, FP32_COSINE), emulation
    old = compare("uncentered", uncentered, exact)
    assert ours.nrmse < old.nrmse and ours.nrmse > 1e-5, (ours, old)
    assert not int8_activation_gate(old, theirs)  # the uncentered form fails the gate here


# ----------------------------------------------------------------------------- whole model
MOE_MODEL = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "hidden_size": 256,
    "moe_intermediate_size": 256,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
# every exact layout on some tensor, and types without one (Q5_K, Q5_1) kept exact
TYPES = {
    r"^token_embd": "Q8_0",
    r"^output\.": "Q6_K",
    r"attn_[qk]\.": "Q4_K",
    r"attn_v\.": "Q6_K",
    r"attn_output\.": "Q5_K",  # rows of 32: written Q5_1
    r"ssm_in\.": "IQ2_XXS",
    r"ssm_out\.": "Q4_0",
    r"ffn_(up|down)_exps\.": "Q4_0",
    r"ffn_(up|down)_shexp\.": "Q8_0",
}
PROMPTS = [[5, 17, 42, 3, 88, 21, 9, 64], [1, 2, 3, 4, 5, 6]]
GREEDY_STEPS = 6


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("cpu_fast_routes")
    files = write_gguf(tmp / "moe.gguf", make_reference(MOE_MODEL), "nemotron_h_moe", TYPES)
    out: dict[str, Any] = {"gguf": files[0]}
    for mode in ("exact", "exact-fused", "int8"):
        pkg = tmp / mode
        flags = ["--backend", "ort", "--activations", mode, "--quiet"]
        assert main(["build", "--model", str(files[0]), "--output", str(pkg), *flags]) == 0
        out[mode] = pkg
    return out


def _greedy(package: Path, prompt: list[int]) -> tuple[list[int], list[np.ndarray]]:
    session = DecoderSession(package / "model.onnx")
    logits = session.step(np.array([prompt]))["logits"][0, -1]
    tokens, steps = [], []
    for _ in range(GREEDY_STEPS):
        steps.append(logits)
        tokens.append(int(logits.argmax()))
        logits = session.step(np.array([[tokens[-1]]]))["logits"][0, -1]
    return tokens, steps


def _ops(package: Path) -> set[str]:
    model = onnx.load(str(package / "model.onnx"), load_external_data=False)
    return {n.op_type for n in model.graph.node}


def assert_greedy_within_fp32_gates(package: Path, exact: Path) -> None:
    """On every benchmark prompt: the exact route's greedy tokens, and every step's logits
    within the FP32 gates of the exact route's."""
    for prompt in PROMPTS:
        tokens, steps = _greedy(exact, prompt)
        fused_tokens, fused_steps = _greedy(package, prompt)
        assert fused_tokens == tokens
        for ours, reference in zip(fused_steps, steps, strict=True):
            result = compare("logits", ours, reference)
            assert result.passes(FP32_NRMSE, FP32_COSINE), result


def test_exact_fused_route_matches_the_exact_route(packages: dict[str, Any]) -> None:
    assert {"MatMulNBits", "QMoE"} <= _ops(packages["exact-fused"])
    assert_greedy_within_fp32_gates(packages["exact-fused"], packages["exact"])


def assert_tokens_agree_or_near_tie(package: Path, exact: Path) -> None:
    """Greedy tokens equal the exact route's; where they part, the exact route's top-2 logit
    margin at that step is below twice the package's logit deviation there (a near tie), and
    it is reported."""
    for prompt in PROMPTS:
        tokens, steps = _greedy(exact, prompt)
        int8_tokens, int8_steps = _greedy(package, prompt)
        for step, (a, b) in enumerate(zip(tokens, int8_tokens, strict=True)):
            if a == b:
                continue
            top2 = np.sort(steps[step])[-2:]
            margin = float(top2[1] - top2[0])
            deviation = float(np.abs(int8_steps[step] - steps[step]).max())
            print(
                f"prompt {prompt}: step {step} token {b} vs {a}, exact top-2 margin "
                f"{margin:.4f}, int8 logit deviation {deviation:.4f}"
            )
            assert margin < 2 * deviation
            break  # later steps continue from different tokens


def test_int8_route_tokens_agree_or_the_margin_explains_it(packages: dict[str, Any]) -> None:
    assert {"MatMulNBits", "QMoE"} <= _ops(packages["int8"])
    assert_tokens_agree_or_near_tie(packages["int8"], packages["exact"])


def test_int8_package_verifies_against_its_gguf(packages: dict[str, Any], tmp_path: Path) -> None:
    """verify recomputes every re-laid part from the GGUF (decoded by the kernels' definition
    against gguf-py); a flipped byte in one QMoE fc1 code part is a mismatch."""
    assert main(["verify", str(packages["int8"]), "--source", str(packages["gguf"])]) == 0
    package = tmp_path / "int8"
    shutil.copytree(packages["int8"], package)
    manifest = json.loads((package / "manifest.json").read_text())
    name, entry = next(
        (n, e)
        for n, e in manifest["graphs"]["decoder"]["initializers"].items()
        if n.endswith(CodeLayout(Operand.FC1).part("b").suffix)
    )
    with open(package / entry["file"], "r+b") as handle:
        handle.seek(entry["offset"] + 5)
        value = handle.read(1)[0]
        handle.seek(entry["offset"] + 5)
        handle.write(bytes([value ^ 0x10]))
    assert main(["verify", str(package), "--source", str(packages["gguf"]), "--quiet"]) == 1


def test_build_says_which_weights_stay_exact(tmp_path: Path, caplog) -> None:
    files = write_gguf(tmp_path / "m.gguf", make_reference(MOE_MODEL), "nemotron_h_moe", TYPES)
    with caplog.at_level(logging.WARNING, logger="mobius_lite.routes"):
        flags = ["--backend", "ort", "--activations", "int8", "--quiet"]
        assert (
            main(["build", "--model", str(files[0]), "--output", str(tmp_path / "p"), *flags]) == 0
        )
    lines = [r.getMessage() for r in caplog.records]
    # attn_output's rows (32 values) cannot hold Q5_K blocks: the fixture writes them Q5_1
    assert any("Q5_1 has no exact MatMulNBits layout; kept on the exact route" in x for x in lines)
    assert any("on QMoE" in x and "x the source experts' bytes" in x for x in lines)
    assert len(lines) == len(set(lines))  # each said once


def test_experts_of_two_widths_stay_exact(tmp_path: Path, caplog) -> None:
    """onnxruntime's CPU QMoE has one bit width for fc1 and fc2: Q8_0 up with Q4_0 down keeps
    the layer's experts on the exact route (said), and the package runs."""
    types = {r"ffn_up_exps\.": "Q8_0", r"ffn_down_exps\.": "Q4_0", **TYPES}  # first match wins
    files = write_gguf(tmp_path / "m.gguf", make_reference(MOE_MODEL), "nemotron_h_moe", types)
    out = tmp_path / "p"
    with caplog.at_level(logging.WARNING, logger="mobius_lite.routes"):
        flags = ["--backend", "ort", "--activations", "int8", "--quiet"]
        assert main(["build", "--model", str(files[0]), "--output", str(out), *flags]) == 0
    assert any("do not both fit one QMoE layout" in r.getMessage() for r in caplog.records)
    assert "QMoE" not in _ops(out)
    tokens, _ = _greedy(out, PROMPTS[1])
    assert len(tokens) == GREEDY_STEPS


def test_fused_modes_need_the_ort_backend(tmp_path: Path, capsys) -> None:
    files = write_gguf(tmp_path / "m.gguf", make_reference(MOE_MODEL), "nemotron_h_moe", TYPES)
    out = tmp_path / "p"
    code = main(["build", "--model", str(files[0]), "--output", str(out), "--activations", "int8"])
    assert code == 2
    assert "--activations int8 needs --backend ort" in capsys.readouterr().err
    assert not out.exists()


def test_dense_experts_on_the_moe_kernel_match_transformers(tmp_path: Path) -> None:
    """A dense (safetensors-like) model: `--activations exact-fused` runs its experts on the
    fused MoE kernel, held to transformers with the FP32 gates."""
    import torch

    from mobius_lite.build import build_from_module

    model = make_reference({**MOE_MODEL, "hidden_size": 64, "moe_intermediate_size": 32})
    package = build_from_module(model, weights_backend="ort", activations="exact-fused")
    out = package.save(tmp_path / "pkg", quiet=True)
    assert "MoE" in _ops(out)
    prompt = PROMPTS[0]
    session = DecoderSession(out / "model.onnx")
    ours = session.step(np.array([prompt]))["logits"][0]
    with torch.no_grad():
        reference = model(torch.tensor([prompt])).logits[0].numpy()
    result = compare("logits", ours, reference)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--dtype", "f16"], "--activations exact-fused needs --dtype f32"),
        (["--ep", "cuda"], "--activations exact-fused needs --ep cpu"),
    ],
)
def test_fused_modes_refuse_other_routes_before_reading(tmp_path: Path, capsys, flags, said):
    out = tmp_path / "p"
    model = str(tmp_path / "absent.gguf")  # refused before the file would be opened
    args = ["build", "--model", model, "--output", str(out), "--backend", "ort", *flags]
    assert main([*args, "--activations", "exact-fused"]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()


def test_onnxruntime_genai_runs_the_fused_packages(packages: dict[str, Any]) -> None:
    """onnxruntime-genai runs QMoE / MatMulNBits packages: its greedy tokens are
    DecoderSession's."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from test_genai import genai_generate

    for mode in ("exact-fused", "int8"):
        tokens, _ = _greedy(packages[mode], PROMPTS[0])
        assert genai_generate(packages[mode], PROMPTS[0], GREEDY_STEPS) == tokens
