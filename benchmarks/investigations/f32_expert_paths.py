r"""What the F32 routed experts cost on onnxruntime CPU at one decode row, and the graph forms
that could compute them: the evidence for issue 22's F32 decode target (docs/performance.md,
"Issue 22, third pass").

Random stacked experts of the mid model's shape (E=64, hidden 1024, intermediate 512, top-4,
ReLU^2), four layers chained so that every call reads its chosen experts from memory:
  scan            a Scan over the stacked tensors with an If per expert (the slices are views)
  loop-gather     a Loop over the 4 chosen experts, each copied out by Gather
  batched-gather  the 4 chosen experts gathered into one batched MatMul per projection
Each form's output is checked against numpy before it is timed. Then the Scan's cost split:
the same Scan over one layer with the expert weights fed in, with 0, 1 and 4 experts chosen,
and the expert's two GEMVs alone, once per slice of a 64-slice Scan. With --package (an F32
package built with --backend ort), its layer 1 extracted as a graph of its own is timed, with
and without its routed experts.

Usage:
    python benchmarks/investigations/f32_expert_paths.py [--package DIR] [--threads 2] \
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.attribution import needed_nodes, package_with_graph, values_read
from mobius_lite.layout import DECODER_FILE  # noqa: E402

E, H, INNER, K, LAYERS = 64, 1024, 512, 4, 4  # experts, hidden, intermediate, top-k
OPSETS = (("", 21), ("com.microsoft", 1))


def _vi(name: str, elem: int | None = None, shape: list[int] | None = None) -> Any:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, elem or TensorProto.FLOAT, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> Any:
    from onnx import helper

    graph = helper.make_graph(nodes, "experts", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in OPSETS])


def _expert_nodes(x: str, up: str, down: str, out: str) -> list:
    """down @ relu(up @ x)^2 for one row, as the package's one-row form (Gemm, transB)."""
    from onnx import helper

    return [
        helper.make_node("Gemm", [x, up], [f"{out}_h"], transB=1),
        helper.make_node("Relu", [f"{out}_h"], [f"{out}_r"]),
        helper.make_node("Mul", [f"{out}_r", f"{out}_r"], [f"{out}_q"]),
        helper.make_node("Gemm", [f"{out}_q", down], [out], transB=1),
    ]


def _scan_body(x: str) -> Any:
    """acc + w * expert(x) when w > 0, else acc: one Scan iteration over (up, down, w); x is
    the layer's input row, read from outside the body."""
    from onnx import TensorProto, helper

    run = helper.make_graph(
        [
            *_expert_nodes(x, "up_e", "down_e", "y_e"),
            helper.make_node("Mul", ["y_e", "w_e"], ["wy"]),
            helper.make_node("Add", ["acc", "wy"], ["run_out"]),
        ],
        "run",
        [],
        [_vi("run_out")],
    )
    skip = helper.make_graph(
        [helper.make_node("Identity", ["acc"], ["skip_out"])], "skip", [], [_vi("skip_out")]
    )
    return helper.make_graph(
        [
            helper.make_node("Greater", ["w_e", "zero"], ["chosen"]),
            helper.make_node("If", ["chosen"], ["acc_out"], then_branch=run, else_branch=skip),
        ],
        "body",
        [_vi("acc"), _vi("up_e"), _vi("down_e"), _vi("w_e", TensorProto.FLOAT, [])],
        [_vi("acc_out")],
    )


