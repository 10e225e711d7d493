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
and D and H from the measured call times (the median of the latest five calls of each size;
a size's first call, often slow in onnxruntime, counts only until a second one is timed),
and picks the K in 0..k_max with the best estimated rate. K = 0 is plain decoding (rate 1).
A call size not yet measured is interpolated between measured ones, or extrapolated along the
line through the two largest (along `verify_slope` x D(1) per position while only D(1) is
known): an MoE decoder's verifying call reads more experts per position, so it is never
assumed free.

Learning about the head costs no decoder call: a plain step can be a probe, which drafts one
token and checks it against the step's own greedy choice. The first probe comes with the
second plain step (its head call catches the head up on the prompt, which is no draft's
cost, so it is not timed); later ones come after `probe` plain steps, each probe that
leaves drafting unpaid (a wrong one, or a right one from a head too costly at its
acceptance) doubling the wait (up to `max_probe`). A right probe before any head call over
one position was timed is followed at once by another, whose one-position call is timed:
only then can a rate be estimated. A bad or costly head therefore costs its probes' head
calls only (never a timing call, fewer and fewer probes), and a good one is drafted from as
soon as its estimated rate beats plain steps.
The choice changes only how many tokens a round verifies, never which tokens are emitted.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

LATEST = 5  # call times kept per call size


@dataclass(frozen=True)
class RoundPlan:
    """One round: `k` drafts to verify (0: a plain step), and whether a plain step also
    drafts one token as a probe, checked against the step's greedy choice."""

    k: int
    probe: bool = False


@dataclass
class DraftController:
    """Adaptive K in 0..k_max. Feed it rounds, probes and call times; ask `next_round`
    before each round."""

    k_max: int
    memory: float = 0.8  # weight of the previous rounds' evidence, per round
    prior: tuple[float, float] = (0.25, 0.25)  # pseudo-counts of accepted / rejected drafts
    probe: int = 8  # plain steps between probes
    max_probe: int = 256
    verify_slope: float = 0.25  # D(n) - D(n - 1) over D(1) before two sizes are measured
    accepted: float = 0.0
    rejected: float = 0.0
    decoder_seconds: dict[int, float] = field(default_factory=dict)  # D(n), by positions n
    head_seconds: float | None = None  # H
    samples: dict[int | str, list[float]] = field(default_factory=dict)  # the latest calls
    settled: set[int | str] = field(default_factory=set)  # sizes whose first call was dropped
    plain_steps: int = 0  # since the last round that drafted or probed
    wait: int = 0  # plain steps before the next probe
    probed: bool = False  # a probe was observed
    chosen: dict[int, int] = field(default_factory=dict)  # K -> rounds run with it

    def __post_init__(self) -> None:
        self.wait = self.probe

    @property
    def acceptance(self) -> float:
        """The estimated probability that a draft is right (given the previous ones were)."""
        good, bad = self.prior
        return (self.accepted + good) / (self.accepted + self.rejected + good + bad)

    def observe_round(self, drafted: int, accepted: int) -> None:
        """A round that drafted `drafted` tokens, of which the first `accepted` were right
        (a plain step: drafted 0)."""
        if drafted == 0:
            self.plain_steps += 1
            return
        self._learn(accepted, accepted < drafted)
        self.plain_steps = 0

    def observe_probe(self, right: bool) -> None:
        """A probe's draft was (or was not) the plain step's greedy choice. The wait before
        the next probe: none when a right head still needs timing; `probe` when drafting now
        pays; doubled otherwise, right or wrong (a head too costly to pay at its acceptance
        is not probed every `probe` steps for nothing)."""
        self._learn(int(right), not right)
        if right and self.head_seconds is None:
            self.wait = 0
        elif self.head_seconds is not None and self._best_k() > 0:
            self.wait = self.probe
        else:
            self.wait = min(max(2 * self.wait, self.probe), self.max_probe)
        self.plain_steps = 0
        self.probed = True

    def _learn(self, accepted: int, rejected: bool) -> None:
        self.accepted = self.memory * self.accepted + accepted
        self.rejected = self.memory * self.rejected + (1 if rejected else 0)

    def observe_decoder(self, positions: int, seconds: float) -> None:
        """A decoder call over `positions` positions (prefill excluded)."""
        self.decoder_seconds[positions] = self._latest(positions, seconds)

    def observe_head(self, seconds: float) -> None:
        """One head call over one position (a draft)."""
        self.head_seconds = self._latest("head", seconds)

    def _latest(self, key: int | str, seconds: float) -> float:
        """The median of the latest LATEST calls of one kind. A kind's first call (onnxruntime's
        first run at a new shape can take ten times longer) stands alone until the second
        replaces it; one later stall (another process) is outvoted."""
        kept = self.samples.setdefault(key, [])
        if kept and key not in self.settled:
            kept.clear()
            self.settled.add(key)
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

    def next_round(self) -> RoundPlan:
        """The next round: the K with the best estimated rate once D(1) and the head are
        measured (plain steps before), and a probe on a plain step when one is due."""
        if 1 not in self.decoder_seconds:
            plan = RoundPlan(0)
        elif self.head_seconds is None:  # no rate yet: probes only (module docstring)
            plan = RoundPlan(0, probe=not self.probed or self.plain_steps >= self.wait)
        else:
            k = self._best_k()
            plan = RoundPlan(k, probe=k == 0 and self.plain_steps >= self.wait)
        self.chosen[plan.k] = self.chosen.get(plan.k, 0) + 1
        return plan

    def _best_k(self) -> int:
        """The K in 0..k_max with the best estimated rate (the smaller on a tie)."""
        return max(range(self.k_max + 1), key=lambda c: (self.rate(c), -c))

    def _decoder(self, positions: int) -> float:
        """D(positions): measured; else interpolated linearly between the nearest measured
        call sizes on either side, or extrapolated beyond the largest (module docstring).
        D(1) is measured before any rate is asked (next_round)."""
        known = self.decoder_seconds
        if positions in known:
            return known[positions]
        below = max(n for n in known if n < positions)
        above = min((n for n in known if n > positions), default=None)
        if above is not None:
            share = (positions - below) / (above - below)
            return known[below] + share * (known[above] - known[below])
        sizes = sorted(known)
        if len(sizes) >= 2:
            low, high = sizes[-2], sizes[-1]
            slope = max(0.0, (known[high] - known[low]) / (high - low))
        else:
            slope = self.verify_slope * known[1]
        return known[below] + slope * (positions - below)
