"""A real-size rehearsal of `--quantize` (issue 28, item 3; a benchmark, not CI).

Nemotron-3-Nano-30B-A3B's released layer sizes (hidden 2688, 128 routed experts top-6 of
width 1856 and one shared expert of 3712, Mamba 64 heads x 64 with state 128 in 8 groups,
attention 32 heads / 2 KV heads of 128, vocabulary 131072) with its first 8 of 52 layers
(`MEMEM*EM`, the start of the released hybrid_override_pattern): 9.55 GB (8.9 GiB) of BF16.

One run:
  1. prints the planned disk peak (and stops when the workdir's disk has less free);
  2. writes random BF16 weights shard by shard in save_pretrained's layout (index + shards,
     one tensor per expert; bench_streaming.py's writer beside it, never held in memory), and
     a small byte-level BPE tokenizer as save_pretrained writes it (llama.cpp's converter pads
     it to vocab_size with unused tokens);
  3. exports it plainly in f16, and with `--quantize q8_0` / `q4_0` on the int8 route
     (`--backend ort --activations int8`), each under /usr/bin/time: wall time, peak RSS,
     package bytes;
  4. opens each package in a child process: session creation time and RSS after it, prefill
     of --prompt tokens and the median decode step over --steps tokens, with --threads;
     deletes the package;
  5. with `--llama-cpp TREE` (a llama.cpp source tree) and llama-cpp-python installed: makes
     llama.cpp's own files of the same checkpoint, each step under /usr/bin/time (wall time,
     peak RSS): the tree's convert_hf_to_gguf.py to a BF16 GGUF (then the checkpoint is
     deleted, unless --keep), llama.cpp's quantizer (llama_model_quantize, `--pure`) to pure
     Q8_0 and Q4_0 (then the BF16 GGUF is deleted); measures each file as in 4 with
     llama.cpp and deletes it (where llama.cpp's AMX matmul crashes, as on this machine's
     CPU, once more without its extra CPU buffer types: see without_extra_buffer_types).
     Or `--llamacpp TYPE=FILE`: files made elsewhere, measured the same way (kept).
`--scale N` divides the widths and the expert count by N (rounded to whole 32-element blocks)
for a smoke run on a small machine; the lead runs it at --scale 1 (planned disk peak 19.1 GB:
the BF16 GGUF beside the checkpoint while converting, then beside the Q8_0 and Q4_0 files).

llama-cpp-python's source distribution carries a llama.cpp tree (vendor/llama.cpp):
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lsrc
    tar xzf /tmp/lsrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/lsrc

Usage:
    python benchmarks/investigations/rehearsal_nano30b.py --workdir /data/rehearsal \\
        --threads 2 --llama-cpp /tmp/lsrc/llama_cpp_python-0.3.36/vendor/llama.cpp \\
        --json benchmarks/investigations/runs/rehearsal_nano30b.json
    python benchmarks/investigations/rehearsal_nano30b.py --workdir /tmp/rehearsal --scale 42 \\
        --steps 4 --prompt 16 --llama-cpp /tmp/lsrc/llama_cpp_python-0.3.36/vendor/llama.cpp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_streaming import checkpoint_tensors, write_checkpoint  # beside this script

from mobius_lite.bench.measure import rss_bytes
from mobius_lite.bench.package_peer import session_options
from mobius_lite.bench.workdir import claim_workdir, release_workdir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import (  # noqa: E402
    CORPUS,
    convert_command,
    open_package,
    quantize_command,
    run_llamacpp,
    save_bpe_tokenizer,
    timed_command,
    timed_decode,
    timed_export,
)

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
    "n_shared_experts": 1,
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
# llama.cpp's files of the checkpoint: pure quantizations of the converter's BF16 GGUF
LLAMA_FTYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0"}
# GGUF bytes per element of a tensor llama.cpp quantizes (rows of whole 32-element blocks)
GGUF_BYTES = {"bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32}
GGUF_VOCAB_BYTES = 32  # a GGUF's vocabulary metadata per token, at most ("[PAD131071]", type)
TOKENIZER_VOCAB = 300  # the BPE's own tokens; the converter pads to vocab_size
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
        kv_heads = out["num_key_value_heads"]  # heads in whole KV groups
        out["num_attention_heads"] = max(
            kv_heads, out["num_attention_heads"] // scale // kv_heads * kv_heads
        )
        out["n_groups"] = 2
    return out


def planned_disk(raw: dict[str, Any], llama_cpp: bool, keep: bool) -> dict[str, int]:
    """Bytes on disk at each stage of a run, and their peak: the checkpoint (BF16), beside one
    package at a time (bounded by its f16 size: no route writes more), then with `llama_cpp`
    the converter's BF16 GGUF beside the checkpoint, and the BF16 GGUF beside the Q8_0 and
    Q4_0 files (the checkpoint too with `keep`). GGUF sizes: llama.cpp keeps vectors and
    tensors of rows not in 32-element blocks (conv1d) in F32; the vocabulary's metadata beside."""
    elements = [(int(np.prod(shape)), shape) for _, shape in checkpoint_tensors(raw)]
    checkpoint = sum(2 * n for n, _ in elements)

    def gguf(kind: str) -> int:
        tensors = sum(
            GGUF_BYTES[kind] * n if len(shape) >= 2 and shape[-1] % 32 == 0 else 4 * n
            for n, shape in elements
        )
        return int(tensors) + GGUF_VOCAB_BYTES * raw["vocab_size"]

    plan = {"checkpoint": checkpoint, "checkpoint_and_package": 2 * checkpoint}
    if llama_cpp:
        plan["checkpoint_and_bf16_gguf"] = checkpoint + gguf("bf16")
        plan["ggufs"] = gguf("bf16") + gguf("q8_0") + gguf("q4_0") + (checkpoint if keep else 0)
    plan["peak"] = max(plan.values())
    return plan


