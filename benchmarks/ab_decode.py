"""Two packages' decode side by side in one process, step by step (A, B, A, B, ...), so both
see the same load on a shared machine: each package's fastest and median decode step, their
greedy tokens, and how far B's prefill logits are from A's (NRMSE, max difference).

For comparing a change on a machine that other work shares, where two separate runs are not
comparable. Usage:
    python benchmarks/ab_decode.py PACKAGE_A PACKAGE_B --steps 48 --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import open_package, session_options  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", type=Path, nargs=2)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=128)
    args = parser.parse_args()
    from mobius_lite.evaluation.metrics import compare

    prompt = np.random.default_rng(0).integers(3, 400, size=(1, args.prompt_length))
    sessions = [open_package(p, session_options(args.threads))[0] for p in args.packages]
    first = [s.step(prompt)["logits"] for s in sessions]
    tokens = [[int(f[0, -1].argmax())] for f in first]
    seconds: list[list[float]] = [[], []]
    for _ in range(args.steps):
        for i, session in enumerate(sessions):
            start = time.perf_counter()
            logits = session.step(np.array([[tokens[i][-1]]]))["logits"]
            seconds[i].append(time.perf_counter() - start)
            tokens[i].append(int(logits[0, -1].argmax()))
    for path, times, toks in zip(args.packages, seconds, tokens, strict=True):
        kept = times[2:]  # the first steps' allocations stay out
        print(
            f"{path.name}: decode fastest {1000 * min(kept):.2f} ms, median "
            f"{1000 * statistics.median(kept):.2f} ms; tokens {toks[:8]}"
        )
    result = compare("prefill logits B vs A", first[1][0, -1], first[0][0, -1])
    print(f"prefill logits: NRMSE {result.nrmse:.2e}, max |B - A| {result.max_abs:.2e}")
    print(f"greedy tokens equal: {tokens[0] == tokens[1]}")


if __name__ == "__main__":
    main()
