"""transformers eager (torch FP32) on the package's source checkpoint as a peer: the model
loaded the way qualify loads its reference, stepped on its own cache like the package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.measure import Tick, Timed, timed_call
from mobius_lite.configs.model_types import model_type_of
from mobius_lite.enums import LayerKind, Task
from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.optional import require
from mobius_lite.sources.config_json import read_config_json

PURPOSE = "timing transformers on a checkpoint"


def check_checkpoint(checkpoint: Path, device: str = "cpu") -> None:
    """ConfigError unless `checkpoint` is a text checkpoint folder transformers can load (on
    `device`); MissingPackageError when torch or transformers is not installed. Before any
    weight is read."""
    if not (checkpoint / CONFIG_FILE).is_file():
        raise ConfigError(
            f"{checkpoint} is not a checkpoint folder (no {CONFIG_FILE}); give the folder of "
            "the safetensors checkpoint the package was built from"
        )
    if model_type_of(read_config_json(checkpoint)).task is not Task.TEXT_GENERATION:
        raise ConfigError(
            f"{checkpoint} is not a text-generation checkpoint; the transformers peer times "
            "text models only"
        )
    torch = require("torch", PURPOSE)
    require("transformers", PURPOSE)
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "this torch sees no CUDA device, so transformers cannot run on the GPU; install "
            "a CUDA build of torch, or time on the CPU"
        )


class TransformersPeer:
    """The checkpoint in transformers, eager attention and experts, torch FP32 (`device` cpu
    or cuda)."""

    name = "transformers"

    def __init__(self, checkpoint: Path, device: str, threads: int, decode_tokens: int) -> None:
        self.checkpoint = checkpoint
        self.device = device
        self.threads = threads
        self.calls_per_pass = 1 + decode_tokens
        self.description = f"{checkpoint} in transformers eager, torch FP32 on {device}"
        self.model: Any = None
        self.has_attention = True

    def open(self) -> None:
        import torch

        from mobius_lite.configs.model_types import read_config
        from mobius_lite.evaluation.reference import load_reference

        torch.set_num_threads(self.threads)
        raw = read_config_json(self.checkpoint)
        _, config = read_config(raw)
        self.has_attention = any(layer.kind is LayerKind.ATTENTION for layer in config.layers)
        self.model = load_reference(self.checkpoint, raw["model_type"]).to(self.device)

    def run(self, prompt: list[int], decode_tokens: int, tick: Tick) -> Timed:
        import torch

        assert self.model is not None, "open() first"
        state: dict[str, Any] = {"cache": None, "length": 0}

        def call(ids: list[int]) -> int:
            out = self._forward(ids, state)
            return int(out.logits[0, -1].argmax())  # .item() waits for the device

        with torch.inference_mode():
            token, prefill_s = timed_call(lambda: call(prompt))
            tick()
            tokens, decode_s = [int(token)], []
            for _ in range(decode_tokens):
                token, seconds = timed_call(lambda: call([tokens[-1]]))
                tick()
                decode_s.append(seconds)
                tokens.append(int(token))
        return Timed(prefill_s, decode_s, tokens)

    def _forward(self, ids: list[int], state: dict[str, Any]) -> Any:
        """One call continuing the cache in `state`, as evaluation.reference.ReferenceRunner
        makes it (without its per-call copies of every cache array)."""
        import torch

        tensor = torch.from_numpy(np.array([ids], dtype=np.int64)).to(self.device)
        total = state["length"] + len(ids)
        mask: Any = torch.ones((1, total), dtype=torch.int64, device=self.device)
        if not self.has_attention:
            # transformers builds its causal mask from the cache's attention layers and fails
            # when there are none (the same rule as ReferenceRunner)
            mask = {"full_attention": None, "linear_attention": None}
        positions = torch.arange(state["length"], total, device=self.device)[None]
        cache = state["cache"]
        out = self.model(
            tensor, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        state["cache"] = out.cache if hasattr(out, "cache") else out.past_key_values
        state["length"] = total
        return out
