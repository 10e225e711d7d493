"""GPU checks that need onnxruntime's CUDA provider (none of them can run on the CPU).

The one check today: the speculation windows from onnxruntime's `state_window` attribute
(build(..., ep="cuda", weights_backend="ort", state_window_kernel=True), docs/speculative.md).
On a tiny random checkpoint with an MTP head it builds the kernel route and the scan route
(standard ops, the default), then on CUDA:
  1. a prompt, then one 5-position call: every present_window.* slot of the kernel route
     against the scan route's, and both presents (FP32 gates);
  2. speculative greedy decoding at K = 4 with a scripted drafter wrong at every fifth
     position, batch 1 and 2: tokens identical to plain greedy decoding, every draft rejection
     cut back from the windows (no re-run), and the final states plain decoding's (FP32 gates).
Prints one JSON report; exit status 0 when every check passes, 1 when one fails, and 0 with a
"no GPU" line when this onnxruntime has no CUDAExecutionProvider.

Usage:
    python benchmarks/gpu_check.py --workdir /tmp/gpu_check
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bench_common import claim_workdir, release_workdir  # noqa: E402

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
NEW_TOKENS = 32


def gates(name: str, actual: np.ndarray, expected: np.ndarray) -> dict[str, Any]:
    from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare

    c = compare(name, actual, expected)
    return {"name": name, "nrmse": c.nrmse, "passes": c.passes(FP32_NRMSE, FP32_COSINE)}


def window_slots(packages: dict[str, Path]) -> list[dict[str, Any]]:
    """Check 1: the kernel route's windows and presents against the scan route's."""
    from mobius_lite.runtime import DecoderSession

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
    from mobius_lite.runtime import DecoderSession
    from mobius_lite.speculative import speculative_greedy
    from speculative_fixtures import ScriptedHead, plain_greedy

    results = []
    for batch in (1, 2):
        decoder = DecoderSession(package / "model.onnx", CUDA)
        ids = np.random.default_rng(batch).integers(3, 80, size=(batch, 9)).astype(np.int64)
        mask = np.ones_like(ids)
        plain, _ = plain_greedy(decoder, ids, mask, NEW_TOKENS)
        state = dict(decoder.past)
        known = np.concatenate([ids, plain], axis=1)
        head = ScriptedHead(known, decoder.vocab_size, lambda row, t: (7 * t + row) % 5 == 0)
        tokens, stats = speculative_greedy(
            decoder, head, ids, NEW_TOKENS, 4, attention_mask=mask, adaptive=False
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu_check"))
    args = parser.parse_args()

    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        print("no GPU: this onnxruntime has no CUDAExecutionProvider; nothing was checked")
        return 0
    import mobius_lite
    from mtp_fixtures import write_nemotron_h_mtp_checkpoint

    claim_workdir(args.workdir)
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(args.workdir / "checkpoint")
    packages = {
        route: mobius_lite.build(
            checkpoint, ep="cuda", weights_backend="ort", state_window_kernel=route == "kernel"
        ).save(args.workdir / route, quiet=True)
        for route in ("scan", "kernel")
    }
    report = {
        "state_window_slots": window_slots(packages),
        "state_window_speculation": speculation(packages["kernel"]),
    }
    ok = all(r["passes"] for part in report.values() for r in part)
    report["passes"] = ok
    print(json.dumps(report, indent=2, default=float))
    release_workdir(args.workdir)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
