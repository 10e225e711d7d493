"""The adaptive-K controller (draft_control.py) on synthetic rounds and call costs: its rate
estimate against the expected-tokens formula written out here, and the K it picks for
drafters that are always wrong, always right, or costly; then end to end, where K changes
between rounds and the tokens and states must still be plain greedy decoding's."""

from __future__ import annotations

import numpy as np
import pytest

from mobius_lite.run.draft_control import DraftController, RoundPlan


def expected_rate(a: float, k: int, d1: float, dk: float, h: float) -> float:
    """Tokens per second of rounds drafting k, relative to plain decoding: the drafts form
    a chain that stops at the first wrong one, so sum_{i=0..k} a^i tokens a round."""
    return sum(a**i for i in range(k + 1)) * d1 / (dk + k * h)


def run_rounds(control: DraftController, right, rounds: int, d: dict, h: float) -> list[int]:
    """Drive `control` for `rounds` rounds whose drafts are right while right(i) holds (i:
    the draft's index in its round; a probe's draft is index 0); returns each round's K,
    -1 for a plain step that probed."""
    chosen = []
    for _ in range(rounds):
        plan = control.next_round()
        chosen.append(-1 if plan.probe else plan.k)
        accepted = 0
        while accepted < plan.k and right(accepted):
            accepted += 1
        control.observe_decoder(plan.k + 1, d.get(plan.k + 1, d[max(d)]))
        if plan.k or plan.probe:
            control.observe_head(h)
        control.observe_round(plan.k, accepted)
        if plan.probe:
            control.observe_probe(right(0))
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


def test_unmeasured_sizes_are_extrapolated_never_free() -> None:
    """Beyond the largest measured call size D grows along the line through the two largest;
    with only D(1) measured, by verify_slope x D(1) a position."""
    control = DraftController(4, verify_slope=0.5)
    control.decoder_seconds = {1: 10.0}
    control.head_seconds = 0.0
    control.accepted = 1.0
    a = control.acceptance
    assert control.rate(2) == pytest.approx(expected_rate(a, 2, 10.0, 20.0, 0.0))
    control.decoder_seconds = {1: 10.0, 2: 12.0}
    assert control.rate(4) == pytest.approx(expected_rate(a, 4, 10.0, 18.0, 0.0))


def test_a_plain_step_then_a_probe_then_drafting() -> None:
    """The first plain step measures D(1), the second probes the head (one draft checked
    against the step's own choice, no verifying call); a right probe starts drafting, and K
    grows to k_max as the measured sizes show the verifying calls cheap."""
    control = DraftController(3)
    chosen = run_rounds(control, lambda i: True, 12, {n: 1.0 + 0.05 * n for n in range(1, 5)}, 0.1)
    assert chosen[:2] == [0, -1]
    assert all(k > 0 for k in chosen[2:]) and chosen[-4:] == [3] * 4
    assert chosen[2:] == sorted(chosen[2:])


def test_a_drafter_always_right_and_cheap_keeps_k_max() -> None:
    control = DraftController(4)
    chosen = run_rounds(control, lambda i: True, 40, {n: 1.0 + 0.02 * n for n in range(1, 6)}, 0.05)
    assert chosen[-30:] == [4] * 30


@pytest.mark.parametrize(("right", "slope", "head"), [(False, 0.1, 0.3), (True, 0.3, 2.0)])
def test_a_drafter_that_does_not_pay_costs_only_probes_ever_fewer(
    right: bool, slope: float, head: float
) -> None:
    """A drafter always wrong, or always right but costing two decoder steps a call (K = 1:
    2 tokens for 1.3 + 2 steps), never gets a verifying call: every round is a plain step, a
    few of them probes, their waits doubling to the cap (a right probe that leaves drafting
    unpaid waits as a wrong one does, instead of a probe every 8 steps for nothing)."""
    control = DraftController(4, probe=8, max_probe=64)
    d = {n: 1.0 + slope * (n - 1) for n in range(1, 6)}
    chosen = run_rounds(control, lambda i: right, 400, d, head)
    assert set(chosen) == {0, -1}
    probes = [i for i, k in enumerate(chosen) if k == -1]
    assert probes[:4] == [1, 1 + 16 + 1, 1 + 16 + 1 + 32 + 1, 1 + 16 + 1 + 32 + 1 + 64 + 1]
    assert np.diff(probes).max() == 64 + 1  # the wait doubled to its cap


@pytest.mark.parametrize("right", [False, True])
def test_an_untimed_head_is_probed_again_at_once_only_when_right(right: bool) -> None:
    """The first probe's head call catches the head up on the prompt, which speculative.py
    does not time (only one-position calls give H). Wrong, the next probe waits the doubled
    wait: a bad head never costs a timing call. Right, the next step probes again, and its
    one-position call gives the rate that decides the rounds after."""
    control = DraftController(4, probe=8)
    assert control.next_round() == RoundPlan(0)  # D(1) unmeasured: a plain step
    control.observe_decoder(1, 1.0)
    control.observe_round(0, 0)
    assert control.next_round() == RoundPlan(0, probe=True)
    control.observe_decoder(1, 1.0)
    control.observe_round(0, 0)
    control.observe_probe(right)
    assert control.head_seconds is None
    plans = []
    while len(plans) < 40 and not (plans and plans[-1].probe):
        plans.append(control.next_round())
        control.observe_decoder(1, 1.0)
        control.observe_round(0, 0)
    assert len(plans) == (1 if right else 16 + 1)
    if right:
        control.observe_head(0.1)  # the one-position call was timed
        control.observe_probe(True)
        assert control.next_round().k > 0


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
    assert control.next_round().k == 1
    control.head_seconds = 0.0
    assert control.next_round().k == 4


def test_k_never_exceeds_k_max() -> None:
    control = DraftController(2)
    chosen = run_rounds(control, lambda i: i % 2 == 0, 50, {1: 1.0, 2: 1.0, 3: 1.0}, 0.01)
    assert set(chosen) <= {-1, 0, 1, 2}


def test_one_stalled_call_does_not_decide() -> None:
    """Call times are the median of the latest five of each size; a size's first call (a
    warm-up at a new shape) counts only until the second replaces it, and one stall among
    the later ones is outvoted."""
    control = DraftController(4)
    control.observe_decoder(1, 80.0)  # the warm-up call at a new size stands alone
    assert control.decoder_seconds[1] == 80.0
    for seconds in (50.0, 1.0, 1.1, 0.9):
        control.observe_decoder(1, seconds)
    assert control.decoder_seconds[1] == pytest.approx(1.05)  # 80 dropped: 50, 1, 1.1, 0.9
    for seconds in (2.0,) * 6:
        control.observe_decoder(1, seconds)
    assert control.decoder_seconds[1] == 2.0  # only the latest five count
