"""ModelOpt NVFP4 on the int8 route (`--backend ort --activations int8`, and MatMulNBits at
accuracy 0 under `exact-fused`): the 8-bit block-16 operands that onnxruntime folds from the
verbatim bytes at session creation (formats/modelopt/nvfp4_nbits.py).

References, none of them the code under test: ModelOpt's NVFP4 definition written here (the
E2M1 table from its bit fields, ml_dtypes' float8_e4m3fn, the per-tensor weight_scale_2);
llama.cpp's arithmetic for NVFP4 (vec_dot_type Q8_0: activations quantized per 32,
tests/test_cpu_fast_routes.py); the exact route's package of the same checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest

from formats.emit_harness import run_emitter
from mobius_lite.cli.main import main
from mobius_lite.components.moe_fused import quantized_fused_experts
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare, int8_activation_gate
from mobius_lite.formats.modelopt import nvfp4_nbits
from mobius_lite.formats.modelopt.weight import NVFP4QMoEExperts, NVFP4Weight
from reference_fixtures import modelopt_fixtures as mf
from test_cpu_fast_routes import (
    CONTRIB,
    SPEC,
    WIDTH,
    _greedy,
    assert_tokens_agree_or_near_tie,
    quantize_q8_0,
    relu2_moe,
    routing,
)

F32 = ir.DataType.FLOAT


def e2m1(code: np.ndarray) -> np.ndarray:
    """OCP E2M1: sign bit 3, exponent bits 1-2 (bias 1, 0 subnormal), mantissa bit 0."""
    code = code.astype(np.int64)
    exponent, mantissa = (code >> 1) & 3, code & 1
    normal = (1 + 0.5 * mantissa) * 2.0 ** (exponent - 1)
    return np.where(code & 8, -1.0, 1.0) * np.where(exponent == 0, 0.5 * mantissa, normal)


def by_definition(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray) -> np.ndarray:
    """ModelOpt NVFP4 [..., N, K/2] codes (element 2i low nibble, 2i + 1 high), E4M3 scales per
    16, scale_2 per tensor ([...]) -> float32 (e2m1 x e4m3) x scale_2, rounded once."""
    codes = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
    blocked = e2m1(codes).reshape(*scale.shape, 16) * scale.astype(np.float64)[..., None]
    s2 = np.asarray(scale_2, np.float64).reshape(*scale_2.shape, 1, 1, 1)
    return (blocked * s2).astype(np.float32).reshape(codes.shape)


def test_folded_operands_are_the_format_definition() -> None:
    """Every code byte and every finite E4M3 scale: the folded 8-bit operands, by the kernels'
    definition (code - 128) * scale, times weight_scale_2 / 2, equal ModelOpt's values."""
    rng = np.random.default_rng(3)
    packed = (np.arange(64 * 128) % 256).astype(np.uint8).reshape(64, 128)
    rng.shuffle(packed, axis=1)
    scale_bytes = (np.arange(64 * 16) % 256).astype(np.uint8).reshape(64, 16)
    scale_bytes[(scale_bytes & 0x7F) == 0x7F] = 0x38  # E4M3's NaN bytes: a 1.0 instead
    scale = scale_bytes.view(ml_dtypes.float8_e4m3fn)
    scale_2 = np.array(0.37, np.float32)

    def emit(op, codes, scales):
        return [nvfp4_nbits.emit_codes(op, codes), nvfp4_nbits.emit_scales(op, scales)]

    b, s = run_emitter(emit, [packed, scale], as_initializers=True)
    assert b.dtype == np.uint8 and b.shape == (64, 16, 16) and s.shape == (64, 16)
    ours = (b.astype(np.float32) - np.float32(128)) * s[..., None]
    ours = (ours * (scale_2 * np.float32(0.5))).reshape(64, 256)
    assert np.array_equal(ours, by_definition(packed, scale, scale_2[None]).reshape(64, 256))


