r"""How fast onnxruntime's CPU MatMulNBits streams block-wise weights at one activation row,
by bit width, block size and whether a zero-point input is given.

Each case is one graph of independent MatMulNBits nodes on distinct random weights (about
64 MB in all, twice this machine's 32 MB L3, so every node reads its weight from memory),
run back to back; the figure is the median run over the node count: microseconds per
node, weight bytes per second (codes, float32 scales, zero points) and weights per second.
The exact layouts (docs/gguf.md) pick among these forms: Q8_0 / Q6_K / IQ2_XXS are 8-bit
(block 32 / 16 / 32), Q4_0 4-bit block 32 without zero points, Q4_K 4-bit block 32 with them.

Usage:
    python benchmarks/investigations/nbits_kernel_rates.py [--threads 2] [--accuracy 4] \
        [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

CONTRIB = "com.microsoft"
# (bits, block, zero points: "none", "random" or "8s", the default value given as a tensor):
# the forms the exact layouts use, and their neighbours
CASES = [
    (8, 32, "none"),
    (8, 16, "none"),
    (8, 128, "none"),
    (4, 32, "none"),
    (4, 32, "random"),
    (4, 32, "8s"),
    (4, 16, "none"),
    (2, 16, "none"),
]
TOTAL_BYTES = 64 * 2**20


def case_graph(
    n: int, k: int, bits: int, block: int, zero_points: str, copies: int, accuracy: int
) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = k // block
    nodes, weights = [], []
    for c in range(copies):
        codes = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
        scales = (rng.random(n * blocks) * 0.01).astype(np.float32)
        weights += [
            numpy_helper.from_array(codes, f"b{c}"),
            numpy_helper.from_array(scales, f"s{c}"),
        ]
        inputs = ["x", f"b{c}", f"s{c}"]
        if zero_points != "none":
            count = n * ((blocks * bits + 7) // 8)
            packed = rng.integers(0, 256, count, dtype=np.uint8)
            if zero_points == "8s":
                packed = np.full(count, 0x88 if bits == 4 else 0x80, dtype=np.uint8)
            weights.append(numpy_helper.from_array(packed, f"z{c}"))
            inputs.append(f"z{c}")
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                inputs,
                [f"y{c}"],
                domain=CONTRIB,
                K=k,
                N=n,
                bits=bits,
                block_size=block,
                accuracy_level=accuracy,
            )
        )
    graph = helper.make_graph(
        nodes,
        "rates",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [1, n]) for c in range(copies)],
        weights,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(CONTRIB, 1)]
    return helper.make_model(graph, opset_imports=opsets)


def layout_bytes(n: int, k: int, bits: int, block: int, zero_points: str) -> float:
    per_block = block * bits / 8 + 4 + (bits / 8 if zero_points != "none" else 0)
    return n * k / block * per_block


def measure(args: argparse.Namespace, bits: int, block: int, zero_points: str) -> dict[str, Any]:
    import onnxruntime as ort

    n, k = args.n, args.k
    size = layout_bytes(n, k, bits, block, zero_points)
    copies = max(2, int(TOTAL_BYTES // size))
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    model = case_graph(n, k, bits, block, zero_points, copies, args.accuracy)
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    for _ in range(3):
        session.run(None, {"x": x})
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        session.run(None, {"x": x})
        runs.append(time.perf_counter() - start)
    per_node = statistics.median(runs) / copies
    return {
        "bits": bits,
        "block": block,
        "zero_points": zero_points,
        "n": n,
        "k": k,
        "us_per_node": per_node * 1e6,
        "gb_per_s": size / per_node / 1e9,
        "gweights_per_s": n * k / per_node / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--accuracy", type=int, default=4, help="accuracy_level (4: int8 x)")
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [measure(args, *case) for case in CASES]
    print(
        f"MatMulNBits, M=1, N={args.n}, K={args.k}, accuracy {args.accuracy}, "
        f"{args.threads} threads"
    )
    print("| bits | block | zero points | us per node | GB/s | Gweights/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['bits']} | {r['block']} | {r['zero_points']} | "
            f"{r['us_per_node']:.0f} | {r['gb_per_s']:.1f} | {r['gweights_per_s']:.1f} |"
        )
    if args.json is not None:
        command = " ".join(
            ["python benchmarks/investigations/nbits_kernel_rates.py", *sys.argv[1:]]
        )
        args.json.write_text(json.dumps({"command": command, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
