"""OpenedCheckpoint: what a source kind yields for the checkpoint the user named.

Each source kind (source_kinds.py) opens its checkpoints into the raw config dict, a lazy
TensorSource (headers only) and the extra files a package carries (tokenizer, generation
config). `open_safetensors` is the opening safetensors checkpoints share (ModelOpt's too):
for hub ids only the small files are fetched until `with_weights` is called, so the config is
validated before any large download.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mobius_lite.layout import TOKENIZER_FILES
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.hub import ResolvedCheckpoint, fetch_weights, resolve_checkpoint
from mobius_lite.sources.safetensors_files import SAFETENSORS, SafetensorsCheckpoint


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint whose config is read; `tensors()` indexes its weights (headers only)."""

    kind: str  # the source kind's name (source_kinds.SOURCE_KINDS)
    raw_config: dict[str, Any]
    resolved: ResolvedCheckpoint
    # files the package carries: name -> a file to copy, or bytes made from the source
    extra_files: dict[str, Path | bytes] = field(default_factory=dict)
    open_tensors: Callable[[Path], TensorSource] = SafetensorsCheckpoint
    # source tensors the export deliberately does not use (name regex -> reason), beyond the
    # model's own rules: e.g. ModelOpt's activation scales
    unused_rules: dict[str, str] = field(default_factory=dict)
    # what a binding error tells the user to check (the config comes from this kind's files)
    binding_hint: str = "Check that config.json belongs to these weights."
    # why `--dequantize` cannot export it (one sentence from its config), None when it can
    dequantize_refusal: str | None = None
    # why `--quantize-output` alone cannot quantize its lm_head (one sentence: a GGUF's is
    # already a GGUF type, a ModelOpt config quantizes it), None when its lm_head is dense
    output_quantize_refusal: str | None = None

    def with_weights(self) -> OpenedCheckpoint:
        """The same checkpoint with its weight files present (hub: the same commit's)."""
        return replace(self, resolved=fetch_weights(self.resolved))

    def tensors(self) -> TensorSource:
        return self.open_tensors(self.resolved.path)


def open_safetensors(model: str | Path, revision: str | None = None) -> OpenedCheckpoint:
    """A checkpoint directory (or hub id at its pin) of config.json + *.safetensors: config
    and tokenizer files read, weights not yet fetched."""
    resolved = resolve_checkpoint(model, revision, weights=False)
    raw = read_config_json(resolved.path)
    extras = {f: resolved.path / f for f in TOKENIZER_FILES if (resolved.path / f).is_file()}
    return OpenedCheckpoint(SAFETENSORS, raw, resolved, extras)


def local_checkpoint(path: Path) -> OpenedCheckpoint:
    """A local checkpoint directory as opened, without the hub (verify's re-read)."""
    resolved = ResolvedCheckpoint(path=path, model=str(path), revision=None, hub=False)
    return OpenedCheckpoint(SAFETENSORS, read_config_json(path), resolved)
