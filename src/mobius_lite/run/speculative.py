"""Exact speculative greedy decoding with the package's multi-token-prediction head.

The head (run/mtp_head.py) drafts K tokens, each draft step fed the
previous draft and the head's own `mtp_hidden_states` (a head of distinct depths drafts
through its depths in order, run/mtp_depths.py); one decoder call over K+1 tokens
verifies them; the longest prefix that equals the decoder's greedy choices is accepted, plus
the decoder's own next token. When a draft is rejected the decoder is cut back to the
accepted prefix: its Mamba states re-derived from the verifying call's own per-position
recurrence inputs (run/state_rewind.py; or taken from the state_window kernels' per-position
states) and its attention caches on their sequence axis, or, for a decoder without either, by
restoring the snapshot taken before the call and re-running the
accepted tokens. Either way the conv and SSM states and the attention caches end where plain
greedy decoding puts them (docs/speculative.md). A DraftController (draft_control.py) picks
K per round from the measured acceptance and call costs. The tokens are the decoder's
greedy tokens whatever the head proposes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.io_contract import HIDDEN_STATES, LOGITS
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.draft_control import DraftController, RoundPlan
from mobius_lite.run.mtp_head import DraftHead, DraftTimer, MtpHead, RoundDraftHead


@dataclass(frozen=True)
class SpeculationOptions:
    """How a speculative generation runs, beyond its prompt ids, length and K.

    `attention_mask`: the (left-padded) prompt's mask (default all ones). `prompt_input` /
    `decoder_input`: what the decoder takes instead of ids (the Omni decoder's embeddings:
    the prompt's with media, and a function from new ids). `stops`: stop after one of these
    tokens (batch 1 only). `outputs`: every decoder call's outputs are appended to it.
    `adaptive`: a DraftController (`controller`, or a fresh one) picks each round's K in 0..k;
    otherwise every round drafts k.
    """

    attention_mask: np.ndarray | None = None
    prompt_input: np.ndarray | None = None
    decoder_input: Callable[[np.ndarray], np.ndarray] | None = None
    stops: Collection[int] = ()
    outputs: list[dict[str, np.ndarray]] | None = None
    adaptive: bool = True
    controller: DraftController | None = None


@dataclass
class SpeculationStats:
    """Draft counts, per row: `proposed` drafts, `accepted` drafts (the tokens they saved a
    decoder call for), `rounds` verifying calls (plain steps included), `rewinds` rounds cut
    back to their accepted prefix from the call's own outputs (DecoderSession.keep_prefix),
    `rollbacks` re-runs after a rejection (decoders without speculation windows),
    `decoder_calls` all decoder calls (prefill and re-runs included), `head_calls` draft calls
    (probes included), `k_rounds` rounds run per K (0: a plain step), `probes` plain steps
    that also drafted one token to learn about the head, `probes_right` those whose draft was
    the step's greedy choice (neither counts in `proposed` / `accepted`: a probe saves no
    decoder call)."""

    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    rollbacks: int = 0
    decoder_tokens: int = 0  # positions fed to the decoder after the prompt, re-runs included
    rewinds: int = 0
    decoder_calls: int = 0
    head_calls: int = 0
    k_rounds: dict[int, int] = field(default_factory=dict)
    probes: int = 0
    probes_right: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "proposed": self.proposed,
            "accepted": self.accepted,
            "acceptance_rate": self.acceptance_rate,
            "rounds": self.rounds,
            "rollbacks": self.rollbacks,
            "rewinds": self.rewinds,
            "decoder_tokens": self.decoder_tokens,
            "decoder_calls": self.decoder_calls,
            "head_calls": self.head_calls,
            "k_rounds": dict(sorted(self.k_rounds.items())),
            "probes": self.probes,
            "probes_right": self.probes_right,
        }


@dataclass
class _HeadBacklog:
    """Positions the head has not run on yet, with the decoder's real hidden states: the
    head's cache lags the decoder's, and catches up in the call that makes the next draft."""

    ids: list[np.ndarray] = field(default_factory=list)
    hidden: list[np.ndarray] = field(default_factory=list)
    mask: list[np.ndarray] = field(default_factory=list)

    def add(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> None:
        self.ids.append(ids)
        self.hidden.append(hidden)
        self.mask.append(mask)

    def take(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = (
            np.concatenate(self.ids, axis=1),
            np.concatenate(self.hidden, axis=1),
            np.concatenate(self.mask, axis=1),
        )
        self.ids, self.hidden, self.mask = [], [], []
        return out


def speculative_greedy(
    decoder: DecoderSession,
    head: DraftHead,
    input_ids: np.ndarray,
    max_new_tokens: int,
    k: int,
    options: SpeculationOptions | None = None,
    **settings: Any,
) -> tuple[list[list[int]], SpeculationStats]:
    """Greedy tokens after the (left-padded) prompt `input_ids` [batch, seq], drafting up to
    `k` tokens a round with `head`; identical to plain greedy decoding.

    `options` (or its fields given as keywords: attention_mask=, stops=, adaptive=, ...,
    which override it) say how it runs (SpeculationOptions). A batch row accepts as many
    drafts as the row that accepts fewest (each row's own next token is still its greedy
    one). Generation stops after `max_new_tokens` or, at batch 1, after a token in `stops`.
    On return the decoder holds the state plain decoding would hold after feeding all but
    the last token.
    """
    options = dataclasses.replace(options or SpeculationOptions(), **settings)
    check_speculation(decoder, k)
    check_head_drafts(head, k)
    return _Speculation(decoder, head, k, options).generate(input_ids, max_new_tokens)


def check_speculation(decoder: DecoderSession, k: int) -> None:
    """ConfigError for K < 1, or for K + 1 beyond the positions an int8-activation decoder
    computes as one-position calls do (its verifying calls would choose other tokens);
    PackageError for a decoder without the head's input."""
    if k < 1:
        raise ConfigError(f"k (--speculative) must be >= 1 draft tokens, found {k}")
    if decoder.row_window and k + 1 > decoder.row_window:
        raise ConfigError(
            f"k (--speculative) is {k}, but this int8-activation decoder computes a verifying "
            f"call exactly as one-token steps only up to {decoder.row_window} positions: use "
            f"k <= {decoder.row_window - 1}"
        )
    if HIDDEN_STATES not in decoder.output_names:
        raise PackageError(
            f"the decoder has no {HIDDEN_STATES} output, which the head drafts from; rebuild "
            "the package with this version of mobius"
        )


