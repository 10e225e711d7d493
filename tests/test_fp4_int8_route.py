"""NVFP4 (ggml type 40) and MXFP4 (type 39) on the int8 route (`--backend ort --activations
int8`): their 8-bit exact code layouts for MatMulNBits (block 16 / 32) and QMoE, and the
`.scale` sidecars folded in (formats/weight.py: OutputScaled, ScaledExperts).

References, none of them the code under test: the formats' definitions written here in numpy
(the E2M1 table from its bit fields, E8M0 as 2^(e - 127), UE4M3 as ggml reads it, each
element's place in its block) and gguf-py's `dequantize`; llama.cpp's own arithmetic for these
types (vec_dot_type Q8_0: activations quantized per 32, tests/test_cpu_fast_routes.py); the
exact route's package of the same file.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize, quantize

from formats.emit_harness import run_emitter
from mobius_lite.cli.main import main
from mobius_lite.components.moe_fused import quantized_fused_experts
from mobius_lite.evaluation.metrics import compare, int8_activation_gate
from mobius_lite.formats.ggml.relayout.exact_layout import to_nbits_layout
from mobius_lite.formats.ggml.relayout.qmoe_experts import QMoEExperts
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.ggml.weight import GGMLWeight
from mobius_lite.formats.parts import CodeLayout, Operand
from mobius_lite.formats.weight import OUTPUT_SCALE, OutputScaled
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.gguf_fixtures import converter_tensors, random_blocks, write_gguf
from reference_fixtures.gguf_nvfp4_fixtures import quantized_nvfp4, write_modelopt_gguf
from reference_fixtures.nemotron_reference import make_reference
from test_cpu_fast_routes import (
    CONTRIB,
    F32,
    SPEC,
    WIDTH,
    assert_tokens_agree_or_near_tie,
    quantize_q8_0,
    relu2_moe,
    routing,
)

FP4 = ("MXFP4", "NVFP4")
FC1, FC2 = Operand.FC1.value, Operand.FC2.value  # the fused-experts slot kinds


# ----------------------------------------------------------------------------- definitions
def e2m1(code: np.ndarray) -> np.ndarray:
    """OCP E2M1: sign bit 3, exponent bits 1-2 (bias 1), mantissa bit 0; exponent 0 is
    subnormal (0 or 0.5)."""
    code = code.astype(np.int64)
    sign = np.where(code & 8, -1.0, 1.0)
    exponent, mantissa = (code >> 1) & 3, code & 1
    normal = (1 + 0.5 * mantissa) * 2.0 ** (exponent - 1)
    magnitude = np.where(exponent == 0, 0.5 * mantissa, normal)
    return sign * magnitude


def ue4m3(byte: np.ndarray) -> np.ndarray:
    """ggml's UE4M3 (ggml_ue4m3_to_fp32 without its 0.5): exponent bits 3-6 (bias 7, 0
    subnormal), mantissa bits 0-2, bit 7 ignored; the bytes 0x00 and 0x7F (E4M3's NaN) are 0."""
    byte = byte.astype(np.int64)
    exponent, mantissa = (byte >> 3) & 0xF, byte & 7
    value = np.where(
        exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    )
    return np.where((byte == 0x00) | (byte == 0x7F), 0.0, value)


def by_definition(type_name: str, rows: np.ndarray) -> np.ndarray:
    """ggml rows uint8 [N, row_bytes] -> float64 [N, K], from the block layouts:
    MXFP4: E8M0 byte e, 16 bytes; element j < 16 the low nibble of byte j, j + 16 its high
    nibble; value e2m1 * 2^(e - 127). NVFP4: 4 UE4M3 bytes, 32 bytes; group s holds elements
    j < 8 in the low nibbles of bytes 8 s + j, j + 8 in the high; value e2m1 * ue4m3(d_s)."""
    n = rows.shape[0]
    t = GGML_TYPES[type_name]
    blocks = rows.reshape(n, -1, t.block_bytes)
    if type_name == "MXFP4":
        qs = blocks[..., 1:17]
        codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1)  # [N, b, 32]
        scale = 2.0 ** (blocks[..., 0:1].astype(np.float64) - 127)
        return (e2m1(codes) * scale).reshape(n, -1)
    qs = blocks[..., 4:36].reshape(n, -1, 4, 8)
    codes = np.concatenate([qs & 0xF, qs >> 4], axis=-1)  # [N, b, 4, 16]
    return (e2m1(codes) * ue4m3(blocks[..., 0:4])[..., None]).reshape(n, -1)


