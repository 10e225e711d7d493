"""open_checkpoint: one entry point from "what the user named" to config, tensors and files.

Each source kind (a safetensors directory today; a .gguf file next) yields the raw config
dict, a lazy TensorSource and the extra files a package carries (tokenizer, generation
config). For hub ids only the small files are fetched until `fetch_weights` is called, so the
config is validated before any large download.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mobius_lite.layout import TOKENIZER_FILES
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.hub import ResolvedCheckpoint, fetch_weights, resolve_checkpoint
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

SAFETENSORS = "safetensors"


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint whose config is read; `tensors()` indexes its weights (headers only)."""

    kind: str  # which name map applies: "safetensors" (also in-memory state dicts)
    raw_config: dict[str, Any]
    resolved: ResolvedCheckpoint
    extra_files: list[Path] = field(default_factory=list)

    def with_weights(self) -> OpenedCheckpoint:
        """The same checkpoint with its weight files present (hub: the same commit's)."""
        return replace(self, resolved=fetch_weights(self.resolved))

    def tensors(self) -> TensorSource:
        return SafetensorsCheckpoint(self.resolved.path)


def open_checkpoint(model: str | Path, revision: str | None = None) -> OpenedCheckpoint:
    """A local checkpoint directory or a hub id (at its pin), config read, weights not yet."""
    resolved = resolve_checkpoint(model, revision, weights=False)
    raw = read_config_json(resolved.path)
    extras = [resolved.path / f for f in TOKENIZER_FILES if (resolved.path / f).is_file()]
    return OpenedCheckpoint(SAFETENSORS, raw, resolved, extras)
