"""The one decoder stepper: DecoderSession runs a package's decoder one call at a time on
token ids or embeddings, passes the full attention mask, keeps the presents as the next past,
and can keep the state after a prefix of its last call (speculative decoding). The cache
inputs, the token input and the vocabulary size are read from the session, so f32, f16 and
bf16 packages (and instrumented twins) step the same way. Requires the `runtime` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import ConfigError
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LOGITS,
    LOGITS_TO_KEEP,
    RECURRENCE_DOMAIN,
    ROW_BY_ROW_WINDOW,
    window_of,
)
from mobius_lite.run.cached_session import CachedSession
from mobius_lite.run.state_rewind import StateRewind


class DecoderSession(CachedSession):
    """An onnxruntime session over a package's decoder that carries its own cache.

    `model` is the decoder file or serialized model bytes (an instrumented twin);
    `session_options` may enable profiling or point external data at the package. The cache
    inputs (names, dtypes, shapes), the token input and the vocabulary size are read from the
    session.
    """

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        super().__init__(model, providers, session_options)
        logits = next((o for o in self.session.get_outputs() if o.name == LOGITS), None)
        last = logits.shape[-1] if logits is not None and logits.shape else None
        self.vocab_size: int | None = last if isinstance(last, int) else None
        # Per cache input, the output holding its state after each position of a short call
        # (packages built with the state_window kernels; Mamba states only).
        outputs = set(self.output_names)
        self.windows = {
            c.past_name: window_of(c.past_name)
            for c in self.cache
            if window_of(c.past_name) in outputs
        }
        # Calls of up to this many positions compute each position as a one-position call
        # does (an int8-activation decoder's experts row by row; 0: not promised)
        metadata = self.session.get_modelmeta().custom_metadata_map
        self.row_window = int(metadata.get(ROW_BY_ROW_WINDOW, 0))
        # The Mamba states after a prefix of a short call, from its window inputs (packages
        # built with a speculation window on the scan route); None without them.
        domain = metadata.get(RECURRENCE_DOMAIN)
        providers = self.session.get_providers()
        rewind = StateRewind(self.cache, outputs, domain, providers) if domain else None
        self.rewind = rewind if rewind is not None and rewind.layers else None
        self.call_past: dict[str, np.ndarray] = {}  # its Mamba states before the last call

    def check_ids(self, ids: np.ndarray) -> None:
        """ConfigError when a token id lies outside the decoder's vocabulary."""
        check_token_ids(ids, self.vocab_size)

    def step(
        self,
        tokens: np.ndarray,
        attention_mask: np.ndarray | None = None,
        logits_to_keep: int = 0,
    ) -> dict[str, np.ndarray]:
        """Run one call on input_ids [batch, new] (int) or, for a decoder that takes them,
        inputs_embeds [batch, new, hidden] (float, cast to the graph's type); attention_mask
        covers only the new tokens (default all ones). logits_to_keep > 0 asks for the logits
        of the last that many positions only (generation needs one; a decoder without the
        input returns all).

        The full past + current mask is passed, as the I/O contract requires. Returns every
        output by name and keeps the presents as the next past.
        """
        tokens = np.asarray(tokens)
        embeds = np.issubdtype(tokens.dtype, np.floating) or tokens.ndim == 3
        name = INPUTS_EMBEDS if embeds else INPUT_IDS
        if name not in self.inputs:
            given = "embeddings" if embeds else "token ids"
            raise ConfigError(f"this decoder takes no {name}; it was given {given}")
        if not embeds:
            self.check_ids(tokens)
        tokens = tokens.astype(self.inputs[name], copy=False)
        if self.mask is None:
            self.reset(tokens.shape[0])
        new_mask = (
            np.ones(tokens.shape[:2], dtype=np.int64)
            if attention_mask is None
            else np.asarray(attention_mask, dtype=np.int64)
        )
        assert self.mask is not None
        self.call_start = self.mask.shape[1]  # positions before this call (keep_prefix)
        self.mask = np.concatenate([self.mask, new_mask], axis=1)
        feeds = {name: tokens, ATTENTION_MASK: self.mask, **self.past}
        if logits_to_keep and self.keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(logits_to_keep, dtype=np.int64)
        results = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        if self.rewind is not None:
            self.call_past = {name: self.past[name] for name in self.rewind.past_names}
        self.past = {c.past_name: results[c.present_name] for c in self.cache}
        return results

    def keep_prefix(self, out: dict[str, np.ndarray], fed: int, kept: int) -> bool:
        """After the last call, over `fed` positions, which returned `out`: keep the state
        after its first `kept` positions only, as if only those had been fed (also after an
        earlier keep_prefix of the same call). Mamba states are re-derived from the call's
        window inputs (run/state_rewind.py) or taken from its state windows (slot kept - 1);
        attention K/V and the mask are cut on their sequence axis. Returns False, changing
        nothing, when the call cannot give it (a decoder without windows, or a call of more
        positions than its window); the caller then restores its own snapshot and re-runs
        the kept positions."""
        total = self.call_start + kept
        rewound = {} if self.rewind is None else self.rewind.states(self.call_past, out, fed, kept)
        if rewound is None:
            return False
        kept_past = {}
        for c in self.cache:
            window = out.get(self.windows.get(c.past_name, ""))
            if c.past_name in rewound:
                kept_past[c.past_name] = rewound[c.past_name]
            elif window is not None and window.shape[0] == fed:
                kept_past[c.past_name] = np.ascontiguousarray(window[kept - 1])
            elif c.past_name in self.windows or len(c.shape) != 4 or isinstance(c.shape[2], int):
                return False  # a state with no usable window and no sequence axis to cut
            else:  # attention K/V: [batch, kv_heads, past + fed, head_dim]
                kept_past[c.past_name] = self.past[c.past_name][:, :, :total]
        assert self.mask is not None
        self.past = kept_past
        self.mask = self.mask[:, :total]
        return True


def check_token_ids(ids: np.ndarray, vocab_size: int | None) -> None:
    """ConfigError naming the first token id outside [0, vocab_size)."""
    ids = np.asarray(ids)
    if vocab_size is None or ids.size == 0:
        return
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ConfigError(
            f"token id {int(bad.flat[0])} is outside this package's vocabulary (ids 0 to "
            f"{vocab_size - 1}): the model has no embedding for it. Give token ids below "
            f"{vocab_size}, and check that the tokenizer belongs to this checkpoint"
        )
