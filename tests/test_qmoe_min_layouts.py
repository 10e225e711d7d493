"""Q4_K experts on QMoE (formats/ggml/relayout/qmoe_min_term.py): the min term as block-sum
input columns (Q4_K up) and a doubled / tripled intermediate (Q4_K down).

References, none of them the code under test: gguf-py's `dequantize` of the same blocks; a
float64 numpy ReLU^2 MoE over those values; llama.cpp's Q8_K activation quantization
(tests/test_cpu_fast_routes.py) before the same float64 product; the exact route's package.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from formats.emit_harness import run_emitter
from mobius_lite.cli.main import main
from mobius_lite.components.moe_fused import quantized_fused_experts
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare, int8_activation_gate
from mobius_lite.formats.ggml.relayout.exact_parts import layout_decode
from mobius_lite.formats.ggml.relayout.qmoe_experts import MinTermExperts, QMoEExperts
from mobius_lite.formats.ggml.relayout.qmoe_min_term import (
    MinTermPlan,
    logical_weight,
    min_term_layout,
    min_term_plan,
)
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.ggml.weight import GGMLWeight
from mobius_lite.formats.parts import Operand, PartParameter
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.nemotron_reference import make_reference
from test_cpu_fast_routes import (
    CONTRIB,
    F32,
    MOE_MODEL,
    PROMPTS,
    SPEC,
    _greedy,
    assert_greedy_within_fp32_gates,
    assert_tokens_agree_or_near_tie,
    exact_weight,
    llamacpp_activations,
    relu2_moe,
    routing,
    values_of,
)

HIDDEN = 512  # two Q4_K super-blocks per up row: the sums of each go to their own block
ROWS = 32


@pytest.mark.parametrize(
    ("type_up", "type_down", "plan"),
    [
        ("Q4_K", "Q4_K", MinTermPlan(8, 32, True, 2)),
        ("Q4_K", "Q4_K", MinTermPlan(4, 32, True, 3)),
        ("Q4_K", "Q6_K", MinTermPlan(8, 16, True, 1)),
        ("Q6_K", "Q4_K", MinTermPlan(8, 16, False, 2)),
        ("Q4_0", "Q4_K", MinTermPlan(8, 32, False, 2)),  # Q4_0 as 8-bit codes q + 120
        ("Q4_K", "Q8_0", MinTermPlan(8, 32, True, 1)),
    ],
)
def test_min_term_operands_stand_for_gguf_pys_values(type_up, type_down, plan) -> None:
    """Decoded by QMoE's definition and folded back (row copies, sum columns, intermediate
    copies), each operand is gguf-py's dequantized experts exactly."""
    rng = np.random.default_rng(0)
    e, inner = 2, SPEC.moe_intermediate_size
    for slot, t, shape in (
        ("fc1", type_up, (e, inner, HIDDEN)),
        ("fc2", type_down, (e, HIDDEN, inner)),
    ):
        rows = exact_weight(t, shape, rng)
        decoded = layout_decode(min_term_layout(t, slot, rows, plan))
        weight = logical_weight(decoded, slot, plan, *shape[1:])
        assert weight is not None
        np.testing.assert_array_equal(weight, values_of(t, rows, shape).astype(np.float32))


def test_min_term_plans() -> None:
    assert min_term_plan("Q4_K", "Q6_K", int8=True) == MinTermPlan(8, 16, True, 1)
    assert min_term_plan("Q4_K", "Q4_K", int8=True) == MinTermPlan(8, 32, True, 2)
    assert min_term_plan("Q4_K", "Q4_K", int8=False) == MinTermPlan(4, 32, True, 3)
    assert "int8 activations only" in min_term_plan("Q4_K", "Q6_K", int8=False)
    assert "no exact QMoE layout" in min_term_plan("Q4_K", "Q5_K", int8=True)


