"""The one greedy loop: prefill a prompt, then one cached decoder call per chosen token
(the argmax of the last position's logits) until enough tokens or a stop token, and the
token helpers around it (stop ids from a config, a token as the next input, the empty-prompt
check). `mobius generate`, OmniSession, the qualification harness and tests generate through
it. Requires the `runtime` extra.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from mobius_lite.errors import ConfigError
from mobius_lite.io_contract import LOGITS
from mobius_lite.run.decoder_session import DecoderSession


def stop_token_ids(eos_token_id: int | Sequence[int] | None) -> set[int]:
    """A config's end-of-sequence id (one, several, or none) as the set greedy stops at."""
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple)):
        return {int(t) for t in eos_token_id}
    return {int(eos_token_id)}


def token_input(token: int) -> np.ndarray:
    """The decoder input of one generated token: input_ids [[token]]."""
    return np.array([[token]], dtype=np.int64)


class Generation(NamedTuple):
    """What `greedy` returns: the tokens chosen after each call, and every call's outputs
    (prefill first; empty unless `greedy` was asked to keep them)."""

    tokens: list[int]
    outputs: list[dict[str, np.ndarray]]


def check_prompt(prompt: np.ndarray) -> None:
    """ConfigError for a prompt of no positions: the decoder's prefill cannot run on it (an
    onnxruntime Reshape failure), and there is no last position to pick a token from."""
    shape = np.asarray(prompt).shape
    if len(shape) < 2 or shape[1] == 0:
        raise ConfigError(
            f"the prompt is empty (shape {list(shape)}): generation needs at least one prompt token"
        )


def greedy_tokens(
    decoder: DecoderSession,
    prompt: np.ndarray,
    max_new_tokens: int,
    *,
    next_input: Callable[[int], np.ndarray] = token_input,
    stop_tokens: Collection[int] = (),
    forced: Sequence[int] | None = None,
    prefill_logits: int = 1,
    outputs: list[dict[str, np.ndarray]] | None = None,
) -> Iterator[int]:
    """Greedy decoding from a fresh cache, one token at a time as it is chosen: prefill
    `prompt` (input_ids [1, n] or inputs_embeds [1, n, hidden]), then one cached call per
    token, until `max_new_tokens` tokens are chosen or a stop token is. The token chosen
    after a call is the argmax of its last position's logits; `next_input` turns it into the
    next call's input (an Omni package embeds it first). `forced` feeds those tokens instead
    of the chosen ones (a twin run on another run's tokens). `prefill_logits`: positions of
    prefill logits to keep (0: all, for comparisons). Calls made: at most `max_new_tokens`.

    Nothing is kept per token (the decoder holds the cache; each call's outputs are dropped
    once its token is chosen), so memory does not grow with the tokens beyond the cache
    itself, unless `outputs` is a list: then every call's outputs are appended to it.
    """
    check_prompt(prompt)
    decoder.reset(np.asarray(prompt).shape[0])
    out = decoder.step(prompt, logits_to_keep=prefill_logits)
    made = 0
    while True:
        if outputs is not None:
            outputs.append(out)
        token = int(np.argmax(out[LOGITS][0, -1]))
        del out  # the logits and presents of this call (the decoder keeps the presents)
        made += 1
        yield token
        if token in stop_tokens or made >= max_new_tokens:
            return
        fed = forced[made - 1] if forced is not None else token
        out = decoder.step(next_input(fed), logits_to_keep=1 if prefill_logits else 0)


def greedy(
    decoder: DecoderSession,
    prompt: np.ndarray,
    max_new_tokens: int,
    *,
    next_input: Callable[[int], np.ndarray] = token_input,
    stop_tokens: Collection[int] = (),
    forced: Sequence[int] | None = None,
    prefill_logits: int = 1,
    keep_outputs: bool = True,
) -> Generation:
    """`greedy_tokens` run to the end: the tokens, and (with `keep_outputs`, for the
    comparisons qualify and the tests make) every call's outputs, prefill first. Keeping
    them holds every call's logits and cache arrays; `mobius generate` keeps none."""
    kept: list[dict[str, np.ndarray]] | None = [] if keep_outputs else None
    tokens = list(
        greedy_tokens(
            decoder,
            prompt,
            max_new_tokens,
            next_input=next_input,
            stop_tokens=stop_tokens,
            forced=forced,
            prefill_logits=prefill_logits,
            outputs=kept,
        )
    )
    return Generation(tokens, kept or [])
