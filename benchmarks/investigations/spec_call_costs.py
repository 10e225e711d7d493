r"""The calls speculative decoding is made of, timed per package: the decoder's prefill, its
one-position step, a verifying call over 4 positions and cutting it back to 2 (a rejected
draft: DecoderSession.keep_prefix), and the head's catch-up over the
prompt, its one-position draft call (both `logits_to_keep` 1, as run/speculative.py asks), and
its calls over 1 to 4 positions after the prompt (what one more position costs a call: a
chain of distinct depths re-runs each depth's accepted speculative entries in its next
catch-up call, run/mtp_depths.py).
Used to price a graph change by building the same source at two commits
(docs/speculative.md: the int8 experts row by row; the head's MoE on kept positions only).

Each package runs in a fresh process per round, the packages alternating from round to round;
each process reports medians of its repeats and its peak RSS, each round the 1-minute load.

A package without a head (no mtp.onnx) gets the decoder's figures only: an int8 package
with a head runs its experts row by row in a Loop, one without has no Loop.

Usage (packages with a head, e.g. bench_speculative.py's, built at two commits):
    python benchmarks/investigations/spec_call_costs.py --packages OLD,NEW --rounds 3 \
        --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.alternating import alternating_rounds, write_rounds

PROMPT = 32
VERIFY = 4


def median_ms(call: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e3, 3)


def measure(package: Path, threads: int, repeats: int) -> dict[str, Any]:
    """One process's figures for `package` (module doc)."""
    from mobius_lite.bench.package_peer import session_options
    from mobius_lite.io_contract import HIDDEN_STATES, LOGITS
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.mtp_head import open_head

    decoder = DecoderSession(package / "model.onnx", session_options=session_options(threads))
    ids = np.random.default_rng(10).integers(3, decoder.vocab_size, size=(1, PROMPT))
    ids = ids.astype(np.int64)

    def prefill() -> dict[str, np.ndarray]:
        decoder.reset(1)
        return decoder.step(ids, logits_to_keep=1)

    out = prefill()
    token = out[LOGITS][:, -1].argmax(-1)[:, None]
    state = dict(decoder.past), decoder.mask

    def from_prompt(fed: np.ndarray) -> None:
        decoder.past, decoder.mask = dict(state[0]), state[1]
        decoder.step(fed, logits_to_keep=fed.shape[1])

    def cut_back_ms() -> float | None:
        """Median time of cutting a 4-position verifying call back to its first 2 positions
        (DecoderSession.keep_prefix: the Mamba states' rewind, the caches cut); None when the
        decoder cannot (no speculation windows)."""
        times = []
        for _ in range(repeats * 4):
            decoder.past, decoder.mask = dict(state[0]), state[1]
            fed = np.repeat(token, VERIFY, 1)
            out = decoder.step(fed, logits_to_keep=VERIFY)
            start = time.perf_counter()
            if not decoder.keep_prefix(out, VERIFY, 2):
                return None
            times.append(time.perf_counter() - start)
        return round(statistics.median(times) * 1e3, 3)

    decoder_figures = {
        "prefill_ms": median_ms(prefill, repeats),
        "step_ms": median_ms(lambda: from_prompt(token), repeats * 4),
        "verify_4_ms": median_ms(lambda: from_prompt(np.repeat(token, VERIFY, 1)), repeats * 4),
        "cut_back_4_to_2_ms": cut_back_ms(),
    }
    if not (package / "mtp.onnx").is_file():  # a package without a head: the decoder's calls
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        return {**decoder_figures, "peak_rss_mib": rss}
    head = open_head(package, session_options=session_options(threads))
    head_input = np.concatenate([ids[:, 1:], token], axis=1)

    def catch_up() -> tuple[np.ndarray, np.ndarray]:
        head.reset(1)
        return head.step(head_input, out[HIDDEN_STATES], np.ones_like(ids), logits_to_keep=1)

    logits, hidden = catch_up()
    draft = logits[:, -1:].argmax(-1)
    after_catch_up = head.past, head.mask

    def draft_call() -> None:
        head.past, head.mask = after_catch_up
        head.step(draft, hidden[:, -1:], np.ones((1, 1), np.int64), logits_to_keep=1)

    def head_call(positions: int) -> None:
        """A call over a few positions after the prompt, as a round's first draft (or a
        depth's catch-up in a chain of distinct depths) makes it."""
        head.past, head.mask = after_catch_up
        fed = np.repeat(draft, positions, 1)
        head.step(fed, np.repeat(hidden[:, -1:], positions, 1), np.ones_like(fed), logits_to_keep=1)

    return {
        **decoder_figures,
        "head_catch_up_ms": median_ms(catch_up, repeats * 4),
        "head_draft_ms": median_ms(draft_call, repeats * 4),
        "head_call_ms_by_positions": {
            n: median_ms(lambda n=n: head_call(n), repeats * 4) for n in (1, 2, 3, 4)
        },
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", help="comma-separated package directories")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.threads, args.repeats)))
        return
    if not args.packages:
        parser.error("--packages is required")
    children = {
        package: [sys.executable, __file__, "--child", package, "--threads", str(args.threads),
                  "--repeats", str(args.repeats)]
        for package in args.packages.split(",")
    }  # fmt: skip
    rounds = alternating_rounds(children, args.rounds)
    write_rounds("benchmarks/investigations/spec_call_costs.py", rounds, args.json)


if __name__ == "__main__":
    main()