def _qmoe(type_up: str, type_down: str, int8: bool, seed: int):
    """The package's QMoE node (paired min-term operands, augmented input, sliced output) ->
    (output, x, routing, float64 up and down)."""
    rng = np.random.default_rng(seed)
    e, inner = SPEC.n_routed_experts, SPEC.moe_intermediate_size
    shapes = {"up": (e, inner, HIDDEN), "down": (e, HIDDEN, inner)}
    types = {"up": type_up, "down": type_down}
    rows = {a: exact_weight(types[a], shapes[a], rng) for a in shapes}
    slots = {}
    for attr, kind in (("up", Operand.FC1.value), ("down", Operand.FC2.value)):
        t = GGML_TYPES[types[attr]]
        exact = GGMLWeight.choose(t, F32, "ort", shapes[attr])
        slots[attr] = QMoEExperts(t, F32, shapes[attr], kind, exact, int8)
    paired = slots["up"].paired_with(slots["down"])
    assert not isinstance(paired, str), paired
    fmt = dict(zip(("up", "down"), paired, strict=True))
    names: list[tuple[str, str]] = []
    arrays: list[np.ndarray] = []
    for attr, operand in fmt.items():
        assert isinstance(operand, MinTermExperts)
        layout = min_term_layout(types[attr], operand.kind, rows[attr], operand.plan)
        by_part = layout.arrays()
        for suffix, parameter in operand.parameters(shapes[attr]).items():
            names.append((attr, suffix))
            assert isinstance(parameter, PartParameter)
            arrays.append(by_part[parameter.part_of.part])
    x = rng.standard_normal((ROWS, HIDDEN)).astype(np.float32)
    indices, weights = routing(ROWS, e, SPEC.num_experts_per_tok, rng)

    def emit(op, xv, iv, wv, *parts):
        params: dict[str, dict[str, Any]] = {"up": {}, "down": {}}
        for (attr, suffix), value in zip(names, parts, strict=True):
            params[attr][suffix] = value
        up, down = (fmt["up"], params["up"]), (fmt["down"], params["down"])
        accuracy = 4 if int8 else 0
        return quantized_fused_experts(op, SPEC, up, down, accuracy)(op, xv, iv, wv)

    (y,) = run_emitter(emit, [x, indices, weights, *arrays], opset_imports=CONTRIB, constant_from=3)
    up, down = (values_of(types[a], rows[a], shapes[a]) for a in ("up", "down"))
    return y, x, indices, weights, up, down


def test_qmoe_q4_k_experts_at_accuracy0_are_relu2() -> None:
    """exact-fused: Q4_K up and down on 4-bit QMoE with f32 activations, within the FP32
    gates of a float64 ReLU^2 over gguf-py's values."""
    y, x, indices, weights, up, down = _qmoe("Q4_K", "Q4_K", int8=False, seed=1)
    assert y.shape == (ROWS, HIDDEN)
    result = compare("qmoe q4_k", y, relu2_moe(x, indices, weights, up, down))
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


@pytest.mark.parametrize(("type_up", "type_down"), [("Q4_K", "Q4_K"), ("Q4_K", "Q6_K")])
def test_qmoe_q4_k_int8_error_is_at_most_llamacpps(type_up: str, type_down: str) -> None:
    """int8: the error against the float64 reference is no larger than llama.cpp's own (its
    activations quantized to Q8_K before both expert matmuls: Q4_K and Q6_K's vec_dot_type)."""
    y, x, indices, weights, up, down = _qmoe(type_up, type_down, int8=True, seed=2)
    exact = relu2_moe(x, indices, weights, up, down)
    llamacpp = relu2_moe(
        x, indices, weights, up, down, quant=lambda a: llamacpp_activations(type_up, a)
    )
    ours, theirs = compare("package", y, exact), compare("llama.cpp", llamacpp, exact)
    assert int8_activation_gate(ours, theirs), (ours, theirs)
    assert ours.nrmse > 1e-5  # int8 activations really were used


# ----------------------------------------------------------------------------- whole model
# llama.cpp's Q4_K_M preset for the experts: every ffn_up_exps Q4_K, ffn_down_exps Q6_K in
# some layers (here the first MoE layer) and Q4_K in the others; first match wins
Q4_K_M_TYPES = {
    r"^token_embd": "Q8_0",
    r"^output\.": "Q6_K",
    r"blk\.1\.ffn_down_exps\.": "Q6_K",
    r"ffn_(up|down)_exps\.": "Q4_K",
    r"ffn_(up|down)_shexp\.": "Q8_0",
}


