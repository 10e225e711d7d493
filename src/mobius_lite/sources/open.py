"""open_checkpoint: one entry point from "what the user named" to config, tensors and files.

Each source kind yields the raw config dict, a lazy TensorSource (headers only) and the extra
files a package carries (tokenizer, generation config):
- "safetensors": a checkpoint directory (or hub id) of config.json + *.safetensors;
- "gguf": a llama.cpp .gguf file or split set (sources/gguf_open.py);
- "modelopt": a safetensors checkpoint quantized by NVIDIA ModelOpt (NVFP4 / FP8 / mixed),
  whose tensors' storage says which are packed (sources/modelopt_open.py).
For hub ids only the small files are fetched until `with_weights` is called, so the config is
validated before any large download.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mobius_lite.layout import CONFIG_FILE, TOKENIZER_FILES
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.hub import ResolvedCheckpoint, fetch_weights, resolve_checkpoint
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

SAFETENSORS = "safetensors"
GGUF = "gguf"
MODELOPT = "modelopt"
GGUF_SUFFIX = ".gguf"


@dataclass(frozen=True)
class OpenedCheckpoint:
    """A checkpoint whose config is read; `tensors()` indexes its weights (headers only)."""

    kind: str  # which name map and conventions apply (SAFETENSORS, GGUF)
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

    def with_weights(self) -> OpenedCheckpoint:
        """The same checkpoint with its weight files present (hub: the same commit's)."""
        return replace(self, resolved=fetch_weights(self.resolved))

    def tensors(self) -> TensorSource:
        return self.open_tensors(self.resolved.path)


def is_gguf(model: str | Path) -> bool:
    return str(model).lower().endswith(GGUF_SUFFIX)


def open_checkpoint(
    model: str | Path,
    revision: str | None = None,
    *,
    gguf_file: str | None = None,
    config_json: str | Path | None = None,
    read_gguf_config: Callable[..., dict[str, Any]] | None = None,
) -> OpenedCheckpoint:
    """A local checkpoint directory, a .gguf file, or a hub id (at its pin): config read,
    weights not yet. `gguf_file` picks one GGUF file of a hub repository; `config_json`
    supplies the fields a GGUF file does not carry (cross-checked against its metadata) and
    `read_gguf_config` reads them (configs/gguf_metadata.config_from_checkpoint; configs sit
    above sources, so the caller hands it in)."""
    if is_gguf(model) or gguf_file is not None:
        from mobius_lite.sources.gguf_open import open_gguf

        if read_gguf_config is None:
            raise ValueError("opening a GGUF file needs read_gguf_config")
        return open_gguf(
            model, read_gguf_config, revision, gguf_file=gguf_file, config_json=config_json
        )
    resolved = resolve_checkpoint(model, revision, weights=False)
    raw = read_config_json(resolved.path)
    extras = {f: resolved.path / f for f in TOKENIZER_FILES if (resolved.path / f).is_file()}
    opened = OpenedCheckpoint(SAFETENSORS, raw, resolved, extras)
    if is_modelopt(raw, resolved.path):
        from mobius_lite.sources.modelopt_open import open_modelopt

        return open_modelopt(opened)
    return opened


def is_modelopt(raw_config: dict[str, Any], directory: Path) -> bool:
    """config.json's quantization_config says quant_method "modelopt", or the directory has
    ModelOpt's hf_quant_config.json."""
    quant = raw_config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method == MODELOPT or (directory / "hf_quant_config.json").is_file()


def local_tensors(path: str | Path) -> TensorSource:
    """The tensor index of a local checkpoint (directory, .safetensors or .gguf file), with
    each tensor's storage as an export sees it (a ModelOpt checkpoint's packed weights too)."""
    path = Path(path)
    if is_gguf(path):
        from mobius_lite.sources.gguf_file import GGUFCheckpoint

        return GGUFCheckpoint(path)
    if path.is_dir() and (path / CONFIG_FILE).is_file():
        raw = read_config_json(path)
        if is_modelopt(raw, path):
            from mobius_lite.sources.modelopt_open import open_modelopt

            resolved = ResolvedCheckpoint(path=path, model=str(path), revision=None, hub=False)
            return open_modelopt(OpenedCheckpoint(SAFETENSORS, raw, resolved)).tensors()
    return SafetensorsCheckpoint(path)