def layout_values(layout) -> np.ndarray:
    """The kernels' definition: (code - 128) * scale per block (8 bits, zero point 128)."""
    assert layout.bits == 8 and layout.zero_points is None and layout.mins is None
    n, k_blocks = layout.scales.shape
    codes = layout.b.reshape(n, k_blocks, -1).astype(np.float32) - np.float32(128)
    return (codes * layout.scales[..., None]).reshape(n, -1)


@pytest.mark.parametrize("type_name", FP4)
def test_fp4_layouts_decode_to_the_format_definition(type_name: str) -> None:
    """Every code and every scale byte: the re-laid values equal the definition value for
    value (and gguf-py's dequantize bit for bit), at the issue's blocks (NVFP4 16, MXFP4 32)."""
    rng = np.random.default_rng(7)
    rows = random_blocks(type_name, (64, 256), rng)
    t = GGML_TYPES[type_name]
    blocks = rows.reshape(-1, t.block_bytes)
    if type_name == "NVFP4":  # every UE4M3 byte, 0x00 and 0x7F and the sign bit included
        blocks[:, :4] = np.arange(blocks.shape[0] * 4).reshape(-1, 4) % 256
    else:  # every E8M0 exponent whose values stay finite (12 * 2^(e - 127) < 2^128)
        blocks[:, 0] = np.arange(blocks.shape[0]) % 252
    layout = to_nbits_layout(type_name, rows)
    assert layout.block_size == {"MXFP4": 32, "NVFP4": 16}[type_name]
    ours = layout_values(layout)
    expected = by_definition(type_name, rows).astype(np.float32)
    # value for value: E2M1's code 8 is -0, which ggml decodes as +0 (no sum can see it)
    assert np.array_equal(ours, expected)
    gguf_py = np.asarray(dequantize(rows, GGMLQuantizationType[type_name]), np.float32)
    assert np.array_equal(ours.view(np.uint32), gguf_py.reshape(ours.shape).view(np.uint32))


# ----------------------------------------------------------------------------- scaled QMoE
def _scaled_qmoe(type_name: str, scales: dict[str, np.ndarray], seed: int):
    """QMoE on exact FP4 experts with per-expert output scales (OutputScaled -> ScaledExperts)
    -> (output, x, routing, float64 unscaled weights)."""
    rng = np.random.default_rng(seed)
    e, i, rows = SPEC.n_routed_experts, SPEC.moe_intermediate_size, 32
    data = {
        "up": random_blocks(type_name, (e, i, WIDTH), rng),
        "down": random_blocks(type_name, (e, WIDTH, i), rng),
    }
    x = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    indices, weights = routing(rows, e, SPEC.num_experts_per_tok, rng)
    fmt, names, arrays = {}, [], []
    for attr, kind, shape in (("up", FC1, (e, i, WIDTH)), ("down", FC2, (e, WIDTH, i))):
        plain = GGMLWeight.choose(GGML_TYPES[type_name], F32, "ort", shape)
        moved = OutputScaled(plain, F32, stacked=True).on_fused_experts(kind, True)
        assert not isinstance(moved, str), moved
        assert isinstance(moved.inner, QMoEExperts)
        fmt[attr] = moved
        layout = to_nbits_layout(type_name, data[attr], repeat=2 if kind == FC1 else 1)
        for part, array in layout.arrays().items():
            names.append((attr, CodeLayout(Operand.of_experts(kind)).part(part).suffix))
            arrays.append(array.reshape(*array.shape[:-2], -1) if part == "b" else array)
        names.append((attr, OUTPUT_SCALE))
        arrays.append(scales[attr])

    def emit(op, xv, iv, wv, *parts):
        params: dict[str, dict[str, Any]] = {"up": {}, "down": {}}
        for (attr, suffix), value in zip(names, parts, strict=True):
            params[attr][suffix] = value
        up, down = (fmt["up"], params["up"]), (fmt["down"], params["down"])
        return quantized_fused_experts(op, SPEC, up, down, 4)(op, xv, iv, wv)

    (y,) = run_emitter(emit, [x, indices, weights, *arrays], opset_imports=CONTRIB, constant_from=3)
    values = {
        a: by_definition(type_name, d.reshape(-1, d.shape[-1])).reshape(*d.shape[:-1], -1)
        for a, d in data.items()
    }
    return y, x, indices, weights, values["up"], values["down"]


