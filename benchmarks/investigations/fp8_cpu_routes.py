"""ModelOpt FP8 on the CPU: the exact routes, measured side by side (issue 28).

An FP8 weight is E4M3 codes times one FP32 scale per tensor. No 8-bit integer kernel computes
it exactly (an E4M3 value is not one integer code times a block scale: a block's exponents
span more than 3 binades), so the exact CPU routes all compute with the decoded values:

| route            | how                                                                  |
| f32              | `mobius build --dtype f32` (the default): DequantizeLinear (e4m3 x    |
|                  | scale) every step, then Gemm; routed experts: the selected experts'  |
|                  | rows gathered (GatherBlockQuantized) and decoded every call; the     |
|                  | session keeps the FP8 bytes                                          |
| f16              | `--dtype f16`: the same decode, float32 Gemm, the result rounded     |
| f32-ort          | `--backend ort --activations exact-fused`: as f32, with onnxruntime's |
|                  | contrib Mamba / attention kernels (FP8 leaves the CUDA-only kernel)  |
| f32-folded       | the f32 graph with each DequantizeLinear of an FP8 initializer        |
|                  | replaced by Cast + Mul, which onnxruntime folds once at session      |
|                  | creation: the linears dense FP32 in memory, no decode per step for   |
|                  | them; the experts' gathered decode stays (a graph edit here)         |
| f32-ort-folded   | f32-ort edited the same way                                          |
| f32-dense        | `--dtype f32 --backend ort --dequantize`: the E4M3 values written as |
|                  | dense f32 (an exact cast), each weight_scale the slot's output scale |
|                  | (linears: (x W^T) * s; experts: W * s folded once at session         |
|                  | creation, then the dense experts' paths); 4 bytes per weight         |
|                  | (runs/fp8_cpu_routes.json's f32-dense was the same weights decoded   |
|                  | into an f32 checkpoint by the benchmark, before `--dequantize` took  |
|                  | ModelOpt FP8)                                                        |

Each route's package is built once (/usr/bin/time: export wall time and peak RSS); then each
round runs every route in a fresh process (bench_gguf.py's child through bench_modelopt.py:
session creation time and the RSS it added, prefill of --prompt tokens as the median of
--repeats calls, greedy decode ms/token as the median after the first step, the process's
peak RSS, the logits), the routes rotating from round to round, the 1-minute load average
recorded before each. The prefill logits (last position) are compared with the f32 route's
and the f32-ort route's (NRMSE: the f32 routes must agree within the FP32 gates; f16 is
reported; against f32-ort, the routes with the same contrib kernels differ only in how they
hold the weights). Package bytes are
the weight bytes the export wrote.

Sizes (--size, the fixtures' random FP8 checkpoint): tiny (a smoke run), small (hidden 512,
6 layers, 32 experts), mid (docs/cpu_routes.md's model: common.py's MID widths, ME*MEME*ME);
or --model, a ModelOpt FP8 checkpoint directory.

Usage:
    python benchmarks/investigations/fp8_cpu_routes.py --size tiny --workdir /tmp/fp8_routes \
        --rounds 1
    python benchmarks/investigations/fp8_cpu_routes.py --size mid --threads 2 --rounds 5 \
        --prompt 128 --json benchmarks/investigations/runs/fp8_cpu_routes.json
    python benchmarks/investigations/fp8_cpu_routes.py --model CHECKPOINT_DIR --threads 2 \
        --rounds 5 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.attribution import package_with_graph
from mobius_lite.bench.workdir import claim_workdir, release_workdir
from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside this script: bench_*
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from bench_gguf import mid_moe  # noqa: E402
from bench_modelopt import SIZES as MODELOPT_SIZES  # noqa: E402
from bench_modelopt import run_child  # noqa: E402
from common import cpu_description, timed_export  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},  # the fixtures' own tiny model: smoke runs
    "small": MODELOPT_SIZES["small"],
    # docs/cpu_routes.md's model: common.py's MID widths without dense MLP layers
    "mid": mid_moe("mid"),
}
BUILT = {
    "f32": ["--dtype", "f32"],
    "f16": ["--dtype", "f16"],
    "f32-ort": ["--dtype", "f32", "--backend", "ort", "--activations", "exact-fused"],
    "f32-dense": ["--dtype", "f32", "--backend", "ort", "--dequantize"],
}
FOLDED = {"f32-folded": "f32", "f32-ort-folded": "f32-ort"}
REFERENCE = "f32"  # the default build
TIMED = ("session_create_s", "session_rss_mib", "prefill_ms", "decode_ms_per_token")


def fold_fp8_decodes(package: Path, out: Path) -> tuple[Path, int]:
    """A copy of `package` whose DequantizeLinear nodes over FP8 initializers are Cast + Mul
    (exact: the same float32 product), which onnxruntime folds at session creation; returns
    the copy and how many nodes changed."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    fp8 = {i.name for i in model.graph.initializer if i.data_type == TensorProto.FLOAT8E4M3FN}
    nodes, changed = [], 0
    for node in model.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in fp8:
            wide = node.output[0] + "_fp32"
            nodes.append(helper.make_node("Cast", [node.input[0]], [wide], to=TensorProto.FLOAT))
            nodes.append(helper.make_node("Mul", [wide, node.input[1]], list(node.output)))
            changed += 1
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return package_with_graph(package, out, model), changed