def _nvfp4(shape: tuple[int, ...], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """ModelOpt's quantization of Gaussian weights [..., N, K] (per matrix)."""
    parts = [mf.quantize_nvfp4(w) for w in rng.standard_normal(shape).reshape(-1, *shape[-2:])]
    return {
        key: np.stack([p[key] for p in parts]).reshape((*shape[:-2], *parts[0][key].shape))
        for key in ("weight", "weight_scale", "weight_scale_2")
    }


def _values(t: dict[str, np.ndarray]) -> np.ndarray:
    return by_definition(t["weight"], t["weight_scale"], t["weight_scale_2"]).astype(np.float64)


def test_nvfp4_linear_int8_error_is_at_most_llamacpps() -> None:
    rng = np.random.default_rng(4)
    n, k, m = 64, 1024, 16
    t = _nvfp4((n, k), rng)
    fmt = NVFP4Weight(F32).on_exact_layout(4)
    assert isinstance(fmt, NVFP4Weight) and fmt.nbits_accuracy == 4
    x = rng.standard_normal((m, k)).astype(np.float32)

    def emit(op, xv, codes, scales, scale_2):
        return fmt.matmul(op, xv, {"": codes, "_scale": scales, "_scale_2": scale_2})

    arrays = [t["weight"], t["weight_scale"], t["weight_scale_2"].astype(np.float32)]
    (y,) = run_emitter(emit, [x, *arrays], opset_imports=CONTRIB, constant_from=1)
    w = _values(t)
    exact = x.astype(np.float64) @ w.T
    llamacpp = quantize_q8_0(x).astype(np.float64) @ w.T
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5


def test_nvfp4_experts_on_qmoe_int8_error_is_at_most_llamacpps() -> None:
    """Stacked experts, one weight_scale_2 per expert (ModelOpt's ~1e-3): folded into the
    experts' block scales, the QMoE output errs at most as llama.cpp's on the same weights."""
    rng = np.random.default_rng(5)
    e, i, rows = SPEC.n_routed_experts, SPEC.moe_intermediate_size, 32
    up, down = _nvfp4((e, i, WIDTH), rng), _nvfp4((e, WIDTH, i), rng)
    fc1 = NVFP4Weight(F32, stacked=True).on_fused_experts("fc1", True)
    fc2 = NVFP4Weight(F32, stacked=True).on_fused_experts("fc2", True)
    assert isinstance(fc1, NVFP4QMoEExperts) and isinstance(fc2, NVFP4QMoEExperts)
    assert isinstance(NVFP4Weight(F32, stacked=True).on_fused_experts("fc1", False), str)
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    indices, weights = routing(rows, e, SPEC.num_experts_per_tok, rng)
    keys = ("weight", "weight_scale", "weight_scale_2")
    arrays = [
        np.asarray(t[key], np.float32 if key == keys[2] else None)
        for t in (up, down)
        for key in keys
    ]

    def emit(op, xv, iv, wv, *parts):
        names = ("", "_scale", "_scale_2")
        up_params = dict(zip(names, parts[:3], strict=True))
        down_params = dict(zip(names, parts[3:], strict=True))
        return quantized_fused_experts(op, SPEC, (fc1, up_params), (fc2, down_params), 4)(
            op, xv, iv, wv
        )

    (y,) = run_emitter(emit, [x, indices, weights, *arrays], opset_imports=CONTRIB, constant_from=3)
    exact = relu2_moe(x, indices, weights, _values(up), _values(down))
    llamacpp = relu2_moe(x, indices, weights, _values(up), _values(down), quant=quantize_q8_0)
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5


# ----------------------------------------------------------------------------- whole model
# every linear's input width a whole number of 16-element groups (tests/test_gguf_modelopt.py)
WIDE = {
    "hidden_size": 64,
    "mamba_head_dim": 16,
    "head_dim": 16,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
}


@pytest.fixture(scope="module", params=["nvfp4", "mixed"])
def modelopt_packages(request, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp(f"modelopt_int8_{request.param}")
    checkpoint = root / "checkpoint"
    mf.write_checkpoint(request.param, checkpoint, overrides=WIDE)
    out: dict[str, Any] = {"variant": request.param, "checkpoint": checkpoint}
    for mode in ("exact", "exact-fused", "int8"):
        flags = ["--backend", "ort", "--activations", mode] if mode != "exact" else []
        package = root / mode
        assert (
            main(["build", "--model", str(checkpoint), "--output", str(package), "-q", *flags]) == 0
        )
        out[mode] = package
    return out


def _graph(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path), load_external_data=False)


def _nvfp4_linears(checkpoint: Path) -> int:
    """NVFP4 linears outside the routed experts (2-D block scales beside a weight)."""
    tensors = mf.read_tensors(checkpoint)
    return sum(
        1
        for name, t in tensors.items()
        if name.endswith(".weight_scale") and t.ndim == 2 and ".experts." not in name
    )


def test_modelopt_nvfp4_on_the_int8_route(
    modelopt_packages: dict[str, Any], tmp_path: Path
) -> None:
    """Every NVFP4 linear on MatMulNBits (8 bits, block 16), the experts on QMoE; the 8-bit
    operands are folded to initializers when the session is created (onnxruntime's optimized
    graph); greedy tokens as the exact package's or a near tie; verify passes (verbatim)."""
    packages = modelopt_packages
    int8 = packages["int8"]
    nodes = _graph(int8 / "model.onnx").graph.node
    nbits = [n for n in nodes if n.op_type == "MatMulNBits"]
    for node in nbits:
        attributes = {a.name: a.i for a in node.attribute}
        assert (attributes["bits"], attributes["block_size"]) == (8, 16), node.name
    assert len(nbits) == _nvfp4_linears(packages["checkpoint"])
    assert sum(n.op_type == "QMoE" for n in nodes) == 2  # both MoE layers
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(int8 / "model.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = _graph(tmp_path / "optimized.onnx").graph
    constants = {i.name for i in optimized.initializer}
    for node in optimized.node:
        if node.op_type == "MatMulNBits":
            assert node.input[1] in constants and node.input[2] in constants, node.name
        if node.op_type == "QMoE":  # fc1 / fc2 weights and scales
            assert {node.input[i] for i in (2, 3, 5, 6)} <= constants, node.name
    assert_tokens_agree_or_near_tie(int8, packages["exact"])
    checkpoint = str(packages["checkpoint"])
    assert main(["verify", str(int8), "--source", checkpoint, "-q"]) == 0


def test_modelopt_nvfp4_matmulnbits_at_accuracy_0_is_exact(
    modelopt_packages: dict[str, Any],
) -> None:
    """`exact-fused`: the linears on MatMulNBits at accuracy 0 (f32 activations), the experts
    kept on their exact route (8-bit QMoE has no f32 kernel): the exact package's greedy tokens
    and every step's logits within the FP32 gates."""
    fused, exact = modelopt_packages["exact-fused"], modelopt_packages["exact"]
    ops = [n.op_type for n in _graph(fused / "model.onnx").graph.node]
    assert ops.count("MatMulNBits") == _nvfp4_linears(modelopt_packages["checkpoint"])
    assert "QMoE" not in ops
    for prompt in ([5, 17, 42, 3, 8, 21], [1, 2, 3, 4]):
        tokens, steps = _greedy(exact, prompt)
        fused_tokens, fused_steps = _greedy(fused, prompt)
        assert fused_tokens == tokens
        for ours, reference in zip(fused_steps, steps, strict=True):
            result = compare("logits", ours, reference)
            assert result.passes(FP32_NRMSE, FP32_COSINE), result


def test_onnxruntime_genai_runs_the_modelopt_int8_package(
    modelopt_packages: dict[str, Any],
) -> None:
    """onnxruntime-genai folds the 8-bit operands at session creation too: its greedy tokens
    are DecoderSession's."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from test_genai import genai_generate

    prompt = [5, 17, 42, 3, 8, 21]
    tokens, _ = _greedy(modelopt_packages["int8"], prompt)
    assert genai_generate(modelopt_packages["int8"], prompt, len(tokens)) == tokens
