r"""Puzzle at production depth: the 88-layer topology with 512 experts per MoE layer.

Measures, in one run:
  1. the production-width graph (hidden 4096, 512 experts, latent 1024, per-layer widths and
     top-k in the released ranges) built without weights: build time, node counts (top level
     and inside subgraphs), op histogram; and the same with 64 experts (node count must match);
  2. a full-depth random-weight model with all 512 experts per MoE layer but tiny widths,
     written as a synthetic Puzzle checkpoint (model. prefix, one tensor per expert), exported
     with `mobius build` (wall time, peak RSS) and loaded by onnxruntime: session-creation time,
     prefill and decode-step latency.

Usage:
    python benchmarks/investigations/bench_puzzle_depth.py --workdir /tmp/bench_puzzle \
        --json benchmarks/investigations/runs/bench_puzzle_depth.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import open_package, timed_decode  # noqa: E402

from mobius_lite.layout import DECODER_FILE

# Layer order of the 88-layer Nemotron 3 Super parent (40 Mamba, 40 MoE, 8 attention); the
# Puzzle 75B-A9B release has the same counts (docs/puzzle.md).
PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
BLOCK_TYPES = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
# Per-layer values chosen inside the ranges public Puzzle configs show (docs/puzzle.md):
# five expert widths and seven top-k values across the MoE layers.
WIDTHS = (1280, 1792, 2048, 2304, 2816)
TOP_K = (4, 6, 8, 12, 14, 18, 22)

PRODUCTION = dict(
    model_type="nemotron_h_puzzle",
    vocab_size=131072,
    hidden_size=4096,
    num_attention_heads=32,
    num_key_value_heads=2,
    head_dim=128,
    mamba_num_heads=128,
    mamba_head_dim=64,
    ssm_state_size=128,
    n_groups=8,
    conv_kernel=4,
    chunk_size=128,
    moe_latent_size=1024,
    moe_shared_expert_intermediate_size=5376,
    n_shared_experts=1,
    n_group=1,
    topk_group=1,
    norm_topk_prob=True,
    routed_scaling_factor=5.0,
    num_nextn_predict_layers=0,
)

# Same topology and per-layer top-k, tiny widths (the expert count stays 512).
TINY = dict(
    PRODUCTION,
    vocab_size=1024,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    mamba_num_heads=8,
    mamba_head_dim=8,
    ssm_state_size=16,
    n_groups=2,
    chunk_size=16,
    moe_latent_size=32,
    moe_shared_expert_intermediate_size=48,
)
TINY_WIDTHS = (8, 12, 16, 20, 24)


def puzzle_config(base: dict[str, Any], experts: int, widths: tuple[int, ...]) -> dict[str, Any]:
    blocks = []
    moe_index = 0
    for char in PATTERN:
        block: dict[str, Any] = {"block_type": BLOCK_TYPES[char]}
        if char == "E":
            block.update(
                n_routed_experts=experts,
                num_experts_per_tok=TOP_K[moe_index % len(TOP_K)],
                moe_intermediate_size=widths[moe_index % len(widths)],
            )
            moe_index += 1
        blocks.append(block)
    return {**base, "block_configs": blocks}


def count_nodes(graph: ir.Graph, ops: Counter, inner_ops: Counter, nested: bool = False) -> None:
    for node in graph:
        (inner_ops if nested else ops)[node.op_type] += 1
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                count_nodes(attr.as_graph(), ops, inner_ops, True)
            elif attr.type == ir.AttributeType.GRAPHS:
                for sub in attr.as_graphs():
                    count_nodes(sub, ops, inner_ops, True)


def graph_figures(raw: dict[str, Any]) -> dict[str, Any]:
    from mobius_lite.components.context import BuildContext
    from mobius_lite.configs.loader import load_text_config
    from mobius_lite.graphs.decoder import build_decoder

    start = time.perf_counter()
    config = load_text_config(raw)
    model, _ = build_decoder(config, BuildContext.dense("bf16"))
    seconds = time.perf_counter() - start
    ops: Counter = Counter()
    inner: Counter = Counter()
    count_nodes(model.graph, ops, inner)
    params = sum(int(np.prod([int(d) for d in v.shape])) for v in model.graph.initializers.values())
    return {
        "layers": config.num_hidden_layers,
        "pattern_counts": dict(Counter(config.pattern)),
        "build_seconds": round(seconds, 2),
        "nodes_top_level": sum(ops.values()),
        "nodes_in_subgraphs": sum(inner.values()),
        "op_histogram_top_level": dict(ops.most_common()),
        "op_histogram_subgraphs": dict(inner.most_common()),
        "parameters": params,
    }


def _random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values that keep 88 random layers finite (same recipe as the tests' randomize)."""
    if name.endswith("A_log"):
        return np.log(rng.random(shape) * 4 + 0.5).astype(np.float32)
    if name.endswith("dt_bias"):
        return (rng.random(shape) * 2 - 1).astype(np.float32)
    if len(shape) == 1:
        return (1.0 + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def write_synthetic_checkpoint(raw: dict[str, Any], directory: Path, seed: int = 0) -> dict:
    """Puzzle layout from the graph's own parameter list: model. prefix, one tensor per expert;
    one shard per layer so that memory stays at one layer's tensors."""
    from safetensors.numpy import save_file

    from mobius_lite.configs.loader import load_text_config
    from mobius_lite.graphs.decoder import build_decoder
    from mobius_lite.weights.binding import graph_parameters

    rng = np.random.default_rng(seed)
    model, _ = build_decoder(load_text_config(raw))
    groups: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, (shape, _) in graph_parameters(model).items():
        layer = re.match(r"backbone\.layers\.(\d+)\.", name)
        groups.setdefault(f"layer{int(layer[1]):03d}" if layer else "rest", {})[name] = shape
    directory.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    tensors_written = 0
    for i, (_, params) in enumerate(sorted(groups.items())):
        tensors: dict[str, np.ndarray] = {}
        for name, shape in params.items():
            source = (
                "model." + name.removeprefix("backbone.") if name.startswith("backbone.") else name
            )
            if source.endswith((".experts.up_proj", ".experts.down_proj")):
                prefix, proj = source.rsplit(".", 1)
                for e in range(shape[0]):
                    tensors[f"{prefix}.{e}.{proj}.weight"] = _random(proj, shape[1:], rng)
            else:
                tensors[source] = _random(source, shape, rng)
        filename = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(tensors, str(directory / filename))
        weight_map.update(dict.fromkeys(tensors, filename))
        tensors_written += len(tensors)
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    (directory / "config.json").write_text(json.dumps(raw))
    size = sum(f.stat().st_size for f in directory.glob("*.safetensors"))
    return {"source_tensors": tensors_written, "checkpoint_bytes": size}


def export(checkpoint: Path, output: Path, backend: str) -> dict:
    cmd = [
        "/usr/bin/time", "-v", sys.executable, "-m", "mobius_lite.cli.main", "build",
        "--model", str(checkpoint), "--output", str(output), "--dtype", "f32", "--overwrite",
        "--backend", backend,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"export failed:\n{proc.stderr[-4000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    data = sum(f.stat().st_size for f in output.iterdir() if f.name.endswith(".data"))
    return {
        "export_seconds": round(wall, 1),
        "export_peak_rss_mib": round(int(rss[1]) / 1024) if rss else None,
        "onnx_file_bytes": (output / DECODER_FILE).stat().st_size,
        "external_data_bytes": data,
    }


def run_session(package: Path, raw: dict[str, Any], threads: int) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session, created = open_package(package, options)
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, raw["vocab_size"], size=(1, 16)).astype(np.int64)
    start = time.perf_counter()
    out = session.step(prompt, logits_to_keep=1)
    prefill = time.perf_counter() - start
    finite = [bool(np.isfinite(out["logits"]).all())]
    decoded = timed_decode(
        session, out["logits"], 5, lambda o: finite.append(bool(np.isfinite(o["logits"]).all()))
    )
    steps = decoded.seconds
    return {
        "session_create_seconds": round(created, 2),
        "prefill_16_tokens_ms": round(prefill * 1e3, 1),
        "first_decode_step_ms": round(steps[0] * 1e3, 1),
        "median_decode_step_ms": round(statistics.median(steps) * 1e3, 1),
        "logits_finite": all(finite),
        "ort_threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep checkpoint and package")
    parser.add_argument(
        "--backend",
        choices=("standard", "ort"),
        default="ort",
        help="the export's --backend (default: %(default)s)",
    )
    args = parser.parse_args()

    figures: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor()},
        "command": " ".join(
            ["python", "benchmarks/investigations/bench_puzzle_depth.py", *sys.argv[1:]]
        ),
        "backend": args.backend,
    }
    figures["production_512"] = graph_figures(puzzle_config(PRODUCTION, 512, WIDTHS))
    figures["production_64"] = graph_figures(puzzle_config(PRODUCTION, 64, WIDTHS))
    for key in ("production_512", "production_64"):
        print(key, {k: v for k, v in figures[key].items() if not k.startswith("op_")}, flush=True)

    tiny = puzzle_config(TINY, 512, TINY_WIDTHS)
    figures["tiny_512_graph"] = graph_figures(tiny)
    figures["tiny_64_graph"] = graph_figures(puzzle_config(TINY, 64, TINY_WIDTHS))
    workdir = args.workdir
    if workdir.exists():
        shutil.rmtree(workdir)
    try:
        start = time.perf_counter()
        figures["tiny_512_checkpoint"] = write_synthetic_checkpoint(tiny, workdir / "checkpoint")
        figures["tiny_512_checkpoint"]["write_seconds"] = round(time.perf_counter() - start, 1)
        print("checkpoint", figures["tiny_512_checkpoint"], flush=True)
        figures["tiny_512_export"] = export(
            workdir / "checkpoint", workdir / "package", args.backend
        )
        print("export", figures["tiny_512_export"], flush=True)
        figures["tiny_512_session"] = run_session(workdir / "package", tiny, args.threads)
        print("session", figures["tiny_512_session"], flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    same = (
        figures["production_512"]["nodes_top_level"] == figures["production_64"]["nodes_top_level"]
        and figures["production_512"]["nodes_in_subgraphs"]
        == figures["production_64"]["nodes_in_subgraphs"]
        and figures["tiny_512_graph"]["nodes_top_level"]
        == figures["tiny_64_graph"]["nodes_top_level"]
    )
    figures["node_count_independent_of_experts"] = same
    print(json.dumps({k: v for k, v in figures.items() if "graph" not in k}, indent=1)[:4000])
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
