r"""CPU benchmark of ModelOpt packages next to the dense BF16-source build of the same model.

One random Nemotron-H MoE model is written as dense BF16 safetensors and as ModelOpt NVFP4 /
FP8 / MIXED_PRECISION checkpoints (quantized by the test fixtures' numpy quantizer; dense
tensors stored BF16 as the releases do), in one of two sizes (--size):
  small  hidden 512, 6 layers M E M * E M, 32 experts of 256 top-4, vocab 4096
  mid    benchmarks/common.py's MID widths (hidden 1024, 64 experts of 512 top-4, vocab 32000)
         with bench_gguf.py's pattern without dense MLP layers (ME*MEME*ME), the model of
         docs/cpu_routes.md
  tiny   common.py's TINY widths with that pattern (smoke runs)

Sides (--sides, comma-separated; only the checkpoints they need are written):
  dense-bf16       the dense checkpoint, `mobius build --dtype f32` (standard ops)
  nvfp4, fp8, mixed  the ModelOpt checkpoints, `--dtype f32` (standard route: the packed
                   bytes kept and decoded on every call)
  dense-bf16+ort   the dense checkpoint, `--backend ort` (the plain f32 CPU package)
  nvfp4+int8       the NVFP4 checkpoint, `--backend ort --activations int8` (issue 28: 8-bit
                   MatMulNBits / QMoE re-layouts folded at session creation; its target is
                   decode no slower than dense-bf16+ort)
  nvfp4+int8+lm_head-q8_0  the same with `--quantize-output q8_0`: the dense lm_head quantized
                   at export to llama.cpp's Q8_0, on MatMulNBits with int8 activations

Each side is exported under /usr/bin/time -v (wall time, peak RSS, package weight bytes),
then measured in a fresh process per round (bench_gguf.py's child: session creation time and
the RSS it added, prefill of --prompt-length tokens as the median of --repeats, greedy decode
ms/token as the median after the first step, the process's peak RSS, every step's logits),
the sides rotating from round to round; the 1-minute load average is recorded with each
round. Each side's prefill logits (last position) and greedy tokens are compared with the
reference side's (vs_reference): dense-bf16+ort when it runs, else dense-bf16; a fused
route's with its checkpoint's standard side when that runs too (vs_exact_same_weights: what
the kernels add to the quantization's own error); and the lm_head-q8_0 side's with
nvfp4+int8 when that runs too (vs_without_output_quantization: what quantizing lm_head adds,
with the decode and prefill ratios of the same run).

Usage:
    python benchmarks/investigations/bench_modelopt.py --workdir /tmp/bench_modelopt --threads 2 \
        --json /tmp/bench_modelopt.json
    # issue 28: ModelOpt NVFP4 on the int8 route against the dense f32 package, mid size
    python benchmarks/investigations/bench_modelopt.py --size mid \
        --sides dense-bf16+ort,nvfp4+int8 --workdir /tmp/bench_modelopt_mid --threads 2 \
        --rounds 3 --prompt-length 128 --decode-tokens 32 \
        --json benchmarks/investigations/runs/bench_modelopt_mid.json
    # the dense lm_head quantized at export to Q8_0 (--quantize-output q8_0), docs/modelopt.md
    python benchmarks/investigations/bench_modelopt.py --size mid \
        --sides dense-bf16+ort,nvfp4+int8,nvfp4+int8+lm_head-q8_0 \
        --workdir /tmp/bench_modelopt_lm_head --threads 2 --rounds 3 --prompt-length 128 \
        --decode-tokens 32 --json benchmarks/investigations/runs/bench_modelopt_mid_lm_head.json
    # its errors: the exact NVFP4 package too (standard route, slow: a few decode steps)
    python benchmarks/investigations/bench_modelopt.py --size mid \
        --sides dense-bf16+ort,nvfp4,nvfp4+int8 --workdir /tmp/bench_modelopt_mid --threads 2 \
        --prompt-length 128 --decode-tokens 4 \
        --json benchmarks/investigations/runs/bench_modelopt_mid_errors.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.workdir import claim_workdir, release_workdir

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside this script: bench_gguf
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from bench_gguf import compare_to_reference, mid_moe, ort_child  # noqa: E402
from common import cpu_description, timed_export  # noqa: E402

SIZES: dict[str, dict[str, Any]] = {
    "small": dict(
        vocab_size=4096,
        hidden_size=512,
        layers_block_type=["mamba", "moe", "mamba", "attention", "moe", "mamba"],
        mamba_num_heads=16,
        mamba_head_dim=64,
        ssm_state_size=64,
        n_groups=2,
        chunk_size=64,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=1024,
        n_routed_experts=32,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        moe_shared_expert_intermediate_size=512,
    ),
    "mid": mid_moe("mid"),
    "tiny": mid_moe("tiny"),  # smoke runs
}
VARIANTS = ("nvfp4", "fp8", "mixed")
DENSE = "dense-bf16"
# side -> (checkpoint, `mobius build` flags)
SIDES: dict[str, tuple[str, list[str]]] = {
    DENSE: (DENSE, ["--dtype", "f32"]),
    "nvfp4": ("nvfp4", ["--dtype", "f32"]),
    "fp8": ("fp8", ["--dtype", "f32"]),
    "mixed": ("mixed", ["--dtype", "f32"]),
    "dense-bf16+ort": (DENSE, ["--backend", "ort"]),
    "nvfp4+int8": ("nvfp4", ["--backend", "ort", "--activations", "int8"]),
    "nvfp4+int8+lm_head-q8_0": (
        "nvfp4",
        ["--backend", "ort", "--activations", "int8", "--quantize-output", "q8_0"],
    ),
}
# a side -> the same side without `--quantize-output` (vs_without_output_quantization: what
# quantizing lm_head adds, when both run)
WITHOUT_OUTPUT_QUANTIZATION = {"nvfp4+int8+lm_head-q8_0": "nvfp4+int8"}
DEFAULT_SIDES = (DENSE, *VARIANTS)
SCALES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale")
TIMED = ("session_create_s", "session_rss_mib", "prefill_ms", "decode_ms_per_token")


def write_checkpoints(workdir: Path, config: dict[str, Any], names: set[str]) -> dict[str, Path]:
    """The checkpoints named (DENSE and VARIANTS members) of one model, same seed: the
    ModelOpt ones by the fixtures' quantizer from the float32 weights, the dense one as
    save_pretrained writes the model in BF16."""
    import ml_dtypes
    import torch

    from reference_fixtures import modelopt_fixtures as mf
    from reference_fixtures.nemotron_reference import make_reference

    def bf16(tensors, config, hf) -> None:  # dense tensors as the releases store them
        for name, array in list(tensors.items()):
            if array.dtype == np.float32 and not name.endswith(SCALES):
                tensors[name] = array.astype(ml_dtypes.bfloat16)

    out, model = {}, None
    for variant in VARIANTS:
        if variant in names:
            out[variant] = workdir / f"ckpt_{variant}"
            model = mf.write_checkpoint(variant, out[variant], edit=bf16, overrides=config)
    if DENSE in names:
        out[DENSE] = workdir / "ckpt_dense"
        if model is None:  # write_checkpoint's model
            model = make_reference({**mf.OVERRIDES, **config}, seed=0)
        model.to(torch.bfloat16).save_pretrained(out[DENSE])
    return out


def tensor_bytes(checkpoint: Path) -> int:
    """The checkpoint's tensor bytes as stored (safetensors headers)."""
    from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

    source = SafetensorsCheckpoint(checkpoint)
    return sum(source.info(n).nbytes for n in source.names())


