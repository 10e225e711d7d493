"""How many tokens to draft each speculative round (adaptive K, docs/speculative.md).

A round with K drafts costs one verifying decoder call over K + 1 positions and K head calls,
and emits 1 + (accepted drafts) tokens. With drafts that are right with probability a each
(the chain stops at the first wrong one) a round emits on average

    E(K) = 1 + a + a^2 + ... + a^K = (1 - a^(K+1)) / (1 - a)

tokens, so its rate relative to plain decoding (one decoder call per token) is

    rate(K) = E(K) * D(1) / (D(K + 1) + K * H)

with D(n) the seconds of a decoder call over n positions and H those of a head call. The
controller estimates `a` from the rounds (each draft a success until the first rejection,
which is one failure; past rounds weigh `memory` times less per round; `prior` pseudo-counts)
and D and H from the measured call times (the median of the latest five calls of each size),
and picks the K in 0..k_max with the best estimated rate. K = 0 is plain decoding (rate 1).
Plain steps come first until D(1) is measured, then rounds drafting k_max until H and a
verifying call are (the first call of each size is left out: onnxruntime's first run at a
new shape is slow); a call size not yet measured is interpolated between measured ones.
While at K = 0 nothing is learned about
the head, so after `probe` plain steps one round drafts a single token; each probe that is
rejected doubles the wait (up to `max_probe`), one that is accepted resets it.
The choice changes only how many tokens a round verifies, never which tokens are emitted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LATEST = 5  # call times kept per call size


@dataclass
class DraftController:
    """Adaptive K in 0..k_max. Feed it `rounds` (drafts made, drafts accepted) and call times;
    ask `next_k` before each round."""

    k_max: int
    memory: float = 0.8  # weight of the previous rounds' evidence, per round
    prior: tuple[float, float] = (0.25, 0.25)  # pseudo-counts of accepted / rejected drafts
    probe: int = 8  # plain steps before the first probe
    max_probe: int = 256
    accepted: float = 0.0
    rejected: float = 0.0
    decoder_seconds: dict[int, float] = field(default_factory=dict)  # D(n), by positions n
    head_seconds: float | None = None  # H
    samples: dict[int | str, list[float]] = field(default_factory=dict)  # the latest calls
    plain_steps: int = 0  # since the last round that drafted
    wait: int = 0  # plain steps before the next probe
    chosen: dict[int, int] = field(default_factory=dict)  # K -> rounds run with it

    def __post_init__(self) -> None:
        self.wait = self.probe

    @property
    def acceptance(self) -> float:
        """The estimated probability that a draft is right (given the previous ones were)."""
        good, bad = self.prior
        return (self.accepted + good) / (self.accepted + self.rejected + good + bad)

    def observe_round(self, drafted: int, accepted: int) -> None:
        """A round that drafted `drafted` tokens, of which the first `accepted` were right."""
        if drafted == 0:
            self.plain_steps += 1
            return
        self.accepted = self.memory * self.accepted + accepted
        self.rejected = self.memory * self.rejected + (1 if accepted < drafted else 0)
        if self.plain_steps:  # this round was a probe
            self.wait = self.probe if accepted else min(2 * self.wait, self.max_probe)
        self.plain_steps = 0

    def observe_decoder(self, positions: int, seconds: float) -> None:
        """A decoder call over `positions` positions (prefill excluded)."""
        estimate = self._latest(positions, seconds)
        if estimate is not None:
            self.decoder_seconds[positions] = estimate

    def observe_head(self, seconds: float) -> None:
        """One head call (a draft)."""
        self.head_seconds = self._latest("head", seconds)

    def _latest(self, key: int | str, seconds: float) -> float | None:
        """The median of the latest LATEST calls of one kind, the first one left out
        (onnxruntime's first run at a new shape can take ten times longer); None until a
        call was kept. A one-off stall (another process) does not decide K for long."""
        if key not in self.samples:
            self.samples[key] = []  # the warm-up call
            return None
        kept = self.samples[key]
        kept.append(seconds)
        del kept[:-LATEST]
        return statistics.median(kept)

    def rate(self, k: int) -> float:
        """The estimated tokens per second of rounds drafting k, relative to plain decoding."""
        if k == 0:
            return 1.0
        a = self.acceptance
        emitted = float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
        plain = self._decoder(1)
        cost = self._decoder(k + 1) + k * (self.head_seconds or 0.0)
        return emitted * plain / cost if cost > 0 else float(k + 1)

    def next_k(self) -> int:
        """K for the next round: the best estimated rate, or a one-draft probe after a run
        of plain steps. Plain steps until D(1) is measured, then k_max until the head and a
        verifying call are."""
        if 1 not in self.decoder_seconds:
            k = 0
        elif self.head_seconds is None or len(self.decoder_seconds) < 2:
            k = self.k_max
        else:
            k = max(range(self.k_max + 1), key=lambda c: (self.rate(c), -c))
            if k == 0 and self.plain_steps >= self.wait:
                k = 1
        self.chosen[k] = self.chosen.get(k, 0) + 1
        return k

    def _decoder(self, positions: int) -> float:
        """D(positions): measured, else interpolated linearly between the nearest measured
        call sizes on either side (the nearest one's time beyond them)."""
        known = self.decoder_seconds
        if positions in known:
            return known[positions]
        below = max((n for n in known if n < positions), default=None)
        above = min((n for n in known if n > positions), default=None)
        if below is None or above is None:
            return known[above if below is None else below]
        share = (positions - below) / (above - below)
        return known[below] + share * (known[above] - known[below])
