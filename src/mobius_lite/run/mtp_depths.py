"""The draft chain of a multi-token-prediction head of distinct depths
(mtp_use_repeated_layer false; docs/speculative.md, "Heads of distinct depths").

Depth j (0-based) at position i takes depth j-1's final-normed output there (the decoder's
hidden state for depth 0) and the embedding of token t_{i+j+1}; its logits draft t_{i+j+2}.
Each depth is one graph with its own attention cache (mtp.onnx, then GraphId(MTP, j)), and a
round's draft j comes from depth j at the decoder's last position p:

- depth 0 runs the positions it has not seen (true tokens, decoder hidden states) up to p;
- depth j >= 1 runs the positions whose token t_{i+j+1} has become known (i <= p - j, true
  inputs) and then the j positions p-j+1 .. p, whose tokens are this round's drafts (and
  whose inputs from depth j-1 are speculative beyond p-j+1), in one call;
- a depth's speculative entries leave its cache right after its call; they are recomputed
  from true tokens once those are known. Each depth keeps the true outputs of the depth
  before it that it has not run yet.

The chain keeps the true tokens and masks from the first position a later depth has not run
on (the lowest of their cache lengths): nothing before it is read again, so what it keeps
does not grow with the generation (after a round of D drafts, D - 1 positions).

The depths share the decoder's embedding table and lm_head (inside each graph). A round
drafts at most as many tokens as there are depths; a probe (one draft) runs depth 0 only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

# timed(positions, seconds): told of every depth call; positions 1 marks one draft's cost
DraftTimer = Callable[[int, float], None]


class DepthSession(Protocol):
    """One depth's graph with its own cache (run/mtp_head.MtpHead)."""

    @property
    def length(self) -> int: ...

    def reset(self, batch: int) -> None: ...

    def step(
        self,
        input_ids: np.ndarray,
        hidden_states: np.ndarray,
        attention_mask: np.ndarray,
        logits_to_keep: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def truncate(self, length: int) -> None: ...


class DepthChain:
    """A head of distinct depths as one draft head (run/mtp_head.RoundDraftHead): `step` runs
    depth 0 on true positions (a DraftHead's step), `draft_round` makes a round's drafts
    through the depths in order."""

    def __init__(self, depths: Sequence[DepthSession]) -> None:
        if len(depths) < 2:
            raise ValueError("a depth chain needs at least two depths")
        self.depths = list(depths)
        self.reset(1)

    @property
    def max_drafts(self) -> int:
        """One draft per depth a round."""
        return len(self.depths)

    @property
    def length(self) -> int:
        """Positions depth 0 holds (every later depth holds fewer: depth j lags by j)."""
        return self.depths[0].length

    def reset(self, batch: int) -> None:
        for depth in self.depths:
            depth.reset(batch)
        # tokens[:, i] = t_{offset+i+1}, masks[:, i]: the attention mask of position
        # offset + i (depth 0's), from the first position a later depth has not run (offset)
        self.offset = 0
        self.tokens = np.zeros((batch, 0), np.int64)
        self.masks = np.zeros((batch, 0), np.int64)
        # pending[j]: depth j-1's true outputs at positions depth j has not run (from
        # depths[j].length on, contiguous); pending[0] is unused (the caller's backlog)
        self.pending: list[np.ndarray | None] = [None] * len(self.depths)

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """DraftHead.step: depth 0 over true positions (token t+1, decoder hidden t); its
        outputs wait for depth 1. Returns depth 0's (logits, mtp_hidden_states)."""
        return self._depth0(input_ids, hidden_states, attention_mask, 0)

    def truncate(self, length: int) -> None:
        """Drop positions from `length` on: depth 0's and the tokens after them, and every
        later depth's outputs that depended on them. A later depth keeps only the inputs it
        has not run, so cutting into what it has already run is refused (reset instead)."""
        for j, depth in enumerate(self.depths[1:], start=1):
            if depth.length > max(0, length - j):
                raise ValueError(
                    f"depth {j} has run {depth.length} positions; cutting the chain to "
                    f"{length} would need inputs it no longer holds: reset the head instead"
                )
            held = self.pending[j]
            if held is not None:
                self.pending[j] = held[:, : max(0, length - j + 1 - depth.length)]
        if length < self.depths[0].length:
            self.depths[0].truncate(length)
        kept = length - self.offset  # >= 0: no later depth j holds more than length - j
        self.tokens, self.masks = self.tokens[:, :kept], self.masks[:, :kept]

    def draft_round(
        self,
        input_ids: np.ndarray,
        hidden_states: np.ndarray,
        attention_mask: np.ndarray,
        count: int,
        timed: DraftTimer,
    ) -> np.ndarray:
        """RoundDraftHead.draft_round: depth 0 catches up on the caller's positions and
        drafts from the last one (p); depth j (1 <= j < count) catches up on its true
        positions and runs its j speculative ones, drafting t_{p+j+2}. [batch, count]."""
        if not 1 <= count <= self.max_drafts:
            raise ValueError(f"a round of this head drafts 1 to {self.max_drafts}, not {count}")
        start = time.perf_counter()
        logits, above = self._depth0(input_ids, hidden_states, attention_mask, 1)
        timed(self._timed_positions(input_ids.shape[1]), time.perf_counter() - start)
        drafts = [logits[:, -1].argmax(-1).astype(np.int64)]
        last = self.length - 1  # p: the decoder's last position, its token pending
        for j in range(1, count):
            start = time.perf_counter()
            logits, above, true_count = self._depth(j, last, above, np.stack(drafts, axis=1))
            timed(self._timed_positions(true_count), time.perf_counter() - start)
            drafts.append(logits[:, -1].argmax(-1).astype(np.int64))
        self._trim()
        return np.stack(drafts, axis=1)

    def _depth0(
        self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray, keep: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Depth 0 over true positions; its outputs (every position: the graph of a depth
        that feeds another keeps them all) join depth 1's pending inputs."""
        ids, mask = np.asarray(ids, np.int64), np.asarray(mask, np.int64)
        logits, out = self.depths[0].step(ids, hidden, mask, logits_to_keep=keep)
        self.tokens = np.concatenate([self.tokens, ids], axis=1)
        self.masks = np.concatenate([self.masks, mask], axis=1)
        self._keep_true(1, out)
        return logits, out

    def _depth(
        self, j: int, last: int, above: np.ndarray, drafts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Depth j over positions depths[j].length .. last in one call: (its logits, its
        outputs at those positions, how many of them had true inputs). `above`: depth j-1's
        outputs of this round, ending at `last`; `drafts`: this round's drafts so far."""
        depth = self.depths[j]
        first = depth.length
        positions = last - first + 1
        # token line: line[:, m] = t_{offset+m+1}, the drafts after the true tokens
        line = np.concatenate([self.tokens, drafts], axis=1)
        ids = line[:, first + j - self.offset : last + j + 1 - self.offset]
        held = self.pending[j]
        held = held[:, :positions] if held is not None else above[:, :0]
        hidden = np.concatenate([held, above[:, above.shape[1] - (positions - held.shape[1]) :]], 1)
        mask = self.masks[:, first - self.offset : last + 1 - self.offset]
        logits, out = depth.step(ids, hidden, mask, logits_to_keep=1)
        true_count = max(0, last - j + 1 - first)  # positions first .. last - j
        true_inputs = max(0, last - j + 2 - first)  # depth j-1 is true up to last - j + 1
        depth.truncate(first + true_count)  # the speculative entries leave at once
        self.pending[j] = hidden[:, true_count:true_inputs]
        self._keep_true(j + 1, out[:, :true_count])
        return logits, out, true_count

    def _trim(self) -> None:
        """Drop the tokens and masks of positions every later depth has run: a depth reads
        from its own cache length on, and no length goes back but by reset."""
        offset = min(depth.length for depth in self.depths[1:])
        self.tokens = self.tokens[:, offset - self.offset :]
        self.masks = self.masks[:, offset - self.offset :]
        self.offset = offset

    def _keep_true(self, j: int, outputs: np.ndarray) -> None:
        """Append true outputs of depth j-1 to depth j's pending inputs (none past the last)."""
        if j >= len(self.depths):
            return
        held = self.pending[j]
        self.pending[j] = outputs if held is None else np.concatenate([held, outputs], axis=1)

    def _timed_positions(self, true_positions: int) -> int:
        """1 (one draft's cost) for a call over what a round leaves (at most max_drafts + 1
        true positions per depth); the positions otherwise, which the controller ignores:
        a catch-up on the prompt or on the steps since a depth last ran is a one-off."""
        return 1 if true_positions <= self.max_drafts + 1 else true_positions