@pytest.mark.parametrize("type_name", FP4)
def test_scaled_fp4_experts_on_qmoe_err_as_llamacpp(type_name: str) -> None:
    """The `.scale` of stacked experts (one per expert) folded into their block scales: the
    QMoE output against float64 experts computed as llama.cpp's graph does (matmul, x s1,
    ReLU^2, matmul, x s2), its int8 error at most llama.cpp's own (Q8_0 activations). Scales
    of either sign and as small as ModelOpt's (weight_scale_2 = amax / 2688, ~1e-3), within a
    factor 2.5 of each other (so that no few experts dominate the error statistics)."""
    rng = np.random.default_rng(11)
    e = SPEC.n_routed_experts
    scales = {
        a: (rng.choice([-1.0, 1.0], size=e) * 10 ** rng.uniform(-3.2, -2.8, size=e)).astype(
            np.float32
        )
        for a in ("up", "down")
    }
    y, x, indices, weights, up, down = _scaled_qmoe(type_name, scales, seed=5)
    up = up * scales["up"].astype(np.float64)[:, None, None]
    down = down * scales["down"].astype(np.float64)[:, None, None]
    exact = relu2_moe(x, indices, weights, up, down)
    llamacpp = relu2_moe(x, indices, weights, up, down, quant=quantize_q8_0)
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5  # int8 activations really were used


# ----------------------------------------------------------------------------- whole model
MOE_MODEL = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "hidden_size": 256,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 256,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
}
# llama-quantize's MXFP4_MOE: MXFP4 routed experts, Q8_0 for the other matrices (and for
# the NVFP4 file's matrices whose rows are not whole 64-element superblocks)
MXFP4_MOE_TYPES = {r"^token_embd": "Q8_0", r"^output\.": "Q8_0", r"\.weight$": "Q8_0"}
# the converter's NVFP4 output of a ModelOpt checkpoint: every projection, with its scale
NVFP4_WEIGHTS = re.compile(r"(ssm_(in|out)|attn_(q|k|v|output)|ffn_(up|down)(_exps|_shexp)?)\.")


def _mxfp4_gguf(path: Path, model: Any) -> Path:
    packed = {}
    for name, values in converter_tensors(model, "nemotron_h_moe").items():
        if re.search(r"ffn_(up|down)_exps\.", name):
            packed[name] = (quantize(values, GGMLQuantizationType.MXFP4), "MXFP4")
    return write_gguf(path, model, "nemotron_h_moe", MXFP4_MOE_TYPES, packed=packed)[0]


def _nvfp4_gguf(path: Path, model: Any) -> Path:
    packed, sidecars = {}, {}
    for name, values in converter_tensors(model, "nemotron_h_moe").items():
        if not NVFP4_WEIGHTS.search(name) or values.shape[-1] % 64:
            continue  # rows of whole 64-element superblocks only (the others: Q8_0)
        stem = name.removesuffix(".weight")
        if values.ndim == 3:  # experts: one ModelOpt quantization (and scale) per expert
            parts = [quantized_nvfp4(v) for v in values]
            packed[name] = (np.stack([p[0] for p in parts]), "NVFP4")
            sidecars[stem + ".scale"] = np.array([p[1] for p in parts], np.float32)
        else:
            rows, scale_2 = quantized_nvfp4(values)
            packed[name] = (rows, "NVFP4")
            sidecars[stem + ".scale"] = np.array([scale_2], np.float32)
    return write_gguf(
        path, model, "nemotron_h_moe", MXFP4_MOE_TYPES, packed=packed, extra_tensors=sidecars
    )[0]


