"""Run an exported decoder with onnxruntime: empty caches from the cache ABI, prefill, decode.

The one decoder stepper: the qualification harness, benchmarks, examples and tests all drive
packages through DecoderSession. Requires the `runtime` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_lite.configs import NemotronHConfig
from mobius_lite.graphs.cache import BATCH, PAST, CacheTensor, cache_tensors
from mobius_lite.graphs.decoder import LOGITS_TO_KEEP

CPU = "CPUExecutionProvider"
PROVIDERS = {"cpu": [CPU], "cuda": ["CUDAExecutionProvider", CPU]}


def empty_cache(cache: list[CacheTensor], batch: int) -> dict[str, np.ndarray]:
    """Zero past states for a fresh sequence (attention KV with past length 0)."""
    out = {}
    for c in cache:
        shape = [batch if d == BATCH else 0 if d == PAST else int(d) for d in c.past_shape]
        out[c.past_name] = np.zeros(shape, dtype=c.dtype.numpy())
    return out


def session_providers(ep: str) -> list[str]:
    """onnxruntime provider names for --ep cpu / cuda; RouteError when this onnxruntime lacks
    the provider (it would otherwise fall back to the CPU silently)."""
    import onnxruntime as ort

    from mobius_lite.errors import RouteError
    from mobius_lite.routes import parse_provider

    providers = PROVIDERS[parse_provider(ep)]
    available = set(ort.get_available_providers())
    if not set(providers) <= available:
        raise RouteError(
            f"this onnxruntime has no {providers[0]} (it has {', '.join(sorted(available))}); "
            "install onnxruntime-gpu for --ep cuda, or use --ep cpu"
        )
    return providers


def quiet_options(options: Any = None) -> Any:
    """onnxruntime SessionOptions that log errors only, unless a severity was set: the one
    warning a decoder load gives is that its logits_to_keep input has a default value (an
    initializer), which is the design (graphs/decoder.py)."""
    import onnxruntime as ort

    options = options if options is not None else ort.SessionOptions()
    if options.log_severity_level == -1:
        options.log_severity_level = 3
    return options


class DecoderSession:
    """An onnxruntime session over a package's decoder that carries its own cache.

    `model` is the decoder file or serialized model bytes (an instrumented twin);
    `session_options` may enable profiling or point external data at the package.
    """

    def __init__(
        self,
        model: str | Path | bytes,
        config: NemotronHConfig,
        dtype: ir.DataType = ir.DataType.FLOAT,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(
            model if isinstance(model, bytes) else str(model),
            sess_options=quiet_options(session_options),
            providers=providers or [CPU],
        )
        self.cache = cache_tensors(config.layers, dtype)
        self.output_names = [o.name for o in self.session.get_outputs()]
        # Packages exported before the input existed have no logits_to_keep.
        self.keeps_logits = LOGITS_TO_KEEP in {
            i.name
            for i in (*self.session.get_inputs(), *self.session.get_overridable_initializers())
        }
        self.past: dict[str, np.ndarray] = {}
        self.mask: np.ndarray | None = None

    def reset(self, batch: int) -> None:
        """Start a fresh sequence (empty caches)."""
        self.past = empty_cache(self.cache, batch)
        self.mask = np.zeros((batch, 0), dtype=np.int64)

    def step(
        self,
        tokens: np.ndarray,
        attention_mask: np.ndarray | None = None,
        logits_to_keep: int = 0,
    ) -> dict[str, np.ndarray]:
        """Run one call on input_ids [batch, new] (int) or, for a decoder that takes them,
        inputs_embeds [batch, new, hidden] (float); attention_mask covers only the new tokens
        (default all ones). logits_to_keep > 0 asks for the logits of the last that many
        positions only (generation needs one; a decoder without the input returns all).

        The full past + current mask is passed, as the I/O contract requires. Returns every
        output by name and keeps the presents as the next past.
        """
        tokens = np.asarray(tokens)
        embeds = np.issubdtype(tokens.dtype, np.floating) or tokens.ndim == 3
        if not embeds:
            tokens = tokens.astype(np.int64)
        if self.mask is None:
            self.reset(tokens.shape[0])
        new_mask = (
            np.ones(tokens.shape[:2], dtype=np.int64)
            if attention_mask is None
            else np.asarray(attention_mask, dtype=np.int64)
        )
        assert self.mask is not None
        self.mask = np.concatenate([self.mask, new_mask], axis=1)
        name = "inputs_embeds" if embeds else "input_ids"
        feeds = {name: tokens, "attention_mask": self.mask, **self.past}
        if logits_to_keep and self.keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(logits_to_keep, dtype=np.int64)
        results = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: results[c.present_name] for c in self.cache}
        return results
