"""Load each peer once, then time them all in alternating rounds: the order rotates every
round, every round is kept with the machine's load, and the medians are what is reported."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mobius_lite.bench.measure import PackageSide, Peer, PeerRun, Timed, load_1min, rss_bytes
from mobius_lite.errors import ConfigError

PROMPT_SEED = 0


@dataclass(frozen=True)
class BenchSettings:
    """What every peer runs: a synthetic prompt of `prompt_tokens` ids, `decode_tokens` greedy
    calls after the prefill, `rounds` timed passes each."""

    prompt_tokens: int
    decode_tokens: int
    rounds: int
    threads: int
    ep: str

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "decode_tokens", "rounds", "threads"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be 1 or more, found {getattr(self, name)}")


@dataclass
class PeerFacts:
    """A peer's one-off figures: what it is, its load seconds, its resident-set growth over the
    load and one warm-up pass, and the tokens of that pass."""

    name: str
    description: str
    load_s: float
    rss_growth_bytes: int
    tokens: list[int]


@dataclass
class BenchResult:
    """Everything one `mobius bench` run measured."""

    settings: BenchSettings
    prompt: list[int]
    peers: list[PeerFacts]
    runs: list[PeerRun] = field(default_factory=list)

    def runs_of(self, peer: str) -> list[Timed]:
        return [run.timed for run in self.runs if run.peer == peer]

    def medians(self, peer: str) -> dict[str, float]:
        """The peer's medians over its rounds: prefill ms, decode ms/token (each round's median
        decode call), tokens/s, and each encoder's ms."""
        runs = self.runs_of(peer)
        ms = statistics.median(run.ms_per_token for run in runs)
        out = {
            "prefill_ms": statistics.median(run.prefill_s for run in runs) * 1e3,
            "decode_ms_per_token": ms,
            "tokens_per_s": 1e3 / ms if ms > 0 else float("inf"),
        }
        for name in runs[0].encoders_s:
            out[f"{name}_ms"] = statistics.median(run.encoders_s[name] for run in runs) * 1e3
        return out

    def ratios(self) -> dict[str, dict[str, float]]:
        """Each other peer's median time over the package's (prefill and decode): above 1, the
        package is that many times faster."""
        ours = self.medians(self.peers[0].name)
        out = {}
        for peer in self.peers[1:]:
            theirs = self.medians(peer.name)
            out[peer.name] = {
                key: theirs[key] / ours[key] for key in ("prefill_ms", "decode_ms_per_token")
            }
        return out


def synthetic_prompt(vocab_size: int | None, length: int) -> list[int]:
    """`length` token ids drawn with a fixed seed from the vocabulary (speed does not depend on
    which ids; the same ids go to every peer)."""
    high = vocab_size if vocab_size else 256
    rng = np.random.default_rng(PROMPT_SEED)
    return [int(t) for t in rng.integers(0, high, size=length)]


def run_bench(
    package: PackageSide,
    others: Sequence[Peer],
    settings: BenchSettings,
    progress: bool = True,
) -> BenchResult:
    """Open the package peer (its vocabulary sets the prompt), then each other peer, each
    followed by one warm-up pass; then `settings.rounds` rounds over all peers in rotating
    order. A tqdm bar on stderr counts model calls."""
    from tqdm import tqdm

    peers = [package, *others]
    total = sum(peer.calls_per_pass for peer in peers) * (settings.rounds + 1)
    bar = tqdm(total=total, unit="call", file=sys.stderr, disable=not progress, leave=False)
    with bar:
        facts: list[PeerFacts] = []
        prompt: list[int] = []
        for peer in peers:
            bar.set_description(f"load {peer.name}")
            before = rss_bytes()
            start = time.perf_counter()
            peer.open()
            load_s = time.perf_counter() - start
            if peer is package:
                prompt = synthetic_prompt(package.vocab_size(), settings.prompt_tokens)
            bar.set_description(f"warm-up {peer.name}")
            warm = peer.run(prompt, settings.decode_tokens, bar.update)
            growth = rss_bytes() - before
            facts.append(PeerFacts(peer.name, peer.description, load_s, growth, warm.tokens))
        result = BenchResult(settings, prompt, facts)
        for round_ in range(settings.rounds):
            shift = round_ % len(peers)
            for peer in peers[shift:] + peers[:shift]:
                bar.set_description(f"round {round_ + 1}/{settings.rounds} {peer.name}")
                load = load_1min()
                timed = peer.run(prompt, settings.decode_tokens, bar.update)
                result.runs.append(PeerRun(peer.name, round_, load, timed))
    return result
