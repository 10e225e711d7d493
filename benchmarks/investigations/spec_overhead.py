r"""Where a speculative generation's time goes when its drafter is always wrong: the decoder's
calls, the head's calls and the rest (the runtime's bookkeeping), next to plain greedy
decoding, on one package with a head (docs/speculative.md, "Benchmark").

Three modes alternate in one process for --rounds rounds, each a whole 48-token generation
after a 32-token prompt, with the decoder and the head on the process's shared pool (as
`mobius generate` runs them): plain greedy; adaptive speculation with a free scripted
drafter that is always wrong (`scripted`); and the same with the package's own head run for
its real cost on every call (`head-cost`, bench_speculative.py's CostedScript). Each
session's `run` is timed; the report gives per mode the median total, decoder and head
seconds, and the 1-minute load before and after.

Usage:
    python benchmarks/investigations/spec_overhead.py PACKAGE --rounds 8 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_speculative
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from bench_speculative import CostedScript, scripted  # noqa: E402

from mobius_lite.bench.package_peer import session_options  # noqa: E402

PROMPT, NEW = 32, 48
MODES = ("plain", "scripted", "head-cost")


class Timed:
    """Wraps a session's `run`, adding up its seconds."""

    def __init__(self, session: Any) -> None:
        self.run, self.seconds = session.run, 0.0
        session.run = self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.run(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.package / "mtp.onnx").is_file():
        parser.error(f"{args.package} has no mtp.onnx: build it from a checkpoint with a head")

    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.ort_session import on_shared_pool
    from mobius_lite.run.speculative import speculative_greedy

    load_before = os.getloadavg()
    options = on_shared_pool(session_options(args.threads))
    decoder = DecoderSession(args.package / "model.onnx", session_options=options)
    head = open_head(args.package, session_options=options)
    ids = np.random.default_rng(10).integers(3, decoder.vocab_size, size=(1, PROMPT))
    ids = ids.astype(np.int64)
    plain = greedy(decoder, ids, NEW).tokens  # warm-up and the reference
    speculative_greedy(decoder, head, ids, 8, 4, adaptive=False)  # the head's warm-up
    known = np.array([[*ids[0], *plain]])
    decoder_time, head_time = Timed(decoder.session), Timed(head.session)
    samples: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            decoder_time.seconds = head_time.seconds = 0.0
            drafter = None if mode == "plain" else scripted(known, decoder.vocab_size, 0.0, 7)
            if mode == "head-cost":
                drafter = CostedScript(head, drafter)
            start = time.perf_counter()
            if drafter is None:
                tokens = greedy(decoder, ids, NEW).tokens
            else:
                tokens = speculative_greedy(decoder, drafter, ids, NEW, 4)[0][0]
            total = time.perf_counter() - start
            if tokens != plain:
                raise SystemExit(f"{mode}: tokens differ from plain greedy decoding's")
            samples[mode].append((total, decoder_time.seconds, head_time.seconds))
    base = statistics.median(s[0] for s in samples["plain"])
    report = {
        "command": " ".join(sys.argv),
        "package": str(args.package),
        "rounds": args.rounds,
        "modes": {
            mode: {
                "total_s": round(statistics.median(s[0] for s in rows), 4),
                "decoder_s": round(statistics.median(s[1] for s in rows), 4),
                "head_s": round(statistics.median(s[2] for s in rows), 4),
                "vs_plain": round(base / statistics.median(s[0] for s in rows), 3),
            }
            for mode, rows in samples.items()
        },
        "load_average_before_after": [list(load_before), list(os.getloadavg())],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
