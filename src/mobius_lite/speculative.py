"""Exact speculative greedy decoding with the package's multi-token-prediction head.

The head (mtp.onnx, docs/decoder_contract.md) drafts K tokens, each draft step fed the
previous draft and the head's own `mtp_hidden_states`; one decoder call over K+1 tokens
verifies them; the longest prefix that equals the decoder's greedy choices is accepted, plus
the decoder's own next token. When a draft is rejected the decoder is cut back to the
accepted prefix: its Mamba states from the verifying call's own per-position windows
(packages built with them) and its attention caches on their sequence axis, or, for a
decoder without windows, by restoring the snapshot taken before the call and re-running the
accepted tokens. Either way the conv and SSM states and the attention caches end where plain
greedy decoding puts them (docs/speculative.md). A DraftController (draft_control.py) picks
K per round from the measured acceptance and call costs. The tokens are the decoder's
greedy tokens whatever the head proposes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mobius_lite.draft_control import DraftController
from mobius_lite.enums import GraphRole
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.runtime import CachedSession, DecoderSession

HIDDEN_STATES = "hidden_states"
MTP_HIDDEN_STATES = "mtp_hidden_states"


class DraftHead(Protocol):
    """What the speculative loop needs from a draft head: a cache it can cut back."""

    @property
    def length(self) -> int:
        """Positions held in the head's cache."""
        ...

    def reset(self, batch: int) -> None: ...

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run positions (token t+1, decoder hidden at t); returns (logits, mtp_hidden_states),
        both [batch, seq, ...], and keeps the new positions in the cache."""
        ...

    def truncate(self, length: int) -> None:
        """Drop the cache's positions from `length` on."""
        ...


class MtpHead(CachedSession):
    """An onnxruntime session over a package's mtp.onnx that carries the head's KV cache.

    Cache inputs and element types are read from the session (runtime.cache_inputs), so an
    FP16 head gets FP16 hidden states.
    """

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        super().__init__(model, providers, session_options)
        wanted = {"input_ids", HIDDEN_STATES, "attention_mask"} - set(self.inputs)
        wanted |= {"logits", MTP_HIDDEN_STATES} - set(self.output_names)
        if wanted or not self.cache:
            where = "the head graph" if isinstance(model, bytes) else str(model)
            missing = ", ".join(sorted(wanted)) or "a past_key_values.mtp.* cache input"
            raise PackageError(
                f"{where} lacks {missing} of the MTP head contract (docs/decoder_contract.md); "
                "rebuild the package with this version of mobius"
            )
        self.mask = np.zeros((0, 0), dtype=np.int64)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        self.mask = np.concatenate([self.mask, np.asarray(attention_mask, np.int64)], axis=1)
        feeds = {
            "input_ids": np.asarray(input_ids, np.int64),
            HIDDEN_STATES: np.asarray(hidden_states).astype(self.inputs[HIDDEN_STATES], copy=False),
            "attention_mask": self.mask,
            **self.past,
        }
        results = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: results[c.present_name] for c in self.cache}
        return results["logits"], results[MTP_HIDDEN_STATES]

    def truncate(self, length: int) -> None:
        # the head's caches are attention K/V: [batch, kv_heads, sequence, head_dim]
        self.past = {name: value[:, :, :length] for name, value in self.past.items()}
        self.mask = self.mask[:, :length]


def open_head(
    package_dir: str | Path, providers: list[str] | None = None, session_options: Any = None
) -> MtpHead:
    """The package's MTP head; a ConfigError naming the fix when the package has none."""
    path = Path(package_dir) / GraphRole.MTP.file_name
    if not path.is_file():
        raise ConfigError(
            f"{package_dir} has no {GraphRole.MTP.file_name}: its checkpoint has no "
            "multi-token-prediction head, so it cannot draft; decode without speculation "
            "(no --speculative; in Python, runtime.greedy)"
        )
    return MtpHead(path, providers, session_options)


