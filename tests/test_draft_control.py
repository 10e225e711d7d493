"""The adaptive-K controller (draft_control.py) on synthetic rounds and call costs: its rate
estimate against the expected-tokens formula written out here, and the K it picks for
drafters that are always wrong, always right, or costly; then end to end, where K changes
between rounds and the tokens and states must still be plain greedy decoding's."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_lite.run.draft_control import DraftController


def expected_rate(a: float, k: int, d1: float, dk: float, h: float) -> float:
    """Tokens per second of rounds drafting k, relative to plain decoding: the drafts form
    a chain that stops at the first wrong one, so sum_{i=0..k} a^i tokens a round."""
    return sum(a**i for i in range(k + 1)) * d1 / (dk + k * h)


def run_rounds(control: DraftController, right, rounds: int, d: dict, h: float) -> list[int]:
    """Drive `control` for `rounds` rounds whose drafts are right while right(i) holds (i:
    the draft's index in its round); returns each round's K."""
    chosen = []
    for _ in range(rounds):
        k = control.next_k()
        chosen.append(k)
        accepted = 0
        while accepted < k and right(accepted):
            accepted += 1
        control.observe_decoder(k + 1, d.get(k + 1, d[max(d)]))
        if k:
            control.observe_head(h)
        control.observe_round(k, accepted)
    return chosen


def test_rate_is_the_expected_tokens_over_the_round_cost() -> None:
    control = DraftController(4)
    control.accepted, control.rejected = 3.0, 1.0
    control.decoder_seconds = {1: 10.0, 2: 11.0, 5: 14.0}
    control.head_seconds = 2.0
    a = (3.0 + 0.25) / (4.0 + 0.5)
    assert control.acceptance == pytest.approx(a)
    assert control.rate(0) == 1.0
    assert control.rate(1) == pytest.approx(expected_rate(a, 1, 10.0, 11.0, 2.0))
    assert control.rate(4) == pytest.approx(expected_rate(a, 4, 10.0, 14.0, 2.0))
    # unmeasured sizes are interpolated: D(3) = 12, D(4) = 13
    assert control.rate(2) == pytest.approx(expected_rate(a, 2, 10.0, 12.0, 2.0))
    assert control.rate(3) == pytest.approx(expected_rate(a, 3, 10.0, 13.0, 2.0))


def test_first_plain_steps_then_k_max() -> None:
    """Each call size's first call is a warm-up, not a measurement: two plain steps measure
    D(1), two rounds at k_max the head and D(k_max + 1)."""
    control = DraftController(3)
    assert run_rounds(control, lambda i: True, 5, {1: 1.0, 4: 1.0}, 0.1) == [0, 0, 3, 3, 3]


def test_a_drafter_always_right_and_cheap_keeps_k_max() -> None:
    control = DraftController(4)
    chosen = run_rounds(control, lambda i: True, 40, {n: 1.0 + 0.02 * n for n in range(1, 6)}, 0.05)
    assert chosen[2:] == [4] * 38


def test_a_drafter_always_wrong_falls_to_plain_steps_and_probes_less_often() -> None:
    control = DraftController(4, probe=8, max_probe=64)
    d = {n: 1.0 + 0.1 * (n - 1) for n in range(1, 6)}
    chosen = run_rounds(control, lambda i: False, 400, d, 0.3)
    plain = chosen.count(0)
    assert plain > 0.9 * len(chosen)
    assert max(chosen[100:]) == 1  # after settling, only single-draft probes
    probes = [i for i, k in enumerate(chosen) if k and i >= 100]
    gaps = np.diff(probes)
    assert len(probes) >= 3 and gaps.min() >= 64  # the wait doubled to its cap


def test_a_costly_head_drafts_fewer() -> None:
    """At 60% acceptance a head that costs half a decoder step is best at K = 1 by the
    formula (K = 0..4: 1, 1.07, 0.98, ...), and a free one at K = 4."""
    control = DraftController(4)
    rates = [expected_rate(0.6, k, 1.0, 1.0, 0.5) for k in range(5)]
    assert int(np.argmax(rates)) == 1
    control.decoder_seconds = {n: 1.0 for n in range(1, 6)}
    control.head_seconds = 0.5
    control.accepted, control.rejected = 5.75, 3.75  # (5.75 + 0.25) / 10 = 0.6
    assert control.acceptance == pytest.approx(0.6)
    assert control.next_k() == 1
    control.head_seconds = 0.0
    assert control.next_k() == 4


def test_k_never_exceeds_k_max() -> None:
    control = DraftController(2)
    chosen = run_rounds(control, lambda i: i % 2 == 0, 50, {1: 1.0, 2: 1.0, 3: 1.0}, 0.01)
    assert set(chosen) <= {0, 1, 2}


def test_one_stalled_call_does_not_decide() -> None:
    """Call times are the median of the latest five of each size after its first: one
    stall among them is outvoted."""
    control = DraftController(4)
    control.observe_decoder(1, 80.0)  # the warm-up call at a new size: not kept
    assert 1 not in control.decoder_seconds
    for seconds in (50.0, 1.0, 1.1, 0.9):
        control.observe_decoder(1, seconds)
    assert control.decoder_seconds[1] == pytest.approx(1.05)
    for seconds in (2.0,) * 6:
        control.observe_decoder(1, seconds)
    assert control.decoder_seconds[1] == 2.0  # only the latest five count