def check_head_drafts(head: DraftHead, k: int) -> None:
    """ConfigError for K above what one round of a head of distinct depths drafts."""
    if isinstance(head, RoundDraftHead):
        check_depth_drafts(head.max_drafts, k)


def check_depth_drafts(depths: int, k: int) -> None:
    """ConfigError for K above `depths`, the depth graphs of a head of distinct depths (one
    draft per depth: a further draft would need a depth the head was not trained with); a
    one-depth head (`depths` <= 1) repeats its depth for any K. `mobius generate` asks this
    from the manifest (mtp_head.head_files) before any session is created."""
    if depths > 1 and k > depths:
        raise ConfigError(
            f"k (--speculative) is {k}, but this head has {depths} distinct depths "
            f"(mtp_use_repeated_layer false), which draft at most {depths} tokens a round: "
            f"use k <= {depths}"
        )


@dataclass
class _Verified:
    """One verifying decoder call: what it was fed ([pending, drafts...]), its outputs, the
    decoder's greedy choice after each fed position, the drafts all rows accept, and the
    decoder's state before the call (its arrays are never written in place)."""

    fed: np.ndarray
    out: dict[str, np.ndarray]
    greedy: np.ndarray
    accepted: int
    saved: tuple[dict[str, np.ndarray], np.ndarray | None]

    @property
    def drafted(self) -> int:
        return self.fed.shape[1] - 1


