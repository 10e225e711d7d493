"""An onnxruntime session that carries its own cache between calls: the cache inputs paired
with the present outputs they take their next values from, each input's element type and
the output names, all read from the session (the decoder's stepper and the MTP head build on
it). Requires the `runtime` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import PackageError
from mobius_lite.io_contract import LOGITS_TO_KEEP, PAST_PREFIX, present_of
from mobius_lite.run.ort_session import create_session, input_dtypes, numpy_dtype, quiet_options


@dataclass(frozen=True)
class CacheInput:
    """One past_key_values.* input of a decoder session and the present.* output it takes
    its next value from: name, dtype and shape as the session declares them."""

    past_name: str
    present_name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    def empty(self, batch: int) -> np.ndarray:
        """Zeros for a fresh sequence: batch on axis 0, every other named axis (the past
        length of attention K/V) 0."""
        dims = [batch] + [d if isinstance(d, int) else 0 for d in self.shape[1:]]
        return np.zeros(dims, dtype=self.dtype)


def cache_inputs(session: Any) -> list[CacheInput]:
    """The session's cache inputs, in input order, each paired with its present output."""
    outputs = {o.name for o in session.get_outputs()}
    found = []
    for i in session.get_inputs():
        if not i.name.startswith(PAST_PREFIX):
            continue
        present = present_of(i.name)
        if present not in outputs:
            raise PackageError(f"the decoder has a cache input {i.name} but no output {present}")
        found.append(CacheInput(i.name, present, numpy_dtype(i.type), tuple(i.shape)))
    return found


class CachedSession:
    """An onnxruntime session that carries its own cache: the cache inputs, every input's
    element type and the output names are read from the session (decoder and MTP head)."""

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        # onnxruntime's memory pattern is planned and kept per set of input shapes; a cached
        # stepper gives every call a new past length, so each token would add one plan that
        # is never used again (about 7 KB a token on a tiny decoder: 70 MB at 10,000 tokens).
        session_options = quiet_options(session_options)
        session_options.enable_mem_pattern = False
        self.session = create_session(model, providers, session_options)
        self.cache = cache_inputs(self.session)
        self.inputs = input_dtypes(self.session)
        self.output_names = [o.name for o in self.session.get_outputs()]
        # an input with a default is an overridable initializer; packages exported before
        # the input existed have no logits_to_keep
        self.keeps_logits = LOGITS_TO_KEEP in self.inputs or LOGITS_TO_KEEP in {
            i.name for i in self.session.get_overridable_initializers()
        }
        self.past: dict[str, np.ndarray] = {}
        self.mask: np.ndarray | None = None
        self.call_start = 0  # positions the cache held before the last call

    def reset(self, batch: int) -> None:
        """Start a fresh sequence (empty caches)."""
        self.past = {c.past_name: c.empty(batch) for c in self.cache}
        self.mask = np.zeros((batch, 0), dtype=np.int64)
