r"""How the decoder and its draft head share the cores, timed per setup:
a decoder step right after a head call and the head's one-position call right after a
decoder step, as speculative rounds alternate them; and whole calls on the mid model's
32-token prompt with 48 new tokens: plain greedy decoding, and speculative_greedy with a
scripted drafter right 85% of the time at K = 3 (bench_speculative.py's; no head call
costs anything there, so it prices the decoder's calls). Setups:

  own      each session on an intra-op pool of its own whose threads do not spin between
           calls (run/ort_session.without_spinning: the Python API's default);
  shared   both on onnxruntime's one shared pool for the process, whose threads may spin
           between calls (run/ort_session.on_shared_pool: `mobius generate` as a command);
  alone    the decoder alone on a spinning pool of its own, no head: plain decoding in the
           Python API's default (plain greedy only);
  alone-shared  the decoder alone on the shared pool: plain `mobius generate` as a command
           (plain greedy only).

Each setup runs in a fresh process (the shared pool is process-wide), the setups alternating
from round to round; each process reports medians, each round the 1-minute load.

Usage (a package with a head, e.g. bench_speculative.py's):
    python benchmarks/investigations/spec_threading.py --packages PKG1,PKG2 --rounds 3 \
        --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.alternating import alternating_rounds, write_rounds

SETUPS = ("own", "shared", "alone", "alone-shared")
CALLS = 30  # alternated head and decoder calls per process
WHOLE = 3  # whole generations of each kind per process
NEW_TOKENS = 48


def measure(package: Path, setup: str, threads: int) -> dict[str, float]:
    """One process's medians (ms) for `setup` (module doc)."""
    from mobius_lite.bench.package_peer import session_options
    from mobius_lite.io_contract import HIDDEN_STATES
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.ort_session import on_shared_pool, without_spinning

    own = session_options(threads)
    shared = setup in ("shared", "alone-shared")
    options = {
        "own": without_spinning(own),
        "shared": on_shared_pool(session_options(threads)) if shared else None,
        "alone": own,
        "alone-shared": on_shared_pool(session_options(threads)) if shared else None,
    }
    decoder = DecoderSession(package / "model.onnx", session_options=options[setup])
    rng = np.random.default_rng(0)
    ids = rng.integers(3, decoder.vocab_size, (1, 32)).astype(np.int64)
    decoder.reset(1)
    out = decoder.step(ids, logits_to_keep=1)
    head = None
    if not setup.startswith("alone"):
        head_options = (
            on_shared_pool(session_options(threads)) if shared else session_options(threads)
        )
        head = open_head(package, session_options=head_options)  # own: without spinning
        head.reset(1)
        shifted = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)
        head.step(shifted, out[HIDDEN_STATES], np.ones_like(ids), logits_to_keep=1)
    hidden = out[HIDDEN_STATES][:, -1:]
    steps, drafts = [], []
    for _ in range(CALLS + 2):
        token = rng.integers(3, decoder.vocab_size, (1, 1)).astype(np.int64)
        if head is not None:
            start = time.perf_counter()
            head.step(token, hidden, np.ones((1, 1), np.int64), logits_to_keep=1)
            drafts.append(time.perf_counter() - start)
            head.truncate(head.length - 1)
        start = time.perf_counter()
        decoder.step(token, logits_to_keep=1)
        steps.append(time.perf_counter() - start)
    figures = {"decoder_step_ms": round(statistics.median(steps[2:]) * 1e3, 3)}
    if drafts:
        figures["head_call_ms"] = round(statistics.median(drafts[2:]) * 1e3, 3)
    return {**figures, **whole_calls(decoder, ids, not setup.startswith("alone"))}


def whole_calls(decoder: Any, ids: np.ndarray, speculative: bool) -> dict[str, float]:
    """Medians (ms) of WHOLE repeats of plain greedy decoding and, when `speculative`, of
    speculative_greedy with the scripted drafter (module doc)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_speculative import scripted

    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.speculative import speculative_greedy

    plain = greedy(decoder, ids, NEW_TOKENS).tokens  # warm-up and the continuation
    known = np.array([[*ids[0], *plain]])
    calls = {"plain_greedy_ms": lambda: greedy(decoder, ids, NEW_TOKENS)}
    if speculative:
        calls["speculative_p085_k3_ms"] = lambda: speculative_greedy(
            decoder, scripted(known, decoder.vocab_size, 0.85, 7), ids, NEW_TOKENS, 3,
            adaptive=False,
        )  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(WHOLE):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(t) * 1e3, 1) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packages", help="comma-separated package directories")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path(args.child[0]), args.child[1], args.threads)))
        return
    if not args.packages:
        parser.error("--packages is required")
    children = {
        f"{package} {setup}": [sys.executable, __file__, "--child", package, setup,
                               "--threads", str(args.threads)]
        for package in args.packages.split(",")
        for setup in SETUPS
    }  # fmt: skip
    rounds = alternating_rounds(children, args.rounds)
    write_rounds("benchmarks/investigations/spec_threading.py", rounds, args.json)


if __name__ == "__main__":
    main()