class _Speculation:
    """One speculative generation: prefill, then rounds of draft, verify, accept."""

    def __init__(
        self, decoder: DecoderSession, head: DraftHead, k: int, options: SpeculationOptions
    ) -> None:
        self.decoder, self.head, self.k = decoder, head, k
        self.options = options
        self.calls = _Calls(decoder, head, k, options)
        self.backlog = _HeadBacklog()

    def generate(
        self, input_ids: np.ndarray, max_new_tokens: int
    ) -> tuple[list[list[int]], SpeculationStats]:
        """Every row's tokens (prefill's choice first) and the counts."""
        ids = np.asarray(input_ids, dtype=np.int64)
        pending = self.prefill(ids)
        tokens = [[int(t)] for t in pending]
        stops = set(self.options.stops) if ids.shape[0] == 1 else set()
        while len(tokens[0]) < max_new_tokens and tokens[0][-1] not in stops:
            plan = self.calls.next_round()
            left = max_new_tokens - len(tokens[0]) - 1  # tokens after this round's last
            wanted = min(plan.k, left)
            probe = self.calls.draft(self.backlog, 1 if plan.probe and left else 0, ids.shape[0])
            verified = self.verify(pending, self.calls.draft(self.backlog, wanted, ids.shape[0]))
            if probe.shape[1]:
                self.calls.count_probe(bool((probe[:, 0] == verified.greedy[:, 0]).all()))
            new, pending, stopped = self.accept(verified, stops)
            for row, row_tokens in enumerate(tokens):
                row_tokens += [int(t) for t in new[row]]
            if stopped:
                break
        return tokens, self.calls.stats

    def prefill(self, ids: np.ndarray) -> np.ndarray:
        """Fresh caches, the prompt's call; each row's first token (not yet fed). The head's
        backlog gets the prompt's positions (token t+1, decoder hidden t)."""
        batch, length = ids.shape
        mask = self.options.attention_mask
        mask = np.ones_like(ids) if mask is None else np.asarray(mask, np.int64)
        prompt = ids if self.options.prompt_input is None else self.options.prompt_input
        self.decoder.reset(batch)
        self.head.reset(batch)
        out = self.calls.call(prompt, mask, keep=1, prefill=True)
        pending = out[LOGITS][:, -1].argmax(-1)
        shifted = np.concatenate([ids[:, 1:], pending[:, None]], axis=1)
        self.backlog.add(shifted, _hidden(out, length), mask)
        return pending

    def verify(self, pending: np.ndarray, drafts: np.ndarray) -> _Verified:
        """One decoder call over each row's pending token and its drafts; counts the drafts
        every row accepts (the longest prefix equal to the decoder's greedy choices)."""
        fed = np.concatenate([pending[:, None], drafts], axis=1)
        saved = (dict(self.decoder.past), self.decoder.mask)
        out = self.calls.call(fed, keep=fed.shape[1])
        greedy = out[LOGITS].argmax(-1)  # greedy[:, j]: the choice after fed[:, : j + 1]
        wanted = drafts.shape[1]
        matches = np.cumprod(drafts == greedy[:, :wanted], axis=1).sum(axis=1)
        accepted = int(matches.min()) if wanted else 0
        self.calls.count_round(wanted, accepted, fed.shape[0])
        return _Verified(fed, out, greedy, accepted, saved)

    def accept(
        self, verified: _Verified, stops: Collection[int]
    ) -> tuple[np.ndarray, np.ndarray, bool]:
        """Keep the accepted prefix in both caches: (the round's new tokens per row, each
        row's next pending token, whether a stop token ended generation)."""
        kept = verified.accepted + 1
        hidden = _hidden(verified.out, verified.fed.shape[1])[:, :kept]
        if kept < verified.fed.shape[1]:  # a draft was rejected: its positions must not stay
            hidden = self.calls.cut(verified, kept, hidden)
        pending = verified.greedy[:, verified.accepted]
        new = np.concatenate([verified.fed[:, 1:kept], pending[:, None]], axis=1)
        stop = next((i for i, t in enumerate(new[0].tolist()) if t in stops), None)
        if stop is not None:  # plain decoding stops there, having fed fed[:, : stop + 1]
            if stop + 1 < kept:
                self.calls.cut(verified, stop + 1, hidden)
            return new[:, : stop + 1], pending, True
        self.backlog.add(new, hidden, np.ones((new.shape[0], kept), np.int64))
        return new, pending, False