def check_disk(workdir: Path, plan: dict[str, int]) -> None:
    """Print the planned disk peak; SystemExit when the workdir's disk has less free."""
    free = shutil.disk_usage(workdir).free
    stages = ", ".join(f"{k} {v / 1e9:.3f} GB" for k, v in plan.items() if k != "peak")
    print(f"planned disk peak: {plan['peak'] / 1e9:.3f} GB ({stages}); free: {free / 1e9:.2f} GB")
    if plan["peak"] > free:
        raise SystemExit(
            f"{workdir}: {free / 1e9:.2f} GB free, the run needs {plan['peak'] / 1e9:.2f} GB"
        )


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


def without_extra_buffer_types() -> None:
    """In this (child) process: llama.cpp loads weights without its extra CPU buffer types
    (use_extra_bufts off: no AMX, no repacked Q4_0 / Q8_0 layouts). On an AMX CPU llama.cpp
    0.3.36's AMX matmul dies of SIGSEGV at the first prefill of these files
    (ggml_backend_amx_mul_mat; ggml-org/llama.cpp issue 20824, Nemotron-3-Nano too), and
    llama_cpp.Llama has no argument for it: its default model parameters are wrapped."""
    import llama_cpp
    import llama_cpp.llama

    defaults = llama_cpp.llama_model_default_params

    def params() -> Any:
        out = defaults()
        out.use_extra_bufts = False
        return out

    llama_cpp.llama.llama_cpp.llama_model_default_params = params


def measure_llamacpp(
    path: Path, prompt: int, steps: int, threads: int, extra_bufts: bool = True
) -> dict[str, Any]:
    """The same figures from llama.cpp on its own file (common.run_llamacpp: one warmed-up
    greedy pass); its RSS growth is read after the passes, the model loaded. `extra_bufts`
    False: without llama.cpp's extra CPU buffer types (without_extra_buffer_types)."""
    if not extra_bufts:
        without_extra_buffer_types()
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
        "extra_buffer_types": extra_bufts,
    }