def data_bytes(package: Path) -> int:
    """The bytes of a package's external data files."""
    return sum(p.stat().st_size for p in package.iterdir() if p.name.endswith(".data"))


def child(package: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One round of one side, in this (fresh) process: bench_gguf.py's measurement on a
    prompt drawn from the package's vocabulary."""
    from mobius_lite.configs import NemotronHConfig

    vocab = NemotronHConfig.from_file(package).vocab_size
    prompt = np.random.default_rng(0).integers(3, vocab, size=(1, args.prompt_length))
    return ort_child(
        package, prompt, args.decode_tokens, args.threads, args.repeats, args.logits_out
    )


def run_child(package: Path, logits_out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """`child` in a fresh process; its JSON line, and the 1-minute load average before it."""
    load = os.getloadavg()[0]
    cmd = [sys.executable, __file__, "--child", str(package), "--logits-out", str(logits_out)]
    cmd += ["--threads", str(args.threads), "--prompt-length", str(args.prompt_length)]
    cmd += ["--decode-tokens", str(args.decode_tokens), "--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{package.name} failed:\n{proc.stderr[-4000:]}")
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "load_1min": load}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds: the timings' medians, the first round's tokens, every round kept."""
    out: dict[str, Any] = {key: statistics.median(run[key] for run in runs) for key in TIMED}
    out["peak_rss_mib"] = max(run["peak_rss_mib"] for run in runs)
    out["tokens"] = runs[0]["tokens"]
    out["rounds"] = [{k: run[k] for k in (*TIMED, "peak_rss_mib", "load_1min")} for run in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--sides", default=",".join(DEFAULT_SIDES))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_modelopt"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument("--repeats", type=int, default=3, help="prefill calls timed per round")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--logits-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child, args)))
        return
    sides = [s for s in args.sides.split(",") if s]
    unknown = set(sides) - set(SIDES)
    if unknown:
        parser.error(f"unknown sides {sorted(unknown)}; choose from {', '.join(SIDES)}")
    reference = "dense-bf16+ort" if "dense-bf16+ort" in sides else DENSE
    claim_workdir(args.workdir)
    config = SIZES[args.size]
    checkpoints = write_checkpoints(args.workdir, config, {SIDES[s][0] for s in sides})
    rows: dict[str, dict[str, Any]] = {}
    for side in sides:
        checkpoint, flags = SIDES[side]
        package = args.workdir / f"pkg_{side}"
        rows[side] = {
            "checkpoint": checkpoint,
            "command": " ".join(["mobius build --model", checkpoints[checkpoint].name, *flags]),
            "checkpoint_tensor_bytes": tensor_bytes(checkpoints[checkpoint]),
            **timed_export(checkpoints[checkpoint], package, flags),
            "package_data_bytes": data_bytes(package),
        }
        print(side, json.dumps(rows[side]), flush=True)
    os.sync()  # the exports' pages reach the disk before any timing starts
    rounds: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for index in range(args.rounds):
        for side in sides[index % len(sides) :] + sides[: index % len(sides)]:
            out = args.workdir / f"logits_{side}.npy"
            rounds[side].append(run_child(args.workdir / f"pkg_{side}", out, args))
            print(side, "round", index, json.dumps(rounds[side][-1]["decode_ms_per_token"]))
    logits = {side: np.load(args.workdir / f"logits_{side}.npy") for side in sides}
    for side in sides:
        rows[side] |= summarize(rounds[side])
    for side in sides:
        ref = rows.get(reference)
        if ref is not None and side != reference:
            rows[side]["vs_reference"] = {
                "reference": reference,
                "decode_ratio": rows[side]["decode_ms_per_token"] / ref["decode_ms_per_token"],
                "prefill_ratio": rows[side]["prefill_ms"] / ref["prefill_ms"],
                **compare_to_reference(
                    logits[side], rows[side]["tokens"], logits[reference], ref["tokens"]
                ),
            }
        exact = SIDES[side][0]  # the same checkpoint on the standard route: exact decode
        if exact in sides and exact != side:
            rows[side]["vs_exact_same_weights"] = compare_to_reference(
                logits[side], rows[side]["tokens"], logits[exact], rows[exact]["tokens"]
            )
        base = WITHOUT_OUTPUT_QUANTIZATION.get(side)
        if base in sides:
            rows[side]["vs_without_output_quantization"] = {
                "side": base,
                "decode_ratio": rows[side]["decode_ms_per_token"]
                / rows[base]["decode_ms_per_token"],
                "prefill_ratio": rows[side]["prefill_ms"] / rows[base]["prefill_ms"],
                **compare_to_reference(
                    logits[side], rows[side]["tokens"], logits[base], rows[base]["tokens"]
                ),
            }
        print(side, json.dumps({k: v for k, v in rows[side].items() if k != "rounds"}), flush=True)
    result = {
        "command": " ".join(["python benchmarks/investigations/bench_modelopt.py", *sys.argv[1:]]),
        "size": args.size,
        "config": config,
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "decode_tokens": args.decode_tokens,
        "machine": cpu_description(),
        "rows": [{"side": side, **row} for side, row in rows.items()],
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    release_workdir(args.workdir)


if __name__ == "__main__":
    main()