def _layer(form: str, layer: int, x: str, out: str) -> list:
    """One layer's routed experts in `form`, on ids / w [LAYERS, K] row `layer`, x [1, H]."""
    from onnx import TensorProto, helper

    p = f"l{layer}_"
    ids, w = p + "ids", p + "w"
    nodes = [
        helper.make_node("Gather", ["ids", f"row{layer}"], [ids]),
        helper.make_node("Gather", ["w", f"row{layer}"], [w]),
    ]
    up, down = f"up{layer}", f"down{layer}"
    if form == "scan":
        return nodes + [
            helper.make_node("ScatterElements", ["zeros_e", ids, w], [p + "wfull"], axis=0),
            helper.make_node(
                "Scan", [x, up, down, p + "wfull"], [out], body=_scan_body(x), num_scan_inputs=3
            ),
        ]
    if form == "loop-gather":
        body = helper.make_graph(
            [
                helper.make_node("Gather", [ids, "i"], ["e"]),
                helper.make_node("Gather", [w, "i"], ["w_i"]),
                helper.make_node("Gather", [up, "e"], ["up_i"]),
                helper.make_node("Gather", [down, "e"], ["down_i"]),
                *_expert_nodes(x, "up_i", "down_i", "y_i"),
                helper.make_node("Mul", ["y_i", "w_i"], ["wy"]),
                helper.make_node("Add", ["acc", "wy"], ["acc_out"]),
                helper.make_node("Identity", ["cond"], ["cond_out"]),
            ],
            "loop",
            [_vi("i", TensorProto.INT64, []), _vi("cond", TensorProto.BOOL, []), _vi("acc")],
            [_vi("cond_out", TensorProto.BOOL, []), _vi("acc_out")],
        )
        return nodes + [helper.make_node("Loop", ["k", "true", x], [out], body=body)]
    # batched-gather
    return nodes + [
        helper.make_node("Gather", [up, ids], [p + "U"]),  # [K, INNER, H], a copy
        helper.make_node("Gather", [down, ids], [p + "D"]),
        helper.make_node("Reshape", [x, "column"], [p + "xc"]),  # [1, H, 1]
        helper.make_node("MatMul", [p + "U", p + "xc"], [p + "h"]),
        helper.make_node("Relu", [p + "h"], [p + "r"]),
        helper.make_node("Mul", [p + "r", p + "r"], [p + "q"]),
        helper.make_node("MatMul", [p + "D", p + "q"], [p + "y"]),  # [K, H, 1]
        helper.make_node("Reshape", [w, "per_expert"], [p + "w3"]),
        helper.make_node("Mul", [p + "y", p + "w3"], [p + "wy"]),
        helper.make_node("ReduceSum", [p + "wy", "axis0"], [p + "s"], keepdims=0),
        helper.make_node("Reshape", [p + "s", "row"], [p + "s2"]),
        helper.make_node("Add", [x, p + "s2"], [out]),
    ]


def layer_stack(form: str, ups: list, downs: list) -> Any:
    """LAYERS chained layers x <- x + experts(x), inputs x [1, H], ids int64 / w [LAYERS, K]."""
    from onnx import TensorProto, numpy_helper

    nodes, x = [], "x"
    for layer in range(LAYERS):
        nodes += _layer(form, layer, x, f"x{layer + 1}")
        x = f"x{layer + 1}"
    consts = {
        "zeros_e": np.zeros(E, np.float32),
        "zero": np.array(0, np.float32),
        "k": np.array(K, np.int64),
        "true": np.array(True),
        "column": np.array([1, H, 1], np.int64),
        "per_expert": np.array([K, 1, 1], np.int64),
        "axis0": np.array([0], np.int64),
        "row": np.array([1, H], np.int64),
        **{f"row{i}": np.array(i, np.int64) for i in range(LAYERS)},
        **{f"up{i}": ups[i] for i in range(LAYERS)},
        **{f"down{i}": downs[i] for i in range(LAYERS)},
    }
    used = set().union(*(values_read(node) for node in nodes))
    inits = [numpy_helper.from_array(v, n) for n, v in consts.items() if n in used]
    inputs = [
        _vi("x", TensorProto.FLOAT, [1, H]),
        _vi("ids", TensorProto.INT64, [LAYERS, K]),
        _vi("w", TensorProto.FLOAT, [LAYERS, K]),
    ]
    return _model(nodes, inputs, [_vi(x)], inits)


def reference(x: np.ndarray, ids: np.ndarray, w: np.ndarray, ups: list, downs: list) -> np.ndarray:
    x = x.astype(np.float64)
    for layer in range(LAYERS):
        routed = 0.0
        for j, e in enumerate(ids[layer]):
            hidden = np.maximum(ups[layer][e].astype(np.float64) @ x[0], 0) ** 2
            routed = routed + w[layer, j] * (downs[layer][e].astype(np.float64) @ hidden)
        x = x + routed
    return x


