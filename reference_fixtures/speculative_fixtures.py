"""Helpers for the speculative-decoding tests: plain greedy decoding written out step by step
(the reference every speculative run must equal), and a draft head that drafts from a known
continuation, right or deliberately wrong position by position."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from mobius_lite.run.decoder_session import DecoderSession


def plain_greedy(
    decoder: DecoderSession,
    ids: np.ndarray,
    mask: np.ndarray,
    new_tokens: int,
    prompt_input: np.ndarray | None = None,
    decoder_input: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Greedy tokens [batch, new_tokens], one decoder call per token; and the decoder's
    hidden_states of every fed position, [batch, hidden] each (prompt first)."""
    feed = decoder_input or (lambda x: x)
    decoder.reset(ids.shape[0])
    out = decoder.step(ids if prompt_input is None else prompt_input, mask, logits_to_keep=1)
    hidden = list(out["hidden_states"].transpose(1, 0, 2))
    tokens = [out["logits"][:, -1].argmax(-1)]
    while len(tokens) < new_tokens:
        out = decoder.step(feed(tokens[-1][:, None].astype(np.int64)), logits_to_keep=1)
        hidden.append(out["hidden_states"][:, 0])
        tokens.append(out["logits"][:, -1].argmax(-1))
    return np.stack(tokens, axis=1), hidden


class ScriptedHead:
    """A DraftHead whose draft at position t is token t+2 of `sequences` (prompt + plain greedy
    continuation, per row), except where `wrong(row, t)` holds: there it drafts another token.

    It records every cache entry (position, input token, hidden state), cut by truncate like a
    real head's cache, so a test can check that only real entries remain."""

    def __init__(
        self, sequences: np.ndarray, vocab: int, wrong: Callable[[int, int], bool]
    ) -> None:
        self.sequences = sequences
        self.vocab = vocab
        self.wrong = wrong
        self.mask = np.zeros((sequences.shape[0], 0), dtype=np.int64)
        self.entries: list[tuple[np.ndarray, np.ndarray]] = []

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def reset(self, batch: int) -> None:
        self.mask = np.zeros((batch, 0), dtype=np.int64)
        self.entries = []

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        batch, seq = input_ids.shape
        start = self.length
        self.mask = np.concatenate([self.mask, attention_mask], axis=1)
        logits = np.zeros((batch, seq, self.vocab), dtype=np.float32)
        for j in range(seq):
            t = start + j
            self.entries.append((input_ids[:, j].copy(), hidden_states[:, j].copy()))
            for row in range(batch):
                target = int(self.sequences[row, t + 2]) if t + 2 < self.sequences.shape[1] else 0
                if self.wrong(row, t):
                    target = (target + 1) % self.vocab
                logits[row, j, target] = 1.0
        return logits, hidden_states

    def truncate(self, length: int) -> None:
        self.mask = self.mask[:, :length]
        del self.entries[length:]