def checkpoint(args: argparse.Namespace) -> Path:
    """The ModelOpt FP8 checkpoint: --model, or the fixtures' random one of --size."""
    if args.model is not None:
        return args.model
    from reference_fixtures import modelopt_fixtures as mf

    path = args.workdir / "checkpoint"
    mf.write_checkpoint("fp8", path, overrides=SIZES[args.size])
    return path


def packages(source: Path, workdir: Path) -> dict[str, dict[str, Any]]:
    """Every route's package (built, or edited from a built one) and its weight bytes."""
    out: dict[str, dict[str, Any]] = {}
    for name, flags in BUILT.items():
        path = workdir / name
        out[name] = {"path": path, **timed_export(source, path, flags)}
    for name, base in FOLDED.items():
        path, changed = fold_fp8_decodes(out[base]["path"], workdir / name)
        out[name] = {"path": path, "package_weight_bytes": out[base]["package_weight_bytes"]}
        out[name]["folded_decodes"] = changed
    return out


def summarize(routes: dict[str, dict[str, Any]], rounds: dict[str, list[dict]], workdir: Path):
    """Per route: medians over rounds, the peak RSS, the prefill logits' NRMSE against the
    f32 and f32-ort routes' and the decode ratio to f32."""
    from mobius_lite.evaluation.metrics import compare

    reference = np.load(workdir / f"logits_{REFERENCE}.npy")[0]
    same_kernels = np.load(workdir / "logits_f32-ort.npy")[0]
    rows = []
    for name, info in routes.items():
        runs = rounds[name]
        row: dict[str, Any] = {"route": name}
        row |= {k: v for k, v in info.items() if k != "path"}
        row |= {key: statistics.median(run[key] for run in runs) for key in TIMED}
        row["peak_rss_mib"] = max(run["peak_rss_mib"] for run in runs)
        logits = np.load(workdir / f"logits_{name}.npy")[0]
        row["logits_nrmse_vs_f32"] = compare(name, logits, reference).nrmse
        # the same contrib Mamba / attention kernels: what the weights' route alone changes
        row["logits_nrmse_vs_f32_ort"] = compare(name, logits, same_kernels).nrmse
        row["rounds"] = [{k: run[k] for k in (*TIMED, "peak_rss_mib", "load_1min")} for run in runs]
        rows.append(row)
    base = next(r for r in rows if r["route"] == REFERENCE)["decode_ms_per_token"]
    for row in rows:
        row["decode_vs_f32"] = row["decode_ms_per_token"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, help="a ModelOpt FP8 checkpoint directory")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp8_cpu_routes"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=3, help="prefill calls timed per round")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    args = parser.parse_args()
    claim_workdir(args.workdir)
    # bench_modelopt's child reads these names
    child_args = argparse.Namespace(
        threads=args.threads,
        prompt_length=args.prompt,
        decode_tokens=args.decode_tokens,
        repeats=args.repeats,
    )
    try:
        routes = packages(checkpoint(args), args.workdir)
        os.sync()  # the exports' pages reach the disk before any timing starts
        names = list(routes)
        rounds: dict[str, list[dict]] = {name: [] for name in names}
        for index in range(args.rounds):  # rotating: every route once per round
            for name in names[index % len(names) :] + names[: index % len(names)]:
                out = args.workdir / f"logits_{name}.npy"
                rounds[name].append(run_child(routes[name]["path"], out, child_args))
                print(name, "round", index, rounds[name][-1]["decode_ms_per_token"], flush=True)
        rows = summarize(routes, rounds, args.workdir)
        for row in rows:
            print(json.dumps({k: v for k, v in row.items() if k != "rounds"}), flush=True)
        if args.json:
            result = {
                "command": " ".join(
                    ["python benchmarks/investigations/fp8_cpu_routes.py", *sys.argv[1:]]
                ),
                "size": args.size if args.model is None else str(args.model),
                "threads": args.threads,
                "rounds": args.rounds,
                "prompt": args.prompt,
                "decode_tokens": args.decode_tokens,
                "machine": cpu_description(),
                "rows": rows,
            }
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep:
            release_workdir(args.workdir)


if __name__ == "__main__":
    main()