def _qmoe_nodes(package: Path) -> int:
    model = onnx.load(str(package / "model.onnx"), load_external_data=False)
    return sum(n.op_type == "QMoE" for n in model.graph.node)


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("qmoe_min_layouts")
    files = write_gguf(tmp / "m.gguf", make_reference(MOE_MODEL), "nemotron_h_moe", Q4_K_M_TYPES)
    out: dict[str, Any] = {"gguf": files[0], "lines": {}}
    for mode in ("exact", "exact-fused", "int8"):
        handler = _Lines()
        logging.getLogger("mobius_lite.routes").addHandler(handler)
        flags = ["--backend", "ort", "--activations", mode, "--quiet"]
        try:
            assert (
                main(["build", "--model", str(files[0]), "--output", str(tmp / mode), *flags]) == 0
            )
        finally:
            logging.getLogger("mobius_lite.routes").removeHandler(handler)
        out[mode], out["lines"][mode] = tmp / mode, handler.lines
    return out


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_int8_puts_q4_k_m_experts_on_qmoe(q4_k_m: dict[str, Any]) -> None:
    """Both MoE layers (Q4_K / Q6_K and Q4_K / Q4_K) run on QMoE, said with their byte cost;
    greedy tokens equal the exact route's or part at a near tie (the margin reported); the
    package verifies against its GGUF."""
    assert _qmoe_nodes(q4_k_m["int8"]) == 2
    lines = q4_k_m["lines"]["int8"]
    assert any("(Q4_K / Q6_K) on QMoE, 8-bit, block 16" in x for x in lines), lines
    assert any("(Q4_K / Q4_K) on QMoE, 8-bit, block 32" in x for x in lines), lines
    assert_tokens_agree_or_near_tie(q4_k_m["int8"], q4_k_m["exact"])
    assert main(["verify", str(q4_k_m["int8"]), "--source", str(q4_k_m["gguf"]), "--quiet"]) == 0


@pytest.mark.parametrize("where", ["main codes", "min copy"])
def test_verify_catches_a_flipped_min_term_code(q4_k_m, tmp_path: Path, where: str) -> None:
    """A flipped byte in the all-Q4_K layer's fc2 codes, in its A2 part or its -B2 copy (the
    min term), no longer stands for the GGUF's experts: verify reports it."""
    package = tmp_path / "int8"
    shutil.copytree(q4_k_m["int8"], package)
    manifest = json.loads((package / "manifest.json").read_text())
    name, entry = next(
        (n, e)
        for n, e in manifest["graphs"]["decoder"]["initializers"].items()
        if n.endswith("_fc2q8b32c2s_b")
    )
    at = entry["offset"] + (3 if where == "main codes" else MOE_MODEL["moe_intermediate_size"] + 3)
    with open(package / entry["file"], "r+b") as handle:
        handle.seek(at)
        value = handle.read(1)[0]
        handle.seek(at)
        handle.write(bytes([value ^ 0x04]))
    assert main(["verify", str(package), "--source", str(q4_k_m["gguf"]), "--quiet"]) == 1, name


def test_exact_fused_puts_all_q4_k_layers_on_qmoe(q4_k_m: dict[str, Any]) -> None:
    """exact-fused: the all-Q4_K layer on 4-bit QMoE at accuracy 0 (logits within the FP32
    gates of the exact route's), the Q6_K-down layer kept exact (8-bit QMoE has no f32
    kernel), said once."""
    assert _qmoe_nodes(q4_k_m["exact-fused"]) == 1
    lines = q4_k_m["lines"]["exact-fused"]
    assert any("(Q4_K / Q4_K) on QMoE, 4-bit, block 32" in x for x in lines), lines
    assert any("int8 activations only; kept on the exact experts route" in x for x in lines)
    assert_greedy_within_fp32_gates(q4_k_m["exact-fused"], q4_k_m["exact"])


def test_onnxruntime_genai_runs_the_q4_k_m_int8_package(q4_k_m: dict[str, Any]) -> None:
    """onnxruntime-genai runs the min-term QMoE package: its greedy tokens are
    DecoderSession's."""
    pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed")
    from test_genai import genai_generate

    tokens, _ = _greedy(q4_k_m["int8"], PROMPTS[0])
    assert genai_generate(q4_k_m["int8"], PROMPTS[0], len(tokens)) == tokens
