r"""Which onnxruntime CPU kernels compute with ggml's blocks, how fast and how exactly (issue 14).

The decode target (at most llama.cpp's ms/token) needs kernels that read packed weights and
run the routed experts with ReLU^2. This script measures what onnxruntime's CPU provider
offers for that, one kernel at a time, on weights quantized by gguf-py (the packed-format
oracle) and re-laid losslessly by mobius_lite's MatMulNBits relayout:

  matvec  one [N, K] weight times one row (a decode step's linear layer):
          f32 Gemm(transB) on a constant, and MatMulNBits on Q4_0 / Q8_0 blocks at
          accuracy level 0 (f32 activations) and 4 (int8 activations, llama.cpp's way);
          Issue 22 adds the exact re-layouts of Q4_K (with its min term), Q6_K and IQ2_XXS
          (formats/ggml/relayout/exact_layout.py; random valid blocks, gguf-py cannot quantize
          them);
  experts one decode row through --experts-per-token of --experts experts (the mid model's
          widths): the fused com.microsoft MoE (f32) and QMoE (Q4_0 / Q8_0 blocks) CPU
          kernels. Both lack ReLU^2 on CPU (the script records their refusal of relu2), so
          the "-relu" variants run with ReLU, and the "-relu2" variants run ReLU^2 exactly in
          the SwiGLU form the package emits (components/moe_fused.py: fc1 rows twice,
          alpha 1e30, beta 0), against a ReLU^2 reference. "q8_0-gathered-relu2" reads fc1
          once another way: the selected experts' packed rows gathered at run time into
          one MatMulNBits weight for fc1 and one for fc2 (their K axes joined), ReLU^2
          between (MatMulNBits takes a weight that is not a constant).

The script also records what the CPU kernels say at session creation to the two other
forms that would read fc1 once: activation_type relu2, and SwiGLU with a separate fc3
(swiglu_fusion 0) that is fc1's own initializer.

Each variant runs in its own fresh process, order rotating over --rounds; the error is the
largest absolute difference to a float64 product over gguf-py's dequantized weights (ReLU for
the experts), divided by the largest reference value.

Usage:
    python benchmarks/investigations/cpu_kernel_gaps.py --threads 2 --rounds 3 \
        --json benchmarks/investigations/runs/cpu_kernel_gaps.json
    python benchmarks/investigations/cpu_kernel_gaps.py --threads 2 --rounds 5 \
        --variants q8_0-qmoe-relu2,q8_0-gathered-relu2 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.package_peer import session_options
from mobius_lite.components.moe_fused import RELU2_AS_SWIGLU
from mobius_lite.formats.contrib import CONTRIB_DOMAIN, CONTRIB_OPSET

# One variant: what it computes on, with which kernel settings.
MATVEC = {
    "f32-gemm": ("F32", None),
    "q4_0-matmulnbits-acc0": ("Q4_0", 0),
    "q4_0-matmulnbits-acc4": ("Q4_0", 4),
    "q8_0-matmulnbits-acc0": ("Q8_0", 0),
    "q8_0-matmulnbits-acc4": ("Q8_0", 4),
    "q4_k-matmulnbits-acc0": ("Q4_K", 0),
    "q4_k-matmulnbits-acc4": ("Q4_K", 4),
    "q6_k-matmulnbits-acc0": ("Q6_K", 0),
    "q6_k-matmulnbits-acc4": ("Q6_K", 4),
    "iq2_xxs-matmulnbits-acc0": ("IQ2_XXS", 0),
    "iq2_xxs-matmulnbits-acc4": ("IQ2_XXS", 4),
}
EXPERTS = {
    "f32-moe-relu": ("F32", None),
    "q4_0-qmoe-relu-acc0": ("Q4_0", 0),
    "q4_0-qmoe-relu-acc4": ("Q4_0", 4),
    "q8_0-qmoe-relu": ("Q8_0", 0),
    "f32-moe-relu2": ("F32", None),
    "q4_0-qmoe-relu2-acc0": ("Q4_0", 0),
    "q4_0-qmoe-relu2-acc4": ("Q4_0", 4),
    "q8_0-qmoe-relu2": ("Q8_0", 0),
    "q8_0-gathered-relu2": ("Q8_0", 4),
}


@dataclass(frozen=True)
class Shapes:
    n: int
    k: int
    experts: int
    per_token: int
    hidden: int
    inner: int


def _quantized(weight: np.ndarray, type_name: str) -> tuple[Any, np.ndarray]:
    """(MatMulNBits weights, gguf-py's dequantized f32 values) of an [N, K] f32 weight."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import to_matmulnbits

    kind = GGMLQuantizationType[type_name]
    rows = quantize(weight, kind)
    return to_matmulnbits(type_name, rows, weight.shape[1]), dequantize(rows, kind)


def _exact_layout(type_name: str, n: int, k: int, seed: int) -> tuple[Any, np.ndarray | None]:
    """(exact block-wise layout, gguf-py's values; for seed 0 only, the one the error is
    measured on) of random valid blocks of a type gguf-py cannot quantize."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from mobius_lite.formats.ggml.relayout.exact_layout import to_nbits_layout
    from reference_fixtures.gguf_fixtures import random_blocks

    rows = random_blocks(type_name, (n, k), np.random.default_rng(seed))
    values = None
    if seed == 0:
        values = dequantize(rows, GGMLQuantizationType[type_name]).reshape(n, k)
        values = values.astype(np.float32)
    return to_nbits_layout(type_name, rows, center_mins=True), values


def _session(
    nodes: list, inputs: list, outputs: list, inits: list, threads: int, log_level: int = 3
) -> Any:
    """A CPU session over one graph of these nodes (log_level 3: errors only)."""
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph(nodes, "kernel", inputs, outputs, inits)
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 21),
            helper.make_opsetid(CONTRIB_DOMAIN, CONTRIB_OPSET),
        ],
    )
    options = session_options(threads)
    options.log_severity_level = log_level
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _timed(session: Any, feeds: list[dict], seconds: float) -> tuple[np.ndarray, float]:
    """The first feed's output and the median wall time per call, cycling through `feeds`
    for about `seconds` (at least 5 calls)."""
    out = session.run(None, feeds[0])[0]
    wall: list[float] = []
    while len(wall) < 5 or sum(wall) < seconds:
        start = time.perf_counter()
        session.run(None, feeds[len(wall) % len(feeds)])
        wall.append(time.perf_counter() - start)
    return out, statistics.median(wall)


def _copies(nbytes: int, footprint: int) -> int:
    """Independent copies of a weight that make the working set exceed `footprint` bytes
    (beyond the last-level cache, as a decode step's weights are)."""
    return max(1, -(-footprint // nbytes))


def _error(out: np.ndarray, reference: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - reference).max() / np.abs(reference).max())


def _matvec_weight(name: str, copy: int, weight: np.ndarray, shapes: Shapes) -> tuple:
    """(node, initializers, values the kernel computes with, bytes it reads) of one weight."""
    from onnx import helper, numpy_helper

    type_name, accuracy = MATVEC[name]
    x, y = "x", f"y{copy}"
    if accuracy is None:
        w = numpy_helper.from_array(weight, f"w{copy}")
        return helper.make_node("Gemm", [x, w.name], [y], transB=1), [w], weight, weight.nbytes
    if type_name not in ("Q4_0", "Q8_0"):
        return _exact_matvec(type_name, copy, shapes, accuracy)
    packed, values = _quantized(weight, type_name)
    b = numpy_helper.from_array(packed.b, f"b{copy}")
    scales = numpy_helper.from_array(packed.scales.astype(np.float32), f"scales{copy}")
    node = helper.make_node(
        "MatMulNBits", [x, b.name, scales.name], [y], domain=CONTRIB_DOMAIN, K=shapes.k, N=shapes.n,
        bits=packed.bits, block_size=packed.block_size, accuracy_level=accuracy,
    )  # fmt: skip
    return node, [b, scales], values, packed.b.nbytes + packed.scales.nbytes


def _exact_matvec(type_name: str, copy: int, shapes: Shapes, accuracy: int) -> tuple:
    """MatMulNBits over an exact layout (uint8 zero points where not the default; Q4_K's
    per-block zero points and residual min term as ReduceSum of x per 32-block @ mins^T,
    subtracted), as the package emits it."""
    from onnx import helper, numpy_helper

    layout, values = _exact_layout(type_name, shapes.n, shapes.k, seed=copy)
    arrays = layout.arrays()
    inits = {part: numpy_helper.from_array(a, f"{part}{copy}") for part, a in arrays.items()}
    y = f"y{copy}"
    names = ["x", inits["b"].name, inits["scales"].name]
    if "zero_points" in inits:
        names.append(inits["zero_points"].name)
    out = f"nbits{copy}" if "mins" in inits else y
    nodes = [
        helper.make_node(
            "MatMulNBits",
            names,
            [out],
            domain=CONTRIB_DOMAIN,
            K=shapes.k,
            N=shapes.n,
            bits=layout.bits,
            block_size=layout.block_size,
            accuracy_level=accuracy,
        )  # fmt: skip
    ]
    extra = []
    if "mins" in inits:
        shape = numpy_helper.from_array(np.array([-1, shapes.k // 32, 32]), f"shape{copy}")
        axis = numpy_helper.from_array(np.array([-1]), f"axis{copy}")
        extra = [shape, axis]
        blocks, sums, correction = f"blocks{copy}", f"sums{copy}", f"corr{copy}"
        nodes += [
            helper.make_node("Reshape", ["x", shape.name], [blocks]),
            helper.make_node("ReduceSum", [blocks, axis.name], [sums], keepdims=0),
            helper.make_node("Gemm", [sums, inits["mins"].name], [correction], transB=1),
            helper.make_node("Sub", [out, correction], [y]),
        ]
    nbytes = sum(a.nbytes for a in arrays.values())
    return nodes, [*inits.values(), *extra], values, nbytes


def run_matvec(name: str, shapes: Shapes, threads: int, seconds: float, footprint: int) -> dict:
    """One call applies the kernel to each of several independent weights (a working set past
    the cache, like a decode step's); the time reported is per weight."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, shapes.k), dtype=np.float32)

    def weight() -> np.ndarray:
        return rng.standard_normal((shapes.n, shapes.k), dtype=np.float32) * 0.02

    first = _matvec_weight(name, 0, weight(), shapes)
    copies = _copies(first[3], footprint)
    parts = [first] + [_matvec_weight(name, c, weight(), shapes) for c in range(1, copies)]
    outputs = [
        helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, None) for c in range(copies)
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, shapes.k])]
    inits = [t for part in parts for t in part[1]]
    nodes = [n for part in parts for n in (part[0] if isinstance(part[0], list) else [part[0]])]
    session = _session(nodes, inputs, outputs, inits, threads)
    out, wall = _timed(session, [{"x": x}], seconds)
    reference = x.astype(np.float64) @ first[2].astype(np.float64).T
    return {
        "s": wall / copies,
        "weight_bytes": first[3],
        "copies": copies,
        "relative_error": _error(out, reference),
    }


def _relu2(name: str) -> bool:
    return "-relu2" in name


def _experts_layer(name: str, layer: int, shapes: Shapes, rng: np.random.Generator) -> tuple:
    """(node, initializers, up values, down values, bytes) of one layer's stacked experts."""
    from onnx import helper, numpy_helper

    type_name, accuracy = EXPERTS[name]
    e, hidden, inner = shapes.experts, shapes.hidden, shapes.inner
    up = rng.standard_normal((e, inner, hidden), dtype=np.float32) * 0.03
    down = rng.standard_normal((e, hidden, inner), dtype=np.float32) * 0.03
    attributes = {"k": shapes.per_token, "activation_type": "relu", "normalize_routing_weights": 0}
    fc1_rows = 1
    if _relu2(name):  # the SwiGLU form: fc1 holds every up row twice, interleaved
        attributes.update(RELU2_AS_SWIGLU)
        fc1_rows = 2
    x, y, names = "x", f"y{layer}", (f"up{layer}", f"down{layer}")
    if accuracy is None:
        fc1 = np.repeat(up, fc1_rows, axis=1)
        inits = [numpy_helper.from_array(fc1, names[0]), numpy_helper.from_array(down, names[1])]
        node = helper.make_node(
            "MoE", [x, "probs", names[0], "", names[1]], [y], domain=CONTRIB_DOMAIN, **attributes
        )
        return node, inits, up, down, fc1.nbytes + down.nbytes
    inits, values, bits, nbytes = [], [], 0, 0
    for label, stacked in zip(names, (up, down), strict=True):
        parts = [_quantized(expert, type_name) for expert in stacked]
        bits = parts[0][0].bits
        # QMoE's raw layout: [E, N, K * bits / 8] codes and [E, N, K / block] scales.
        b = np.stack([p.b.reshape(p.b.shape[0], -1) for p, _ in parts])
        scales = np.stack([p.scales for p, _ in parts]).astype(np.float32)
        if label == names[0]:  # fc1: rows twice for the SwiGLU form (codes and scales alike)
            b, scales = np.repeat(b, fc1_rows, axis=1), np.repeat(scales, fc1_rows, axis=1)
        inits += [numpy_helper.from_array(b, label), numpy_helper.from_array(scales, f"{label}_s")]
        values.append(np.stack([v for _, v in parts]))
        nbytes += b.nbytes + scales.nbytes
    node = helper.make_node(
        "QMoE", [x, "probs", names[0], f"{names[0]}_s", "", names[1], f"{names[1]}_s", ""], [y],
        domain=CONTRIB_DOMAIN, expert_weight_bits=bits, block_size=32, accuracy_level=accuracy,
        weights_prepacked=0, **attributes,
    )  # fmt: skip
    return node, inits, values[0], values[1], nbytes


def _gathered_layer(layer: int, shapes: Shapes, rng: np.random.Generator) -> tuple:
    """(nodes, initializers, up values, down values, bytes) of one layer whose selected experts
    are gathered from the packed Q8_0 rows at run time: fc1 as one [k * inner, hidden]
    MatMulNBits weight, fc2 as one [hidden, k * inner] weight (each expert's K blocks side by
    side), so each selected expert's up rows are read once. TopK of the routing input gives
    the experts and their log weights (run_experts feeds log weights, -inf elsewhere)."""
    from onnx import helper, numpy_helper

    e, hidden, inner, k = shapes.experts, shapes.hidden, shapes.inner, shapes.per_token
    up = rng.standard_normal((e, inner, hidden), dtype=np.float32) * 0.03
    down = rng.standard_normal((e, hidden, inner), dtype=np.float32) * 0.03
    fc1 = [_quantized(expert, "Q8_0") for expert in up]
    fc2 = [_quantized(expert, "Q8_0") for expert in down]
    # fc1 [E, inner, blocks, 32]; fc2 [hidden, E, blocks, 32]: Gather on axis 1 joins K
    up_b = np.stack([p.b.reshape(inner, hidden // 32, 32) for p, _ in fc1])
    up_s = np.stack([p.scales.reshape(inner, -1) for p, _ in fc1]).astype(np.float32)
    down_b = np.stack([p.b.reshape(hidden, inner // 32, 32) for p, _ in fc2], axis=1)
    down_s = np.stack([p.scales.reshape(hidden, -1) for p, _ in fc2], axis=1)
    n = f"l{layer}_"
    consts = {
        "up": up_b, "up_s": up_s, "down": down_b, "down_s": down_s.astype(np.float32),
        "k": np.array([k], np.int64), "up_shape": np.array([k * inner, hidden // 32, 32]),
        "up_s_shape": np.array([-1]), "down_shape": np.array([hidden, k * inner // 32, 32]),
        "weights_shape": np.array([1, k, -1]), "row_shape": np.array([1, k * inner]),
    }  # fmt: skip
    inits = [numpy_helper.from_array(np.asarray(v), n + key) for key, v in consts.items()]
    common = {"domain": CONTRIB_DOMAIN, "bits": 8, "block_size": 32, "accuracy_level": 4}
    nodes = [
        helper.make_node("TopK", ["probs", n + "k"], [n + "logw", n + "ids"], axis=1),
        helper.make_node("Squeeze", [n + "ids"], [n + "sel"]),
        helper.make_node("Gather", [n + "up", n + "sel"], [n + "g1"], axis=0),
        helper.make_node("Gather", [n + "up_s", n + "sel"], [n + "g1s"], axis=0),
        helper.make_node("Reshape", [n + "g1", n + "up_shape"], [n + "b1"]),
        helper.make_node("Reshape", [n + "g1s", n + "up_s_shape"], [n + "s1"]),
        helper.make_node("MatMulNBits", ["x", n + "b1", n + "s1"], [n + "h"],
                         K=hidden, N=k * inner, **common),
        helper.make_node("Relu", [n + "h"], [n + "r"]),
        helper.make_node("Mul", [n + "r", n + "r"], [n + "a"]),
        helper.make_node("Exp", [n + "logw"], [n + "w"]),
        helper.make_node("Reshape", [n + "a", n + "weights_shape"], [n + "a3"]),
        helper.make_node("Unsqueeze", [n + "w", n + "up_s_shape"], [n + "w3"]),
        helper.make_node("Mul", [n + "a3", n + "w3"], [n + "aw3"]),
        helper.make_node("Reshape", [n + "aw3", n + "row_shape"], [n + "aw"]),
        helper.make_node("Gather", [n + "down", n + "sel"], [n + "g2"], axis=1),
        helper.make_node("Gather", [n + "down_s", n + "sel"], [n + "g2s"], axis=1),
        helper.make_node("Reshape", [n + "g2", n + "down_shape"], [n + "b2"]),
        helper.make_node("Reshape", [n + "g2s", n + "up_s_shape"], [n + "s2"]),
        helper.make_node("MatMulNBits", [n + "aw", n + "b2", n + "s2"], [f"y{layer}"],
                         K=k * inner, N=hidden, **common),
    ]  # fmt: skip
    values = (np.stack([v for _, v in fc1]), np.stack([v for _, v in fc2]))
    return nodes, inits, *values, up_b.nbytes + up_s.nbytes + down_b.nbytes + down_s.nbytes


def run_experts(name: str, shapes: Shapes, threads: int, seconds: float, footprint: int) -> dict:
    """One decode row through independent layers of stacked experts (enough layers that
    their weights exceed `footprint`), each call choosing other experts; time per layer."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    make = (
        (lambda i: _gathered_layer(i, shapes, rng))
        if "gathered" in name
        else (lambda i: _experts_layer(name, i, shapes, rng))
    )
    first = make(0)
    layers = _copies(first[4], footprint)
    parts = [first] + [make(i) for i in range(1, layers)]
    x = rng.standard_normal((1, shapes.hidden), dtype=np.float32)
    routings = []
    for _ in range(16):  # routing that changes from call to call, as decode steps do
        chosen = rng.choice(shapes.experts, shapes.per_token, replace=False)
        gate = rng.random(shapes.per_token).astype(np.float32) + 0.1
        routings.append((chosen, gate / gate.sum()))
    # log(weight) at the chosen experts, -inf elsewhere: the kernels' softmax over these
    # returns exactly these experts with these weights.
    feeds = []
    for chosen, gate in routings:
        probs = np.full((1, shapes.experts), -np.inf, np.float32)
        probs[0, chosen] = np.log(gate)
        feeds.append({"x": x, "probs": probs})
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, shapes.hidden]),
        helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, shapes.experts]),
    ]
    outputs = [
        helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None) for i in range(layers)
    ]
    inits = [t for part in parts for t in part[1]]
    nodes = [n for part in parts for n in (part[0] if isinstance(part[0], list) else [part[0]])]
    session = _session(nodes, inputs, outputs, inits, threads)
    chosen, gate = routings[0]
    out, wall = _timed(session, feeds, seconds)
    up, down = first[2], first[3]
    power = 2 if _relu2(name) else 1
    reference = sum(
        w * (down[e].astype(np.float64) @ np.maximum(up[e] @ x[0].astype(np.float64), 0) ** power)
        for e, w in zip(chosen, gate, strict=True)
    )
    return {
        "s": wall / layers,
        "selected_weight_bytes": first[4] * shapes.per_token // shapes.experts,
        "layers": layers,
        "relative_error": _error(out, reference),
    }


def relu2_refusals(threads: int) -> dict[str, str]:
    """What the CPU MoE / QMoE kernels say to activation_type relu2 (session creation)."""
    from onnx import TensorProto, helper, numpy_helper

    e, d, i = 2, 32, 32
    zeros = np.zeros((e, i, d), np.float32)
    io = (
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, e]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, d])],
    )
    cases = {
        "MoE": (["x", "probs", "up", "", "down"], {}, [zeros, zeros]),
        "QMoE": (
            ["x", "probs", "up", "s", "", "down", "s", ""],
            {"expert_weight_bits": 8},
            [np.zeros((e, i, d), np.uint8), np.zeros((e, d, i), np.uint8)],
        ),
    }
    said = {}
    for op, (inputs, extra, (up, down)) in cases.items():
        inits = [numpy_helper.from_array(up, "up"), numpy_helper.from_array(down, "down"),
                 numpy_helper.from_array(np.ones((e, i), np.float32), "s")]  # fmt: skip
        node = helper.make_node(
            op, inputs, ["y"], domain=CONTRIB_DOMAIN, k=1, activation_type="relu2", **extra
        )
        try:
            _session([node], *io, inits, threads, log_level=4)  # the refusal is the result
            said[op] = "accepted"
        except Exception as error:  # onnxruntime raises its own Fail type
            said[op] = str(error).strip().splitlines()[-1][-200:]
    return said


def separate_fc3_refusal(threads: int) -> str:
    """What the CPU QMoE kernel says to SwiGLU with a separate fc3 (swiglu_fusion 0) that is
    fc1's own initializer: the form that would store and read the up rows once."""
    from onnx import TensorProto, helper, numpy_helper

    e, d, i = 2, 32, 32
    inits = [
        numpy_helper.from_array(np.zeros((e, i, d), np.uint8), "up"),
        numpy_helper.from_array(np.zeros((e, d, i), np.uint8), "down"),
        numpy_helper.from_array(np.ones((e, i, 1), np.float32), "s"),
    ]
    node = helper.make_node(
        "QMoE", ["x", "probs", "up", "s", "", "down", "s", "", "up", "s", ""], ["y"],
        domain=CONTRIB_DOMAIN, k=1, expert_weight_bits=8, activation_type="swiglu",
        swiglu_fusion=0, activation_alpha=1e30, activation_beta=0.0,
    )  # fmt: skip
    io = (
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, d]),
            helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, e]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, d])],
    )
    try:
        _session([node], *io, inits, threads, log_level=4)
        return "accepted"
    except Exception as error:  # onnxruntime raises its own Fail type
        return str(error).strip().splitlines()[-1][-200:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per process")
    parser.add_argument(
        "--footprint-mib",
        type=int,
        default=256,
        help="working set per variant, past the last-level cache",
    )
    parser.add_argument("--n", type=int, default=4096, help="matvec weight rows")
    parser.add_argument("--k", type=int, default=4096, help="matvec weight columns")
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--experts-per-token", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--inner", type=int, default=512, help="moe_intermediate_size")
    parser.add_argument(
        "--variants", help="comma-separated variant names (default: every matvec and experts one)"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = Shapes(args.n, args.k, args.experts, args.experts_per_token, args.hidden, args.inner)

    if args.child:
        run = run_matvec if args.child in MATVEC else run_experts
        footprint = args.footprint_mib << 20
        print(json.dumps(run(args.child, shapes, args.threads, args.seconds, footprint)))
        return

    names = [*MATVEC, *EXPERTS]
    if args.variants:
        unknown = set(args.variants.split(",")) - set(names)
        if unknown:
            parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(names)}")
        names = args.variants.split(",")
    forwarded = sys.argv[1:]  # a child returns before --json is read
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        record = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            cmd = [sys.executable, __file__, "--child", name, *forwarded]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            record[name] = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"round {r} {name:24s} {json.dumps(record[name])}", file=sys.stderr, flush=True)
        rounds.append(record)
    summary = {}
    for name in names:
        first = rounds[0][name]
        wall = statistics.median(r[name]["s"] for r in rounds)
        nbytes = first.get("weight_bytes", first.get("selected_weight_bytes"))
        summary[name] = {**first, "s": wall, "GB_per_s": nbytes / wall / 1e9}
        print(
            f"{name:24s} {wall * 1e3:8.3f} ms  {nbytes / 2**20:7.2f} MiB read  "
            f"{nbytes / wall / 1e9:6.1f} GB/s  relative error {first['relative_error']:.1e}"
        )
    import onnxruntime

    refusals = relu2_refusals(args.threads)
    for op, said in refusals.items():
        print(f"{op} with activation_type=relu2 on CPU: {said}")
    fc3 = separate_fc3_refusal(args.threads)
    print(f"QMoE SwiGLU with fc3 = fc1 (swiglu_fusion 0) on CPU: {fc3}")
    result = {
        "command": " ".join(
            ["python", "benchmarks/investigations/cpu_kernel_gaps.py", *sys.argv[1:]]
        ),
        "onnxruntime": onnxruntime.__version__,
        "load_average": os.getloadavg(),
        "shapes": shapes.__dict__,
        "median_over_rounds": summary,
        "relu2_on_cpu": refusals,
        "separate_fc3_on_cpu": fc3,
        "rounds": rounds,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