class _Calls:
    """One speculative generation's calls: it times them for the controller, counts them,
    and cuts the decoder back to an accepted prefix (from the verifying call's own outputs,
    or by a re-run from the snapshot when the decoder cannot give it)."""

    def __init__(
        self, decoder: DecoderSession, head: DraftHead, k: int, options: SpeculationOptions
    ) -> None:
        self.decoder, self.head, self.k = decoder, head, k
        self.feed = options.decoder_input or (lambda new_ids: new_ids)
        outputs = options.outputs
        self.record = outputs.append if outputs is not None else (lambda out: None)
        self.controller = options.controller or DraftController(k)
        self.adaptive = options.adaptive
        self.stats = SpeculationStats()

    def next_round(self) -> RoundPlan:
        """This round's K and probe: the controller's choice, or k when not adaptive."""
        return self.controller.next_round() if self.adaptive else RoundPlan(self.k)

    def call(
        self,
        fed: np.ndarray,
        mask: np.ndarray | None = None,
        keep: int = 1,
        prefill: bool = False,
    ) -> dict[str, np.ndarray]:
        """One decoder call; `fed` is the prompt input when `prefill`, else new token ids."""
        start = time.perf_counter()
        out = self.decoder.step(fed if prefill else self.feed(fed), mask, logits_to_keep=keep)
        if not prefill:
            self.controller.observe_decoder(fed.shape[1], time.perf_counter() - start)
            self.stats.decoder_tokens += fed.shape[1]
        self.stats.decoder_calls += 1
        self.record(out)
        return out

    def draft(self, backlog: _HeadBacklog, count: int, batch: int) -> np.ndarray:
        """`count` drafts per row [batch, count] (none when count is 0). The controller times
        the head's one-position calls only: a call catching up on a backlog (the prompt, or
        the steps since the last probe) is a one-off, not what a draft costs."""
        if not count:
            return np.zeros((batch, 0), dtype=np.int64)
        if isinstance(self.head, RoundDraftHead):
            ids, hidden, mask = backlog.take()
            drafts = self.head.draft_round(ids, hidden, mask, count, self._timed_head)
        else:
            drafts = _draft(self.head, backlog, count, self._timed_head)
        self.stats.head_calls += count
        return drafts

    def _timed_head(self, positions: int, seconds: float) -> None:
        if positions == 1:
            self.controller.observe_head(seconds)

    def count_round(self, drafted: int, accepted: int, batch: int) -> None:
        self.controller.observe_round(drafted, accepted)
        self.stats.rounds += 1
        self.stats.proposed += drafted * batch
        self.stats.accepted += accepted * batch
        self.stats.k_rounds[drafted] = self.stats.k_rounds.get(drafted, 0) + 1

    def count_probe(self, right: bool) -> None:
        """A plain step's probe draft was (or was not) every row's greedy choice."""
        self.controller.observe_probe(right)
        self.stats.probes += 1
        self.stats.probes_right += int(right)

    def cut(self, verified: _Verified, kept: int, hidden: np.ndarray) -> np.ndarray:
        """Leave the decoder as if only fed[:, :kept] had been fed; returns those positions'
        hidden states (the verifying call's, or the re-run's)."""
        fed = verified.fed
        if self.decoder.keep_prefix(verified.out, fed.shape[1], kept):
            self.stats.rewinds += 1
            return hidden[:, :kept]
        self.decoder.past, self.decoder.mask = dict(verified.saved[0]), verified.saved[1]
        rerun = self.call(fed[:, :kept], keep=1)
        self.stats.rollbacks += 1
        return _hidden(rerun, kept)


def _draft(head: DraftHead, backlog: _HeadBacklog, count: int, timed: DraftTimer) -> np.ndarray:
    """`count` chained drafts [batch, count]. The first call runs the backlog (real tokens and
    decoder hidden states); each later one runs one position on the previous draft and the
    head's own hidden state, an entry cut from the cache once the drafts are made (accepted
    or not, it was computed from the head's own hidden state). `timed(positions, seconds)`
    hears of every call."""
    ids, hidden, mask = backlog.take()
    logits, mtp_hidden = _head_step(head, ids, hidden, mask, timed)
    drafts = [logits[:, -1].argmax(-1)]
    ones = np.ones((ids.shape[0], 1), np.int64)
    for _ in range(count - 1):
        previous = drafts[-1][:, None]
        logits, mtp_hidden = _head_step(head, previous, mtp_hidden[:, -1:], ones, timed)
        drafts.append(logits[:, -1].argmax(-1))
    if count > 1:  # the chained drafts' own entries leave the head's cache
        head.truncate(head.length - (count - 1))
    return np.stack(drafts, axis=1).astype(np.int64)


def _head_step(
    head: DraftHead,
    ids: np.ndarray,
    hidden: np.ndarray,
    mask: np.ndarray,
    timed: DraftTimer,
) -> tuple[np.ndarray, np.ndarray]:
    """One head call, timed; the package's head computes the last position's logits only
    (its lm_head over a backlog of positions would cost as much as the rest of the call)."""
    start = time.perf_counter()
    if isinstance(head, MtpHead):
        out = head.step(ids, hidden, mask, logits_to_keep=1)
    else:
        out = head.step(ids, hidden, mask)
    timed(ids.shape[1], time.perf_counter() - start)
    return out


def _hidden(out: dict[str, np.ndarray], positions: int) -> np.ndarray:
    """The decoder's hidden states of the call's last `positions` positions."""
    hidden = out[HIDDEN_STATES]
    if hidden.shape[1] < positions:
        raise PackageError(
            f"the decoder returned {HIDDEN_STATES} for {hidden.shape[1]} positions of "
            f"{positions}; the head needs every fed position"
        )
    return hidden[:, hidden.shape[1] - positions :]
