r"""Adaptive K: the library's DraftController against a variant policy, on the same packages,
alternating rounds (docs/speculative.md, "Adaptive K").

Variants (--variant). The "climb": a round verifies at most one position more than the
largest decoder call measured so far, so no round rests on a verifying cost extrapolated
further than one position. It was meant to stop a costly head from being drafted at larger K
on extrapolated costs (the int8 package's head-cost p = 0.85 mode). It is not in the library:
this run measured it losing more on good drafters than it saved there. The "margin": draft
only when the best estimated rate beats plain steps by 5%. The "priced-cut": a round of k
drafts also pays (1 - a^k) R, R the measured cut back after a rejected draft (about 1 ms on
the mid model's rewind); not kept either.

Per package (bench_speculative.py's mid packages, built in --workdir when missing) and mode
(scripted drafters p = 0 .. 1, the package's own head, head-cost p = 0.85), each round times
plain greedy and both policies' speculative_greedy (K up to 4, 32-token prompt, 48 new
tokens), the policies' order alternating; the figures are medians of speed over plain.

Usage:
    python benchmarks/investigations/adaptive_policy_ab.py --workdir /tmp/policy_ab \
        --packages f32,q8_0-int8 --rounds 4 --variant climb --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_speculative
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
import bench_speculative as bench  # noqa: E402

from mobius_lite.bench.package_peer import session_options  # noqa: E402
from mobius_lite.run.decoder_session import DecoderSession  # noqa: E402
from mobius_lite.run.draft_control import DraftController  # noqa: E402
from mobius_lite.run.greedy import greedy  # noqa: E402
from mobius_lite.run.mtp_head import open_head  # noqa: E402
from mobius_lite.run.ort_session import without_spinning  # noqa: E402
from mobius_lite.run.speculative import speculative_greedy  # noqa: E402

K_MAX = 4


class Climb(DraftController):
    """The variant: K at most the largest decoder call size measured so far."""

    def _best_k(self) -> int:
        reach = min(self.k_max, max(self.decoder_seconds, default=0))
        return max(range(reach + 1), key=lambda c: (self.rate(c), -c))


class Margin(DraftController):
    """The variant: draft only when the best estimated rate beats plain steps by 5%, so an
    acceptance estimate that a run of right drafts lifted does not start rounds that lose."""

    def _best_k(self) -> int:
        best = super()._best_k()
        return best if self.rate(best) > 1.05 else 0


class PricedCut(DraftController):
    """The variant: a round of k drafts also pays (1 - a^k) R, R the measured time of cutting
    the decoder back after a rejected draft (DecoderSession.keep_prefix, timed by
    run_package), which the library's rate leaves out."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cut_seconds = 0.0

    def observe_cut(self, seconds: float) -> None:
        self.cut_seconds = self._latest("cut", seconds)

    def rate(self, k: int) -> float:
        if k == 0:
            return 1.0
        a = self.acceptance
        emitted = float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
        drafting = k * (self.head_seconds or 0.0)
        cost = self._decoder(k + 1) + drafting + (1.0 - a**k) * self.cut_seconds
        return emitted * self._decoder(1) / cost


VARIANTS: dict[str, type[DraftController]] = {
    "climb": Climb,
    "margin": Margin,
    "priced-cut": PricedCut,
}


def drafters(package: Path, known: np.ndarray, vocab: int) -> dict[str, Callable[[], Any]]:
    """mode -> a fresh drafter (bench_speculative's scripted drafters and heads)."""
    out: dict[str, Callable[[], Any]] = {
        f"scripted p={p}": (lambda p=p: bench.scripted(known, vocab, p, 7))
        for p in (0.0, 0.5, 0.7, 0.85, 1.0)
    }
    out["head"] = lambda: open_head(package, session_options=session_options(2))
    out["head-cost p=0.85"] = lambda: bench.CostedScript(
        open_head(package, session_options=session_options(2)),
        bench.scripted(known, vocab, 0.85, 7),
    )
    return out


def run_package(
    package: Path, rounds: int, threads: int, variant: str
) -> dict[str, dict[str, float]]:
    options = without_spinning(session_options(threads))
    decoder = DecoderSession(package / "model.onnx", session_options=options)
    current: list[DraftController] = []  # the controller of the generation running
    keep_prefix = decoder.keep_prefix

    def timed_keep_prefix(out: dict[str, np.ndarray], fed: int, kept: int) -> bool:
        """keep_prefix, its time told to a controller that prices it (PricedCut)."""
        start = time.perf_counter()
        done = keep_prefix(out, fed, kept)
        if done and isinstance(current[-1], PricedCut):
            current[-1].observe_cut(time.perf_counter() - start)
        return done

    decoder.keep_prefix = timed_keep_prefix
    ids = np.random.default_rng(10).integers(3, decoder.vocab_size, size=(1, 32)).astype(np.int64)
    plain_tokens = greedy(decoder, ids, 48).tokens  # warm-up and the reference
    known = np.array([[*ids[0], *plain_tokens]])
    modes = list(drafters(package, known, decoder.vocab_size).items())
    ratios: dict[str, dict[str, list[float]]] = {}
    for r in range(rounds):
        for mode, make in modes[r % len(modes) :] + modes[: r % len(modes)]:
            start = time.perf_counter()
            greedy(decoder, ids, 48)
            plain = time.perf_counter() - start
            policies = [("library", DraftController), (variant, VARIANTS[variant])]
            for name, policy in policies if r % 2 == 0 else policies[::-1]:
                drafter = make()
                current.append(policy(K_MAX))
                start = time.perf_counter()
                tokens, _ = speculative_greedy(
                    decoder, drafter, ids, 48, K_MAX, adaptive=True, controller=current[-1]
                )
                seconds = time.perf_counter() - start
                if tokens[0] != plain_tokens:
                    raise AssertionError(f"{mode} under {name}: other tokens than plain greedy")
                ratios.setdefault(mode, {}).setdefault(name, []).append(plain / seconds)
    return {
        mode: {name: round(statistics.median(v), 3) for name, v in by_policy.items()}
        for mode, by_policy in ratios.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--packages", default="f32,q8_0-int8")
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="climb")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = args.packages.split(",")
    missing = [n for n in names if not (args.workdir / n).exists()]
    if missing:
        args.workdir.mkdir(parents=True, exist_ok=True)
        bench.build_packages(argparse.Namespace(workdir=args.workdir, size="mid", packages=missing))
    report: dict[str, Any] = {"command": " ".join(sys.argv), "load_before": os.getloadavg()}
    for name in names:
        report[name] = run_package(args.workdir / name, args.rounds, args.threads, args.variant)
        print(name, json.dumps(report[name]), flush=True)
    report["load_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
