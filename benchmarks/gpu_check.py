"""The GPU check: every CUDA route this checkout builds, on one GPU, one verdict line each.

Routes checked:
- `--quantize int4 | int8` packages for `--ep cuda --dtype f16 --backend ort` (MatMulNBits
  with f16 activations and scales, symmetric and asymmetric): the package runs on
  CUDAExecutionProvider, and its prefill and decode logits match the same quantization built
  for the CPU in f32 (the same weights; the f16 graph's own rounding) within the release
  gates (NRMSE <= 0.03, cosine >= 0.999), with the same greedy tokens.
- the speculation windows from onnxruntime's `state_window` attribute (issue 29;
  build(..., ep="cuda", weights_backend="ort", state_window_kernel=True), docs/speculative.md),
  on a tiny random checkpoint with an MTP head, against the scan route (standard ops):
  1. a prompt, then one 5-position call: every present_window.* slot and present of the
     kernel route against the scan route's (FP32 gates);
  2. speculative greedy decoding at K = 4 with a scripted drafter wrong at every fifth
     position, batch 1 and 2: tokens identical to plain greedy decoding, every rejection cut
     back from the windows (no re-run), and the final states plain decoding's (FP32 gates).
Each route prints `PASS`, `FAIL` or `SKIP` with its figures; the exit status is 1 when any
route fails. Without a GPU (no CUDAExecutionProvider, or no device) it prints one line and
exits 0.

Usage:
    python benchmarks/gpu_check.py [--workdir /tmp/gpu_check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # the MTP checkpoint and scripted drafter fixtures

from bench_common import claim_workdir, release_workdir  # noqa: E402

# a tiny Nemotron-H whose rows hold whole blocks of 32 to 128 elements
TINY = {
    "vocab_size": 256,
    "hidden_size": 256,
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "moe_shared_expert_intermediate_size": 128,
    "n_group": 1,
    "topk_group": 1,
}
QUANTIZE_ROUTES: dict[str, list[str]] = {
    "int4": ["--quantize", "int4"],
    "int4-asym": ["--quantize", "int4", "--quantize-asymmetric"],
    "int8-b64": ["--quantize", "int8", "--quantize-block-size", "64"],
}
NRMSE_GATE, COSINE_GATE = 0.03, 0.999  # evaluation.metrics RELEASE_*


def cuda_available() -> str | None:
    """None when a CUDA device runs onnxruntime, else why not (one sentence)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        pass
    return None


def tiny_checkpoint(directory: Path) -> Path:
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    torch.manual_seed(0)
    model = NemotronHForCausalLM(NemotronHConfig(**TINY)).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim > 1:
                p.normal_(0, p.shape[-1] ** -0.5)
    model.save_pretrained(directory)
    return directory


def build(checkpoint: Path, out: Path, flags: list[str]) -> None:
    from mobius_lite.cli.main import main

    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q", "--overwrite"]
    if main([*args, *flags]) != 0:
        raise RuntimeError(f"mobius build {' '.join(flags)} failed")


def logits(package: Path, provider: str, steps: int = 4) -> tuple[np.ndarray, list[int]]:
    from mobius_lite.run.runtime import DecoderSession

    session = DecoderSession(package / "model.onnx", providers=[provider])
    session.reset(1)
    ids = np.random.default_rng(0).integers(3, TINY["vocab_size"], size=(1, 12))
    out = [session.step(ids)["logits"].astype(np.float32)]
    tokens = []
    for _ in range(steps):
        tokens.append(int(out[-1][0, -1].argmax()))
        out.append(session.step(np.array([[tokens[-1]]]))["logits"].astype(np.float32))
    return np.concatenate([o.reshape(-1) for o in out]), tokens


def check_quantized(checkpoint: Path, workdir: Path, name: str, flags: list[str]) -> str:
    from mobius_lite.evaluation.metrics import compare

    gpu, cpu = workdir / f"{name}-cuda", workdir / f"{name}-cpu"
    build(checkpoint, gpu, [*flags, "--ep", "cuda", "--dtype", "f16", "--backend", "ort"])
    build(checkpoint, cpu, flags)
    ours, our_tokens = logits(gpu, "CUDAExecutionProvider")
    reference, ref_tokens = logits(cpu, "CPUExecutionProvider")
    c = compare(name, ours, reference)
    ok = c.finite and c.nrmse <= NRMSE_GATE and c.cosine >= COSINE_GATE
    ok = ok and our_tokens == ref_tokens
    verdict = "PASS" if ok else "FAIL"
    return (
        f"{verdict} quantize {name} (cuda f16 MatMulNBits vs cpu f32): nrmse {c.nrmse:.2e}, "
        f"cosine {c.cosine:.6f}, tokens {'equal' if our_tokens == ref_tokens else 'differ'}"
    )


CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
SPECULATION_TOKENS = 32


def gates(name: str, actual: np.ndarray, expected: np.ndarray) -> dict[str, Any]:
    from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare

    c = compare(name, actual, expected)
    return {"name": name, "nrmse": c.nrmse, "passes": c.passes(FP32_NRMSE, FP32_COSINE)}


def window_slots(packages: dict[str, Path]) -> list[dict[str, Any]]:
    """Check 1: the kernel route's windows and presents against the scan route's."""
    from mobius_lite.run.runtime import DecoderSession

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 80, size=(2, 9)).astype(np.int64)
    fed = rng.integers(3, 80, size=(2, 5)).astype(np.int64)
    outs = {}
    for route, package in packages.items():
        decoder = DecoderSession(package / "model.onnx", CUDA)
        decoder.reset(2)
        decoder.step(prompt)
        outs[route] = decoder.step(fed)
    results = []
    for name, expected in outs["scan"].items():
        if name.startswith("present"):
            results.append(gates(name, outs["kernel"][name], expected))
    return results


def speculation(package: Path) -> list[dict[str, Any]]:
    """Check 2: speculative decoding on the kernel route against plain greedy decoding."""
    from mobius_lite.run.runtime import DecoderSession
    from mobius_lite.run.speculative import speculative_greedy
    from speculative_fixtures import ScriptedHead, plain_greedy

    results = []
    for batch in (1, 2):
        decoder = DecoderSession(package / "model.onnx", CUDA)
        ids = np.random.default_rng(batch).integers(3, 80, size=(batch, 9)).astype(np.int64)
        mask = np.ones_like(ids)
        plain, _ = plain_greedy(decoder, ids, mask, SPECULATION_TOKENS)
        state = dict(decoder.past)
        known = np.concatenate([ids, plain], axis=1)
        head = ScriptedHead(known, decoder.vocab_size, lambda row, t: (7 * t + row) % 5 == 0)
        tokens, stats = speculative_greedy(
            decoder, head, ids, SPECULATION_TOKENS, 4, attention_mask=mask, adaptive=False
        )
        states = [gates(f"batch {batch} {n}", decoder.past[n], v) for n, v in state.items()]
        results.append(
            {
                "batch": batch,
                "tokens_identical": bool(np.array_equal(np.array(tokens), plain)),
                "rewinds": stats.rewinds,
                "rollbacks": stats.rollbacks,
                "passes": bool(np.array_equal(np.array(tokens), plain))
                and stats.rollbacks == 0
                and stats.rewinds > 0
                and all(s["passes"] for s in states),
                "states": states,
            }
        )
    return results


def check_state_window(workdir: Path) -> list[str]:
    """The state_window kernel route against the scan route: one verdict line per check."""
    import mobius_lite
    from mtp_fixtures import write_nemotron_h_mtp_checkpoint

    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(workdir / "mtp-checkpoint")
    packages = {
        route: mobius_lite.build(
            checkpoint, ep="cuda", weights_backend="ort", state_window_kernel=route == "kernel"
        ).save(workdir / f"window-{route}", quiet=True)
        for route in ("scan", "kernel")
    }
    slots = window_slots(packages)
    worst = max(slot["nrmse"] for slot in slots)
    verdict = "PASS" if all(slot["passes"] for slot in slots) else "FAIL"
    lines = [
        f"{verdict} state_window slots (kernel vs scan, {len(slots)} arrays): "
        f"worst nrmse {worst:.2e}"
    ]
    for run in speculation(packages["kernel"]):
        verdict = "PASS" if run["passes"] else "FAIL"
        lines.append(
            f"{verdict} state_window speculation batch {run['batch']}: tokens "
            f"{'identical' if run['tokens_identical'] else 'differ'}, {run['rewinds']} cut back, "
            f"{run['rollbacks']} re-runs"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/gpu_check")
    args = parser.parse_args()
    missing = cuda_available()
    if missing is not None:
        print(f"no GPU here: {missing}; nothing checked")
        return 0
    workdir = claim_workdir(Path(args.workdir))
    lines: list[str] = []
    try:
        checkpoint = tiny_checkpoint(workdir / "checkpoint")
        for name, flags in QUANTIZE_ROUTES.items():
            try:
                lines.append(check_quantized(checkpoint, workdir, name, flags))
            except Exception as exc:  # one route's failure is its verdict, not the run's end
                lines.append(f"FAIL quantize {name}: {type(exc).__name__}: {exc}")
            print(lines[-1], flush=True)
        try:
            window_lines = check_state_window(workdir)
        except Exception as exc:  # as above: the route's verdict
            window_lines = [f"FAIL state_window: {type(exc).__name__}: {exc}"]
        for line in window_lines:
            lines.append(line)
            print(line, flush=True)
    finally:
        release_workdir(workdir)
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