# every linear's input width a whole number of NVFP4 superblocks (tests/test_gguf_modelopt.py)
WIDE = {
    "hidden_size": 64,
    "mamba_head_dim": 16,
    "head_dim": 16,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
}


def _converted_gguf(path: Path, work: Path) -> Path:
    """llama.cpp's converter's NVFP4 output of a ModelOpt NVFP4 checkpoint (F32 elsewhere)."""
    checkpoint = work / "checkpoint"
    mf.write_checkpoint("nvfp4", checkpoint, overrides=WIDE)
    (file,), _ = write_modelopt_gguf(checkpoint, path, work)
    return file


@pytest.fixture(scope="module", params=[*FP4, "converted"])
def fp4_packages(request, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "converted":
        gguf = _converted_gguf(tmp / "model.gguf", tmp)
    else:
        writer = _mxfp4_gguf if request.param == "MXFP4" else _nvfp4_gguf
        gguf = writer(tmp / "model.gguf", make_reference(MOE_MODEL))
    out: dict[str, Any] = {"type": request.param, "gguf": gguf}
    for mode in ("exact", "int8"):
        flags = ["--backend", "ort", "--activations", mode, "--quiet"]
        assert main(["build", "--model", str(gguf), "--output", str(tmp / mode), *flags]) == 0
        out[mode] = tmp / mode
    return out


def _exact_linears(path: Path) -> int:
    """The file's matrices (not the routed experts, not the embedding table) stored in a type
    with an exact 8-bit layout: Q8_0, MXFP4, NVFP4."""
    return sum(
        1
        for t in GGUFReader(path).tensors
        if len(t.shape) == 2
        and t.tensor_type.name in ("Q8_0", "MXFP4", "NVFP4")
        and t.name != "token_embd.weight"
    )


def _op_counts(package: Path) -> dict[str, int]:
    model = onnx.load(str(package / "model.onnx"), load_external_data=False)
    counts: dict[str, int] = {}
    for node in model.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_fp4_file_on_the_int8_route(fp4_packages: dict[str, Any], tmp_path: Path) -> None:
    """Every FP4 matrix on MatMulNBits / QMoE (no standard-op decode of FP4 left), greedy
    tokens as the exact route's (or a near tie), and verify re-derives every re-laid byte."""
    int8 = fp4_packages["int8"]
    counts = _op_counts(int8)
    assert counts.get("QMoE") == 2  # both MoE layers' routed experts
    linears = _exact_linears(fp4_packages["gguf"])
    assert linears > 0 and counts.get("MatMulNBits", 0) == linears, counts
    assert_tokens_agree_or_near_tie(int8, fp4_packages["exact"])
    gguf = str(fp4_packages["gguf"])
    assert main(["verify", str(int8), "--source", gguf, "--quiet"]) == 0
    # one flipped code byte of a re-laid QMoE fc1 part is a mismatch
    package = tmp_path / "tampered"
    shutil.copytree(int8, package)
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
    assert main(["verify", str(package), "--source", gguf, "--quiet"]) == 1


def test_fp4_build_keeps_nothing_on_the_exact_route(tmp_path: Path, caplog) -> None:
    """The build's route lines: FP4 experts on QMoE with their byte cost, and no FP4 weight
    'kept on the exact route'."""
    model = make_reference(MOE_MODEL)
    gguf = _nvfp4_gguf(tmp_path / "model.gguf", model)
    flags = ["--backend", "ort", "--activations", "int8", "--quiet"]
    with caplog.at_level(logging.WARNING, logger="mobius_lite.routes"):
        assert main(["build", "--model", str(gguf), "--output", str(tmp_path / "p"), *flags]) == 0
    said = caplog.text
    assert "experts (NVFP4 / NVFP4) on QMoE" in said
    assert "output scales in the block scales" in said
    assert "kept on the exact" not in said, said


# ----------------------------------------------------------------------------- kernel facts
def _native_fp4_qmoe(quant: str, block: int, rng: np.random.Generator):
    """One CPU QMoE node of quant_type `quant` (E2M1 bytes [E, N, K/2], float32 block scales,
    per-expert global scales), identity activation, one expert per row -> (output, the expert
    each row took, codes and scales of fc1 / fc2, global scales)."""
    from onnx import TensorProto, helper, numpy_helper

    e, h, i, rows = 2, 64, 32, 4
    w1 = rng.integers(0, 256, (e, i, h // 2), dtype=np.uint8)
    w2 = rng.integers(0, 256, (e, h, i // 2), dtype=np.uint8)
    s1 = (2.0 ** rng.integers(-3, 2, (e, i, h // block))).astype(np.float32)
    s2 = (2.0 ** rng.integers(-3, 2, (e, h, i // block))).astype(np.float32)
    g1, g2 = np.array([0.5, 2.0], np.float32), np.array([1.0, 0.25], np.float32)
    arrays = {"w1": w1, "w2": w2, "s1": s1, "s2": s2, "g1": g1, "g2": g2}
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    inputs = ["x", "p", "w1", "s1", "", "w2", "s2", *[""] * 7, "rw", "g1", "g2"]
    node = helper.make_node(
        "QMoE",
        inputs,
        ["y"],
        domain="com.microsoft",
        k=1,
        quant_type=quant,
        activation_type="identity",
        expert_weight_bits=4,
        block_size=block,
        normalize_routing_weights=0,
    )
    io = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [rows, d])
        for n, d in (("x", h), ("p", e), ("rw", e))
    ]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    graph = helper.make_graph([node], "g", io, out, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = rng.standard_normal((rows, h)).astype(np.float32)
    chosen = np.arange(rows) % e
    p = np.eye(e, dtype=np.float32)[chosen]
    (y,) = session.run(None, {"x": x, "p": p, "rw": np.ones((rows, e), np.float32)})
    return y, x, chosen, arrays


def _blockwise(codes: np.ndarray, scales: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Codes [E, N, K/2] (element 2j low nibble, 2j + 1 high) through `table`, times the
    block scales [E, N, K / block]."""
    values = table[np.stack([codes & 15, codes >> 4], -1).reshape(*codes.shape[:-1], -1)]
    block = values.shape[-1] // scales.shape[-1]
    return (values.reshape(*scales.shape, block) * scales[..., None]).reshape(values.shape)


@pytest.mark.parametrize(("quant", "block"), [("nvfp4", 16), ("fp4", 32)])
def test_cpu_qmoe_reads_fp4_quant_types_as_int4(quant: str, block: int) -> None:
    """onnxruntime 1.32's CPU QMoE accepts quant_type nvfp4 / fp4 but computes the codes as
    int4 ((nibble - 8) * block scale) and ignores the global scales: why the FP4 experts use
    the exact 8-bit layouts instead (docs/gguf.md). If this fails, the kernel changed."""
    y, x, chosen, a = _native_fp4_qmoe(quant, block, np.random.default_rng(1))
    int4 = np.arange(16, dtype=np.float64) - 8
    fp4 = e2m1(np.arange(16))

    def expected(table: np.ndarray, global_scales: bool) -> np.ndarray:
        w1, w2 = _blockwise(a["w1"], a["s1"], table), _blockwise(a["w2"], a["s2"], table)
        if global_scales:
            w1, w2 = w1 * a["g1"][:, None, None], w2 * a["g2"][:, None, None]
        return np.stack([w2[e] @ (w1[e] @ x[r]) for r, e in enumerate(chosen)])

    assert compare("int4", y, expected(int4, False)).nrmse < 1e-5
    assert compare("e2m1", y, expected(fp4, True)).nrmse > 0.5
