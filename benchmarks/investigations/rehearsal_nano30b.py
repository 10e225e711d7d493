"""A real-size rehearsal of `--quantize` (issue 28, item 3; a benchmark, not CI).

Nemotron-3-Nano-30B-A3B's released layer sizes (hidden 2688, 128 routed experts top-6 of
width 1856 and one shared expert of 3712, Mamba 64 heads x 64 with state 128 in 8 groups,
attention 32 heads / 2 KV heads of 128, vocabulary 131072) with its first 8 of 52 layers
(`MEMEM*EM`, the start of the released hybrid_override_pattern): about 9 GiB of BF16.

One run:
  1. writes random BF16 weights shard by shard in save_pretrained's layout (index + shards,
     one tensor per expert; bench_streaming.py's writer beside it, never held in memory);
  2. exports it plainly in f16, and with `--quantize q8_0` / `q4_0` on the int8 route
     (`--backend ort --activations int8`), each under /usr/bin/time: wall time, peak RSS,
     package bytes;
  3. opens each package in a child process: session creation time and RSS after it, prefill
     of --prompt tokens and the median decode step over --steps tokens, with --threads;
  4. with `--llamacpp TYPE=FILE` (llama.cpp's own pure Q4_0 / Q8_0 of the same checkpoint, made
     with its converter and quantizer) and llama-cpp-python installed: the same figures from
     llama.cpp, side by side;
  5. deletes each package after measuring it, and the checkpoint at the end (unless --keep).
`--scale N` divides the widths and the expert count by N (rounded to whole 32-element blocks)
for a smoke run on a small machine; the lead runs it at --scale 1.

Usage:
    python benchmarks/investigations/rehearsal_nano30b.py --workdir /data/rehearsal \\
        --threads 2 --llamacpp q4_0=/data/nano8-Q4_0.gguf --llamacpp q8_0=/data/nano8-Q8_0.gguf \\
        --json benchmarks/investigations/runs/rehearsal_nano30b.json
    python benchmarks/investigations/rehearsal_nano30b.py --workdir /tmp/rehearsal --scale 42 \\
        --steps 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_streaming import write_checkpoint  # beside this script

from mobius_lite.bench.measure import rss_bytes
from mobius_lite.bench.package_peer import session_options
from mobius_lite.bench.workdir import claim_workdir, release_workdir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import open_package, run_llamacpp, timed_decode, timed_export  # noqa: E402

# Nemotron-3-Nano-30B-A3B's config.json sizes (nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16)
NANO_30B: dict[str, Any] = {
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 131072,
    "hidden_size": 2688,
    "mamba_num_heads": 64,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 1856,
    "n_routed_experts": 128,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "tie_word_embeddings": False,
    "layer_norm_epsilon": 1e-5,
}
FIRST_8 = "MEMEM*EM"  # M Mamba, E MoE, * attention
KINDS = {"M": "mamba", "E": "moe", "*": "attention"}
WIDTHS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "moe_shared_expert_intermediate_size",
)
ROUTES: dict[str, list[str]] = {
    "f16": ["--dtype", "f16"],
    "q8_0-int8": ["--quantize", "q8_0", "--backend", "ort", "--activations", "int8"],
    "q4_0-int8": ["--quantize", "q4_0", "--backend", "ort", "--activations", "int8"],
}


def config(scale: int) -> dict[str, Any]:
    """The rehearsal's config.json: the released sizes, divided by `scale` for a smoke run."""
    out = {**NANO_30B, "layers_block_type": [KINDS[c] for c in FIRST_8]}
    if scale > 1:
        for key in WIDTHS:
            out[key] = max(32, out[key] // scale // 32 * 32)
        out["n_routed_experts"] = max(8, out["n_routed_experts"] // scale)
        out["mamba_num_heads"] = max(8, out["mamba_num_heads"] // scale)
        out["num_attention_heads"] = max(2, out["num_attention_heads"] // scale)
        out["n_groups"] = 2
    return out


def _rss_mib() -> float:
    """This process's resident set now, MiB."""
    return rss_bytes() / 2**20


def _peak_rss_mib() -> float:
    """This process's peak resident set (ru_maxrss, KiB on Linux), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure_package(package: Path, prompt: int, steps: int, threads: int) -> dict[str, Any]:
    """In this (child) process: session creation, prefill and decode of one package."""
    before = _rss_mib()
    session, created = open_package(package, session_options(threads))
    after = _rss_mib()
    ids = np.random.default_rng(0).integers(3, 1000, size=(1, prompt)).astype(np.int64)
    session.reset(1)
    start = time.perf_counter()
    out = session.step(ids, logits_to_keep=1)
    prefill = time.perf_counter() - start
    decode = timed_decode(session, out["logits"], steps)
    return {
        "session_create_s": created,
        "session_rss_mib": after - before,
        "peak_rss_mib": _peak_rss_mib(),
        "prefill_s": prefill,
        "prefill_tokens": prompt,
        "decode_ms_per_token": 1000 * decode.median_after_first,
    }


def measure_llamacpp(path: Path, prompt: int, steps: int, threads: int) -> dict[str, Any]:
    """The same figures from llama.cpp on its own file (common.run_llamacpp: one warmed-up
    greedy pass); its RSS growth is read after the passes, the model loaded."""
    before = _rss_mib()
    ids = [int(t) for t in np.random.default_rng(0).integers(3, 1000, size=prompt)]
    timed = run_llamacpp(path, ids, steps, threads)
    return {
        "session_create_s": timed["load_s"],
        "session_rss_mib": _rss_mib() - before,
        "peak_rss_mib": _peak_rss_mib(),
        "prefill_s": timed["prefill_ms"] / 1e3,
        "prefill_tokens": prompt,
        "decode_ms_per_token": timed["decode_ms_per_token"],
        "file_bytes": path.stat().st_size,
    }


def child(args: argparse.Namespace, what: str, path: Path) -> dict[str, Any]:
    """Run one measurement in a fresh process (its RSS is its own)."""
    cmd = [sys.executable, __file__, "--child", what, str(path), "--prompt", str(args.prompt)]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llamacpp_files(specs: list[str]) -> dict[str, Path]:
    """--llamacpp TYPE=FILE arguments as {type: file}."""
    files = {}
    for spec in specs:
        kind, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--llamacpp {spec}: give TYPE=FILE, e.g. q4_0=/data/nano-Q4_0.gguf")
        files[kind.lower()] = Path(path)
    return files


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write the checkpoint, export and measure each route, then llama.cpp's files."""
    workdir = claim_workdir(Path(args.workdir))
    raw = config(args.scale)
    report: dict[str, Any] = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "scale": args.scale,
        "config": raw,
        "routes": {},
    }
    try:
        checkpoint = workdir / "checkpoint"
        start = time.perf_counter()
        report["checkpoint_bytes"] = write_checkpoint(checkpoint, raw)
        report["checkpoint_write_s"] = time.perf_counter() - start
        print(f"checkpoint: {report['checkpoint_bytes'] / 2**30:.2f} GiB", flush=True)
        for name, flags in ROUTES.items():
            package = workdir / name
            row = timed_export(checkpoint, package, flags)
            row.update(child(args, "package", package))
            report["routes"][name] = row
            print(f"{name}: {json.dumps(row)}", flush=True)
            release_package(package)
        report["llamacpp"] = llamacpp_rows(args)
    finally:
        if not args.keep:
            release_workdir(workdir)
    return report


def llamacpp_rows(args: argparse.Namespace) -> dict[str, Any]:
    """llama.cpp's figures per --llamacpp file, or why there are none."""
    files = llamacpp_files(args.llamacpp)
    if not files:
        return {"skipped": "no --llamacpp TYPE=FILE given"}
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (the llamacpp extra)"}
    return {kind: child(args, "llamacpp", path) for kind, path in files.items()}


def release_package(package: Path) -> None:
    """Delete a measured package (the next route's export needs the disk)."""
    shutil.rmtree(package, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/rehearsal_nano30b")
    parser.add_argument("--scale", type=int, default=1, help="divide widths (smoke runs)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens")
    parser.add_argument("--steps", type=int, default=32, help="decode steps")
    parser.add_argument("--llamacpp", action="append", default=[], metavar="TYPE=FILE")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, path = args.child
        measure = measure_package if what == "package" else measure_llamacpp
        print(json.dumps(measure(Path(path), args.prompt, args.steps, args.threads)))
        return
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=1))


if __name__ == "__main__":
    main()