@dataclass
class SpeculationStats:
    """Draft counts, per row: `proposed` drafts, `accepted` drafts (the tokens they saved a
    decoder call for), `rounds` verifying calls (plain steps included), `rewinds` rounds cut
    back to their accepted prefix from the call's own state windows, `rollbacks` re-runs
    after a rejection (decoders without windows), `decoder_calls` all decoder calls (prefill
    and re-runs included), `head_calls` draft calls, `k_rounds` rounds run per K (0: a plain
    step)."""

    proposed: int = 0
    accepted: int = 0
    rounds: int = 0
    rollbacks: int = 0
    decoder_tokens: int = 0  # positions fed to the decoder after the prompt, re-runs included
    rewinds: int = 0
    decoder_calls: int = 0
    head_calls: int = 0
    k_rounds: dict[int, int] = field(default_factory=dict)

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
    *,
    attention_mask: np.ndarray | None = None,
    prompt_input: np.ndarray | None = None,
    decoder_input: Callable[[np.ndarray], np.ndarray] | None = None,
    stops: Collection[int] = (),
    outputs: list[dict[str, np.ndarray]] | None = None,
    adaptive: bool = True,
    controller: DraftController | None = None,
) -> tuple[list[list[int]], SpeculationStats]:
    """Greedy tokens after the (left-padded) prompt `input_ids` [batch, seq], drafting up to
    `k` tokens a round with `head`; identical to plain greedy decoding.

    With `adaptive` (default) a DraftController (draft_control.py; pass your own to tune or
    inspect it) picks each round's K in 0..k from the measured acceptance and call costs,
    down to plain decoding; otherwise every round drafts `k`. `prompt_input` /
    `decoder_input` give what the decoder takes instead of ids (the Omni decoder's
    embeddings: the prompt's with media, and a function from new ids). A batch row accepts as
    many drafts as the row that accepts fewest (each row's own next token is still its greedy
    one). Generation stops after `max_new_tokens` or, at batch 1, after a token in `stops`.
    Every decoder call's outputs are appended to `outputs` when given. On return the decoder
    holds the state plain decoding would hold after feeding all but the last token.
    """
    if k < 1:
        raise ConfigError(f"k (--speculative) must be >= 1 draft tokens, found {k}")
    if HIDDEN_STATES not in decoder.output_names:
        raise PackageError(
            f"the decoder has no {HIDDEN_STATES} output, which the head drafts from; rebuild "
            "the package with this version of mobius"
        )
    ids = np.asarray(input_ids, dtype=np.int64)
    batch, length = ids.shape
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
    run = _Run(decoder, head, decoder_input, outputs, controller or DraftController(k), adaptive)

    decoder.reset(batch)
    head.reset(batch)
    out = run.call(ids if prompt_input is None else prompt_input, mask, keep=1, prefill=True)
    pending = out["logits"][:, -1].argmax(-1)
    tokens = [[int(t)] for t in pending]
    backlog = _HeadBacklog()
    backlog.add(np.concatenate([ids[:, 1:], pending[:, None]], axis=1), _hidden(out, length), mask)
    stop_set = set(stops) if batch == 1 else set()
    while len(tokens[0]) < max_new_tokens and not stop_set & {tokens[0][-1]}:
        wanted = min(run.next_k(k), max_new_tokens - len(tokens[0]) - 1)
        drafts = run.draft(backlog, wanted) if wanted else _no_drafts(batch)
        fed = np.concatenate([pending[:, None], drafts], axis=1)
        saved = (dict(decoder.past), decoder.mask)  # the arrays are never written in place
        out = run.call(fed, keep=fed.shape[1])
        greedy = out["logits"].argmax(-1)  # greedy[:, j]: the choice after fed[:, : j + 1]
        matches = np.cumprod(drafts == greedy[:, :wanted], axis=1).sum(axis=1)
        accepted = int(matches.min()) if wanted else 0
        kept = accepted + 1
        run.count_round(wanted, accepted, batch)
        hidden = _hidden(out, fed.shape[1])[:, :kept]
        if kept < fed.shape[1]:  # a draft was rejected: its positions must not stay
            hidden = run.cut(out, fed, kept, saved, hidden)
        if wanted:
            head.truncate(head.length - (wanted - 1))
        pending = greedy[:, accepted]
        new = np.concatenate([fed[:, 1:kept], pending[:, None]], axis=1)
        stop = next((i for i, t in enumerate(new[0].tolist()) if t in stop_set), None)
        if stop is not None:  # plain decoding stops there, having fed fed[:, : stop + 1]
            if stop + 1 < kept:
                run.cut(out, fed, stop + 1, saved, hidden)
            tokens[0] += [int(t) for t in new[0, : stop + 1]]
            break
        backlog.add(new, hidden, np.ones((batch, kept), np.int64))
        for row in range(batch):
            tokens[row] += [int(t) for t in new[row]]
    return tokens, run.stats


