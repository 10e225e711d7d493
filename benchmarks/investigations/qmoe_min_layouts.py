"""One QMoE node on the min-term layouts of Q4_K experts (formats/ggml/relayout/
qmoe_min_term.py): which bit width an all-Q4_K layer should use, at one decode row.

The mid model's expert shape (hidden 1024, intermediate 512, 64 experts, 4 per token), random
valid Q4_K / Q6_K blocks, a fresh random routing per call; each variant's session runs
--calls calls per round, rounds alternating between the variants, and the median per-call time
is reported with the NRMSE against a float64 ReLU^2 reference on the same blocks' values.

Usage:
    python benchmarks/investigations/qmoe_min_layouts.py --threads 2 --rounds 3 --calls 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_lite.bench.package_peer import session_options
from mobius_lite.components.moe_fused import RELU2_AS_SWIGLU, emit_qmoe
from mobius_lite.formats.ggml.relayout.qmoe_experts import augment_input
from mobius_lite.formats.ggml.relayout.qmoe_min_term import MinTermPlan, min_term_layout
from mobius_lite.formats.ggml.types import GGML_TYPES

HIDDEN, INNER, EXPERTS, PER_TOKEN = 1024, 512, 64, 4
# variant -> (up type, down type, plan, accuracy level)
VARIANTS = {
    "q4_k/q4_k-4bit-acc4": ("Q4_K", "Q4_K", MinTermPlan(4, 32, True, 3), 4),
    "q4_k/q4_k-8bit": ("Q4_K", "Q4_K", MinTermPlan(8, 32, True, 2), 4),
    "q4_k/q4_k-4bit-acc0": ("Q4_K", "Q4_K", MinTermPlan(4, 32, True, 3), 0),
    "q4_k/q6_k-8bit-block16": ("Q4_K", "Q6_K", MinTermPlan(8, 16, True, 1), 4),
}
FP16_AT = {"Q4_K": (0, 2), "Q6_K": (208,)}


def random_rows(type_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Valid ggml rows: random code bytes, fp16 scales in [2e-4, 1e-3]."""
    t = GGML_TYPES[type_name]
    n_blocks = int(np.prod(shape)) // t.block_elements
    blocks = rng.integers(0, 256, size=(n_blocks, t.block_bytes), dtype=np.uint8)
    for offset in FP16_AT[type_name]:
        scale = rng.uniform(2e-4, 1e-3, size=(n_blocks, 1)).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8)
    return blocks.reshape(*shape[:-1], shape[-1] // t.block_elements * t.block_bytes)


def values(type_name: str, rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = dequantize(rows, GGMLQuantizationType[type_name])
    return np.asarray(out, dtype=np.float64).reshape(shape)


def session(up: str, down: str, plan: MinTermPlan, accuracy: int, threads: int, seed: int):
    """(session, float64 up, float64 down) for one QMoE node on the variant's operands."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)
    up_rows = random_rows(up, (EXPERTS, INNER, HIDDEN), rng)
    down_rows = random_rows(down, (EXPERTS, HIDDEN, INNER), rng)
    fc1 = min_term_layout(up, "fc1", up_rows, plan)
    fc2 = min_term_layout(down, "fc2", down_rows, plan)
    f32 = ir.DataType.FLOAT
    x = ir.Value(name="x", type=ir.TensorType(f32), shape=ir.Shape([1, HIDDEN]))
    probs = ir.Value(name="probs", type=ir.TensorType(f32), shape=ir.Shape([1, EXPERTS]))
    weights = ir.Value(name="weights", type=ir.TensorType(f32), shape=ir.Shape([1, EXPERTS]))
    graph = ir.Graph([x, probs, weights], [], nodes=[], opset_imports={"": 21}, name="qmoe")
    operands = []
    for i, layout in enumerate((fc1, fc2)):
        parts = []
        for part in ("b", "scales", "zero_points"):
            array = getattr(layout, part)
            if array is None:
                parts.append(None)
                continue
            value = ir.Value(name=f"fc{i + 1}_{part}", const_value=ir.tensor(array))
            graph.register_initializer(value)
            parts.append(value)
        operands.append(tuple(parts))
    op = GraphBuilder(graph).op
    kernel_x = augment_input(op, x, plan, HIDDEN) if plan.augmented else x
    out = emit_qmoe(
        op,
        kernel_x,
        probs,
        weights,
        operands[0],
        operands[1],
        k=PER_TOKEN,
        fc1_bits=plan.bits,
        fc2_bits=plan.bits,
        block_size=plan.block,
        accuracy_level=accuracy,
        activation=RELU2_AS_SWIGLU,
    )
    y = op.Slice(out, *(op.Constant(value_ints=[v]) for v in (0, HIDDEN, -1)))
    y.name = "y"
    graph.outputs.append(y)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    options = session_options(threads)
    sess = ort.InferenceSession(proto.SerializeToString(), options, ["CPUExecutionProvider"])
    up_w = values(up, up_rows, (EXPERTS, INNER, HIDDEN))
    down_w = values(down, down_rows, (EXPERTS, HIDDEN, INNER))
    return sess, up_w, down_w


def feeds(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    chosen = rng.choice(EXPERTS, size=PER_TOKEN, replace=False)
    mix = (rng.random(PER_TOKEN) + 0.5).astype(np.float32)
    probs = np.full((1, EXPERTS), -np.inf, dtype=np.float32)
    weights = np.zeros((1, EXPERTS), dtype=np.float32)
    probs[0, chosen], weights[0, chosen] = 0.0, mix
    x = rng.standard_normal((1, HIDDEN)).astype(np.float32)
    return {"x": x, "probs": probs, "weights": weights}, chosen, mix


def nrmse(sess: Any, up: np.ndarray, down: np.ndarray, rng: np.random.Generator) -> float:
    errors, norms = 0.0, 0.0
    for _ in range(8):
        feed, chosen, mix = feeds(rng)
        (y,) = sess.run(None, feed)
        x = feed["x"][0].astype(np.float64)
        pairs = zip(chosen, mix, strict=True)
        ref = sum(w * (down[e] @ np.maximum(up[e] @ x, 0) ** 2) for e, w in pairs)
        errors += float(((y[0] - ref) ** 2).sum())
        norms += float((ref**2).sum())
    return (errors / norms) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sessions = {
        name: session(up, down, plan, acc, args.threads, seed=i)
        for i, (name, (up, down, plan, acc)) in enumerate(VARIANTS.items())
    }
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.rounds):
        for name, (sess, _, _) in sessions.items():
            calls = [feeds(rng)[0] for _ in range(args.calls)]
            sess.run(None, calls[0])
            for feed in calls:
                start = time.perf_counter()
                sess.run(None, feed)
                times[name].append(time.perf_counter() - start)
    report = {}
    for name, (sess, up, down) in sessions.items():
        ms = 1e3 * statistics.median(times[name])
        report[name] = {"ms_per_call": round(ms, 3), "nrmse": nrmse(sess, up, down, rng)}
        print(f"{name:26s} {ms:7.3f} ms  nrmse {report[name]['nrmse']:.2e}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"threads": args.threads, "variants": report}, handle, indent=2)


if __name__ == "__main__":
    main()