def session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    blob = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def median_ms(run, calls: int) -> float:
    times = []
    for i in range(calls):
        start = time.perf_counter()
        run(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times[3:]) * 1e3


def forms(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    ups = [(rng.standard_normal((E, INNER, H)) * 0.03).astype(np.float32) for _ in range(LAYERS)]
    downs = [(rng.standard_normal((E, H, INNER)) * 0.03).astype(np.float32) for _ in range(LAYERS)]
    x = (rng.standard_normal((1, H)) * 0.1).astype(np.float32)
    sessions = {f: session(layer_stack(f, ups, downs), args.threads) for f in FORMS}
    out: dict[str, Any] = {}
    for name, s in sessions.items():
        ids = np.stack([rng.choice(E, K, replace=False) for _ in range(LAYERS)]).astype(np.int64)
        w = rng.random((LAYERS, K)).astype(np.float32)
        got = s.run(None, {"x": x, "ids": ids, "w": w})[0]
        expected = reference(x, ids, w, ups, downs)
        error = float(np.abs(got - expected).max() / np.abs(expected).max())
        if error > 1e-5:
            raise SystemExit(f"{name}: max relative error {error:.2e} against numpy")
        out[name] = {"max_rel_error": error, "ms": []}
    for _ in range(args.rounds):  # alternating, fresh routing every call
        for name, s in sessions.items():
            time.sleep(0.1)

            def call(_: int, s: Any = s) -> None:
                ids = np.stack([rng.choice(E, K, replace=False) for _ in range(LAYERS)])
                w = rng.random((LAYERS, K)).astype(np.float32)
                s.run(None, {"x": x, "ids": ids.astype(np.int64), "w": w})

            out[name]["ms"].append(median_ms(call, 18))
    for entry in out.values():
        entry["median_ms"] = statistics.median(entry["ms"])
    return out


def scan_split(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    """One layer's Scan with the per-expert weights fed in: 0, 1 and 4 chosen."""
    from onnx import TensorProto, helper, numpy_helper

    ups = [(rng.standard_normal((E, INNER, H)) * 0.03).astype(np.float32)]
    downs = [(rng.standard_normal((E, H, INNER)) * 0.03).astype(np.float32)]

    scan = helper.make_node(
        "Scan", ["x", "up0", "down0", "w"], ["y"], body=_scan_body("x"), num_scan_inputs=3
    )
    inits = [
        numpy_helper.from_array(ups[0], "up0"),
        numpy_helper.from_array(downs[0], "down0"),
        numpy_helper.from_array(np.array(0, np.float32), "zero"),
    ]
    inputs = [_vi("x", TensorProto.FLOAT, [1, H]), _vi("w", TensorProto.FLOAT, [E])]
    s = session(_model([scan], inputs, [_vi("y")], inits), args.threads)
    x = rng.standard_normal((1, H)).astype(np.float32)
    result = {}
    for chosen in (0, 1, K):

        def call(_: int, chosen: int = chosen) -> None:
            w = np.zeros(E, np.float32)
            w[rng.choice(E, chosen, replace=False)] = 0.25
            s.run(None, {"x": x, "w": w})

        result[f"{chosen} chosen"] = statistics.median(median_ms(call, 40) for _ in range(3))
    return result


def gemv_slices(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    """Microseconds per expert GEMV (Gemm, transB) on the slices of a 64-slice Scan."""
    from onnx import TensorProto, helper

    result = {}
    for n, k in ((INNER, H), (H, INNER)):
        body = helper.make_graph(
            [
                helper.make_node("Gemm", ["x", "w_e"], ["y_e"], transB=1),
                helper.make_node("Identity", ["acc"], ["acc_out"]),
            ],
            "gemv",
            [_vi("acc"), _vi("w_e")],
            [_vi("acc_out"), _vi("y_e", TensorProto.FLOAT, [1, n])],
        )
        scan = helper.make_node(
            "Scan", ["acc", "weights"], ["acc_out", "ys"], body=body, num_scan_inputs=1
        )
        inputs = [_vi("x", TensorProto.FLOAT, [1, k]), _vi("acc", TensorProto.FLOAT, [1]),
                  _vi("weights", TensorProto.FLOAT, [E, n, k])]  # fmt: skip
        s = session(_model([scan], inputs, [_vi("ys")], []), args.threads)
        feeds = {
            "x": rng.standard_normal((1, k)).astype(np.float32),
            "acc": np.zeros(1, np.float32),
            "weights": (rng.standard_normal((E, n, k)) * 0.03).astype(np.float32),
        }
        ms = median_ms(lambda _, s=s, feeds=feeds: s.run(None, feeds), 10)
        result[f"N={n} K={k}"] = ms * 1e3 / E
    return result


def package_layer(args: argparse.Namespace, rng: np.random.Generator) -> dict[str, float]:
    """The package's layer 1 (an MoE layer) as a graph of its own, and without its routed
    experts (their output replaced by zeros); ms per call at one row."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(args.package / DECODER_FILE), load_external_data=False)
    first = next(n for n in model.graph.node if n.name.startswith("backbone/layers.1/norm/"))
    last = next(n for n in model.graph.node if n.name.startswith("backbone/layers.1/Add"))
    source, result_name = first.input[0], last.output[0]
    kept, needed = needed_nodes(model.graph.node, {result_name}, {source})
    experts = next(n for n in kept if n.op_type == "If" and "/mixer/experts/" in n.name)
    inits = [t for t in model.graph.initializer if t.name in needed]
    inputs = [helper.make_tensor_value_info(source, TensorProto.FLOAT, [1, H])]
    outputs = [helper.make_tensor_value_info(result_name, TensorProto.FLOAT, None)]
    without = [
        helper.make_node("Identity", ["no_routed"], list(experts.output)) if n is experts else n
        for n in kept
    ]
    zeros = numpy_helper.from_array(np.zeros((1, H), np.float32), "no_routed")
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, nodes, extra in (("layer", kept, []), ("without routed", without, [zeros])):
            graph = helper.make_graph(nodes, "layer", inputs, outputs, inits + extra)
            layer = helper.make_model(graph, opset_imports=model.opset_import)
            layer.ir_version = model.ir_version
            path = package_with_graph(args.package, Path(tmp) / name.replace(" ", "_"), layer)
            s = session(str(path / DECODER_FILE), args.threads)

            def call(_: int, s: Any = s) -> None:
                s.run(None, {source: rng.standard_normal((1, H)).astype(np.float32)})

            result[name] = statistics.median(median_ms(call, 40) for _ in range(3))
    return result


FORMS = ("scan", "loop-gather", "batched-gather")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--package", type=Path, help="an F32 package (--backend ort)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of the forms")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    result: dict[str, Any] = {
        "command": " ".join(
            ["python benchmarks/investigations/f32_expert_paths.py", *sys.argv[1:]]
        ),
        "forms_4_layers": forms(args, rng),
        "scan_one_layer_ms": scan_split(args, rng),
        "gemv_us_per_slice": gemv_slices(args, rng),
    }
    if args.package is not None:
        result["package_layer_ms"] = package_layer(args, rng)
    print(f"{LAYERS} layers, top-{K} of {E} experts, one row, {args.threads} threads:")
    for name, entry in result["forms_4_layers"].items():
        error = entry["max_rel_error"]
        print(f"  {name:15s} {entry['median_ms']:.2f} ms (max relative error {error:.1e})")
    print(
        "one layer's Scan, experts chosen: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in result["scan_one_layer_ms"].items())
    )
    print(
        "GEMV per Scan slice: "
        + ", ".join(f"{k} {v:.0f} us" for k, v in result["gemv_us_per_slice"].items())
    )
    if "package_layer_ms" in result:
        print(
            "package layer 1: "
            + ", ".join(f"{k} {v:.3f} ms" for k, v in result["package_layer_ms"].items())
        )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