class _Run:
    """One speculative generation's calls: it times them for the controller, counts them,
    and cuts the decoder back to an accepted prefix (from the verifying call's windows, or
    by a re-run from the snapshot when the decoder has none)."""

    def __init__(
        self,
        decoder: DecoderSession,
        head: DraftHead,
        decoder_input: Callable[[np.ndarray], np.ndarray] | None,
        outputs: list[dict[str, np.ndarray]] | None,
        controller: DraftController,
        adaptive: bool,
    ) -> None:
        self.decoder, self.head = decoder, head
        self.feed = decoder_input or (lambda new_ids: new_ids)
        self.record = outputs.append if outputs is not None else (lambda out: None)
        self.controller = controller
        self.adaptive = adaptive
        self.stats = SpeculationStats()

    def next_k(self, k: int) -> int:
        return self.controller.next_k() if self.adaptive else k

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

    def draft(self, backlog: _HeadBacklog, count: int) -> np.ndarray:
        start = time.perf_counter()
        drafts = _draft(self.head, backlog, count)
        self.controller.observe_head((time.perf_counter() - start) / count)
        self.stats.head_calls += count
        return drafts

    def count_round(self, drafted: int, accepted: int, batch: int) -> None:
        self.controller.observe_round(drafted, accepted)
        self.stats.rounds += 1
        self.stats.proposed += drafted * batch
        self.stats.accepted += accepted * batch
        self.stats.k_rounds[drafted] = self.stats.k_rounds.get(drafted, 0) + 1

    def cut(
        self,
        out: dict[str, np.ndarray],
        fed: np.ndarray,
        kept: int,
        saved: tuple[dict[str, np.ndarray], np.ndarray | None],
        hidden: np.ndarray,
    ) -> np.ndarray:
        """Leave the decoder as if only fed[:, :kept] had been fed; returns those positions'
        hidden states (the verifying call's, or the re-run's)."""
        if self.decoder.keep_prefix(out, fed.shape[1], kept):
            self.stats.rewinds += 1
            return hidden[:, :kept]
        self.decoder.past, self.decoder.mask = dict(saved[0]), saved[1]
        rerun = self.call(fed[:, :kept], keep=1)
        self.stats.rollbacks += 1
        return _hidden(rerun, kept)


def _draft(head: DraftHead, backlog: _HeadBacklog, count: int) -> np.ndarray:
    """`count` chained drafts [batch, count]. The first call runs the backlog (real tokens and
    decoder hidden states); each later one runs one position on the previous draft and the
    head's own hidden state, an entry the caller cuts from the cache after verification."""
    ids, hidden, mask = backlog.take()
    logits, mtp_hidden = head.step(ids, hidden, mask)
    drafts = [logits[:, -1].argmax(-1)]
    ones = np.ones((ids.shape[0], 1), np.int64)
    for _ in range(count - 1):
        logits, mtp_hidden = head.step(drafts[-1][:, None], mtp_hidden[:, -1:], ones)
        drafts.append(logits[:, -1].argmax(-1))
    return np.stack(drafts, axis=1).astype(np.int64)


def _no_drafts(batch: int) -> np.ndarray:
    return np.zeros((batch, 0), dtype=np.int64)


def _hidden(out: dict[str, np.ndarray], positions: int) -> np.ndarray:
    """The decoder's hidden states of the call's last `positions` positions."""
    hidden = out[HIDDEN_STATES]
    if hidden.shape[1] < positions:
        raise PackageError(
            f"the decoder returned {HIDDEN_STATES} for {hidden.shape[1]} positions of "
            f"{positions}; the head needs every fed position"
        )
    return hidden[:, hidden.shape[1] - positions :]
