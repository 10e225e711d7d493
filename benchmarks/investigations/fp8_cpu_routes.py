"""ModelOpt FP8 on the CPU: the exact routes, measured side by side (issue 28).

An FP8 weight is E4M3 codes times one FP32 scale per tensor. No 8-bit integer kernel computes
it exactly (an E4M3 value is not one integer code times a block scale: a block's exponents
span more than 3 binades), so the exact CPU routes all compute with the decoded values:

| route            | how                                                                  |
| f32              | `mobius build --dtype f32`: DequantizeLinear (e4m3 x scale) every     |
|                  | step, then Gemm; the session keeps the FP8 bytes                     |
| f16              | `--dtype f16`: the same decode, float32 Gemm, the result rounded     |
| f32-ort          | `--backend ort --activations exact-fused`: as f32, with onnxruntime's |
|                  | contrib Mamba / attention kernels (FP8 leaves the CUDA-only kernel)  |
| f32-folded       | the f32 graph with each DequantizeLinear of an FP8 initializer        |
|                  | replaced by Cast + Mul, which onnxruntime folds once at session      |
|                  | creation: dense FP32 weights in memory (4x the FP8 bytes), no decode |
|                  | per step (a graph edit here, timing only)                            |
| f32-ort-folded   | f32-ort edited the same way                                          |

Each route runs in alternating rounds in one process, after one discarded warm-up session
(so that library loading stays out of the first route's RSS): session creation (seconds, RSS
growth),
prefill of `--prompt` tokens and greedy decode ms/token (medians over rounds), and the first
step's logits against the f32 route's (NRMSE; the f32 routes must agree within the FP32
gates, f16 is reported). Package bytes are the external data written.

Usage (the lead runs it on the mid model; tiny is a smoke run):
    python benchmarks/investigations/fp8_cpu_routes.py --size tiny --workdir /tmp/fp8_routes \
        --rounds 1
    python benchmarks/investigations/fp8_cpu_routes.py --model CHECKPOINT_DIR --threads 2 \
        --rounds 5 --json benchmarks/investigations/runs/fp8_cpu_routes.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.attribution import package_with_graph
from mobius_lite.bench.measure import rss_bytes
from mobius_lite.bench.package_peer import session_options
from mobius_lite.bench.workdir import claim_workdir, release_workdir
from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from common import open_package, timed_decode, timed_export  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": dict(
        vocab_size=4096,
        hidden_size=512,
        layers_block_type=["mamba", "moe", "mamba", "attention", "moe", "mamba"],
        mamba_num_heads=16,
        mamba_head_dim=64,
        ssm_state_size=64,
        n_groups=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        n_routed_experts=32,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        moe_shared_expert_intermediate_size=512,
    ),
}
BUILT = {
    "f32": ["--dtype", "f32"],
    "f16": ["--dtype", "f16"],
    "f32-ort": ["--dtype", "f32", "--backend", "ort", "--activations", "exact-fused"],
}
FOLDED = {"f32-folded": "f32", "f32-ort-folded": "f32-ort"}


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


def measure(package: Path, threads: int, prompt: np.ndarray, steps: int) -> dict[str, Any]:
    """One round of one route: session creation, prefill, decode, first logits."""
    before = rss_bytes()
    session, created = open_package(package, session_options(threads))
    grown = rss_bytes() - before
    session.reset(1)
    start = time.perf_counter()
    out = session.step(prompt)
    prefill = time.perf_counter() - start
    decoded = timed_decode(session, out["logits"], steps)
    return {
        "session_create_s": created,
        "session_rss_growth_mib": grown / 2**20,
        "prefill_ms": 1e3 * prefill,
        "decode_ms_per_token": 1e3 * decoded.median_after_first,
        "logits": out["logits"][0, -1].astype(np.float64),
    }


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


def summarize(routes: dict[str, dict[str, Any]], rounds: list[dict[str, dict]]) -> list[dict]:
    """Per route: medians over rounds, and the first logits' NRMSE against the f32 route."""
    from mobius_lite.evaluation.metrics import compare

    reference = rounds[0]["f32"]["logits"]
    rows = []
    for name, info in routes.items():
        runs = [r[name] for r in rounds]
        row = {"route": name, "package_weight_bytes": info["package_weight_bytes"]}
        for key in ("session_create_s", "session_rss_growth_mib", "prefill_ms"):
            row[key] = float(np.median([r[key] for r in runs]))
        row["decode_ms_per_token"] = float(np.median([r["decode_ms_per_token"] for r in runs]))
        row["logits_nrmse_vs_f32"] = compare(name, runs[0]["logits"], reference).nrmse
        if "folded_decodes" in info:
            row["folded_decodes"] = info["folded_decodes"]
        rows.append(row)
    base = next(r for r in rows if r["route"] == "f32")["decode_ms_per_token"]
    for row in rows:
        row["decode_vs_f32"] = row["decode_ms_per_token"] / base
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a ModelOpt FP8 checkpoint directory")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/fp8_cpu_routes"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the workdir")
    args = parser.parse_args()
    claim_workdir(args.workdir)
    try:
        routes = packages(checkpoint(args), args.workdir)
        from mobius_lite.configs import NemotronHConfig

        vocab = NemotronHConfig.from_file(routes["f32"]["path"]).vocab_size
        prompt = np.random.default_rng(0).integers(3, vocab, size=(1, args.prompt))
        measure(routes["f32"]["path"], args.threads, prompt, 2)  # warm-up: libraries loaded
        rounds = []
        for _ in range(args.rounds):  # alternating: every route once per round
            rounds.append(
                {
                    name: measure(info["path"], args.threads, prompt, args.decode_tokens)
                    for name, info in routes.items()
                }
            )
        rows = summarize(routes, rounds)
        for row in rows:
            print(json.dumps(row), flush=True)
        if args.json:
            result = {"threads": args.threads, "rounds": args.rounds, "rows": rows}
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep:
            release_workdir(args.workdir)


if __name__ == "__main__":
    main()