def child(args: argparse.Namespace, what: str, path: Path) -> dict[str, Any]:
    """Run one measurement in a fresh process (its RSS is its own)."""
    cmd = [sys.executable, __file__, "--child", what, str(path), "--prompt", str(args.prompt)]
    cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
    if proc.returncode:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"
        return {"error": last, "returncode": proc.returncode}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_llamacpp(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """llama.cpp's figures on one file in a fresh process; when llama.cpp dies of SIGSEGV
    (its AMX matmul on an AMX CPU: without_extra_buffer_types), once more without its extra
    buffer types, the crash recorded beside."""
    row = child(args, "llamacpp", path)
    if row.get("returncode") != -signal.SIGSEGV:
        return row
    retry = child(args, "llamacpp-plain", path)
    return {**retry, "with_extra_buffer_types": "SIGSEGV (llama.cpp issue 20824 on AMX CPUs)"}


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
    raw = config(args.scale)
    plan = planned_disk(raw, args.llama_cpp is not None, args.keep)
    workdir = claim_workdir(Path(args.workdir))
    report: dict[str, Any] = {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "threads": args.threads,
        "scale": args.scale,
        "config": raw,
        "planned_disk_bytes": plan,
        "routes": {},
    }
    try:
        check_disk(workdir, plan)
        checkpoint = workdir / "checkpoint"
        start = time.perf_counter()
        report["checkpoint_bytes"] = write_checkpoint(checkpoint, raw)
        save_bpe_tokenizer(checkpoint, CORPUS, vocab_size=TOKENIZER_VOCAB)
        report["checkpoint_write_s"] = time.perf_counter() - start
        print(f"checkpoint: {report['checkpoint_bytes'] / 2**30:.2f} GiB", flush=True)
        for name, flags in ROUTES.items():
            package = workdir / name
            row = timed_export(checkpoint, package, flags)
            row.update(child(args, "package", package))
            report["routes"][name] = row
            print(f"{name}: {json.dumps(row)}", flush=True)
            release_package(package)
        if args.llama_cpp is not None:
            report["llamacpp"] = llamacpp_made(args, checkpoint, workdir)
        else:
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
    return {kind: child_llamacpp(args, path) for kind, path in files.items()}


def llamacpp_made(args: argparse.Namespace, checkpoint: Path, workdir: Path) -> dict[str, Any]:
    """llama.cpp's own pure Q8_0 / Q4_0 files of the checkpoint, made from the --llama-cpp
    tree (converter to BF16, then the quantizer; wall time and peak RSS of each), measured
    and deleted one by one. The checkpoint goes after the conversion unless --keep."""
    rows: dict[str, Any] = {"tree": str(args.llama_cpp)}
    bf16 = workdir / "nano8-BF16.gguf"
    command = convert_command(args.llama_cpp, checkpoint, bf16, "bf16")
    wall, rss = timed_command(command, "llama.cpp's converter")
    rows["convert"] = {"wall_s": wall, "peak_rss_mib": rss, "file_bytes": bf16.stat().st_size}
    print(f"convert_hf_to_gguf bf16: {json.dumps(rows['convert'])}", flush=True)
    if not args.keep:
        shutil.rmtree(checkpoint)
    files = {}
    for kind, ftype in LLAMA_FTYPES.items():
        files[kind] = workdir / f"nano8-{kind.upper()}.gguf"
        command = quantize_command(bf16, files[kind], ftype, args.threads)
        wall, rss = timed_command(command, f"llama.cpp's quantizer ({kind})")
        rows[kind] = {"quantize_wall_s": wall, "quantize_peak_rss_mib": rss}
    bf16.unlink()
    for kind, path in files.items():
        rows[kind].update(child_llamacpp(args, path))
        print(f"llama.cpp {kind}: {json.dumps(rows[kind])}", flush=True)
        path.unlink()
    return rows


def release_package(package: Path) -> None:
    """Delete a measured package (the next route's export needs the disk)."""
    shutil.rmtree(package, ignore_errors=True)


def check_llama_cpp(args: argparse.Namespace) -> None:
    """SystemExit before anything is written unless --llama-cpp is a llama.cpp tree and
    llama-cpp-python (the quantizer, the timed runs) imports."""
    if args.llamacpp:
        raise SystemExit("give --llama-cpp TREE or --llamacpp TYPE=FILE, not both")
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{args.llama_cpp} has no convert_hf_to_gguf.py: pass a llama.cpp tree")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        raise SystemExit("--llama-cpp needs llama-cpp-python (the llamacpp extra)") from None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", default="/tmp/rehearsal_nano30b")
    parser.add_argument("--scale", type=int, default=1, help="divide widths (smoke runs)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128, help="prefill tokens")
    parser.add_argument("--steps", type=int, default=32, help="decode steps")
    parser.add_argument(
        "--llama-cpp",
        type=Path,
        metavar="TREE",
        help="a llama.cpp source tree: make its pure Q8_0 / Q4_0 files of the checkpoint",
    )
    parser.add_argument(
        "--llamacpp",
        action="append",
        default=[],
        metavar="TYPE=FILE",
        help="llama.cpp's files made elsewhere (q4_0=FILE, q8_0=FILE), instead of --llama-cpp",
    )
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, path = args.child
        measured = (Path(path), args.prompt, args.steps, args.threads)
        if what == "package":
            print(json.dumps(measure_package(*measured)))
        else:
            print(json.dumps(measure_llamacpp(*measured, extra_bufts=what == "llamacpp")))
        return
    if args.llama_cpp is not None:
        check_llama_cpp(args)
    report = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=1))


if __name__ == "__main__":
    main()
