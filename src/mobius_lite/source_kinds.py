"""The source kinds: how a checkpoint is stored, as data (safetensors, ModelOpt, GGUF, memory).

Each entry owns its detection (by the name the user gave, or by a safetensors checkpoint's
config), its opening (config reader, extra files, lazy tensor index), how a package's
recorded source is found again (verify, qualify), whether a quantization its config declares
exports packed, its layout (the name map and conventions the model's tensors take in it), and
what qualify's transformers reference reads from it: its config, and the dense FP32
checkpoint its weights stand for (named "module:function", as model types name their
reference: that code is evaluation's, layers above this one, imported only when qualify runs).
`open_checkpoint`, `local_tensors`, `resolve_source` and `layout_of` dispatch through the
entries; adding a source kind is one entry here plus its own modules (sources/ for the
files, formats/ for the storage, models/ for the name map, evaluation/ for the reference
checkpoint when transformers cannot read its files).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobius_lite.configs.gguf_metadata import config_from_checkpoint
from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.models.nemotron_h_gguf import gguf_source_layout
from mobius_lite.models.nemotron_h_names import (
    SourceLayout,
    modelopt_source_layout,
    safetensors_source_layout,
)
from mobius_lite.models.omni_names import DECODER_SCOPES
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.gguf_file import GGUF, GGUFCheckpoint, is_gguf
from mobius_lite.sources.gguf_open import open_gguf, resolve_gguf
from mobius_lite.sources.hub import ResolvedCheckpoint, resolve_checkpoint
from mobius_lite.sources.memory import MEMORY
from mobius_lite.sources.modelopt_open import MODELOPT, is_modelopt, open_modelopt
from mobius_lite.sources.open import OpenedCheckpoint, local_checkpoint, open_safetensors
from mobius_lite.sources.safetensors_files import SAFETENSORS, SafetensorsCheckpoint

# (model as named, revision, gguf_file, config_json) -> the opened checkpoint
Opener = Callable[[str | Path, str | None, str | None, str | Path | None], OpenedCheckpoint]


def _no_name(model: str | Path, gguf_file: str | None) -> bool:
    return False


def _no_config(raw: Mapping[str, Any], directory: Path) -> bool:
    return False


def _as_is(opened: OpenedCheckpoint) -> OpenedCheckpoint:
    return opened


def _checkpoint_dir(source: str, revision: str | None) -> ResolvedCheckpoint:
    return resolve_checkpoint(source, revision, weights=True)


def _own_config(path: Path, known: Mapping[str, Any] | None) -> dict[str, Any]:
    return read_config_json(path)


# The reference checkpoints (evaluation/dense_reference.py): each takes a ReferenceRequest
# (the local source, its config dict, a scratch directory, the tensors wanted, the recipes of
# the tensors a package quantized at export) and returns the directory transformers loads.
DENSE_REFERENCE = "mobius_lite.evaluation.dense_reference"
AS_STORED = f"{DENSE_REFERENCE}:as_stored"


@dataclass(frozen=True)
class SourceKind:
    """One way a checkpoint is stored (see the module doc)."""

    name: str
    layout: Callable[[TensorSource], SourceLayout]
    # a package's recorded source (a path or hub id, at a revision) with its weights present
    resolve: Callable[[str, str | None], ResolvedCheckpoint] = _checkpoint_dir
    # the tensor index of a local checkpoint of this kind
    local_tensors: Callable[[Path], TensorSource] = SafetensorsCheckpoint
    # detection by the name the user gave (a file kind), with its opener
    claims_name: Callable[[str | Path, str | None], bool] = _no_name
    open: Opener | None = None
    # detection by a safetensors checkpoint's config (a kind of safetensors checkpoint), with
    # what it makes of the checkpoint opened as plain safetensors
    claims_config: Callable[[Mapping[str, Any], Path], bool] = _no_config
    refine: Callable[[OpenedCheckpoint], OpenedCheckpoint] = _as_is
    # whether a quantization its config declares exports packed (routes.check_weight_format)
    keeps_quantization: bool = False
    # the config dict of a local source of this kind; `known` (a package's config.json)
    # supplies the fields the source does not carry, and is cross-checked against the rest
    local_config: Callable[[Path, Mapping[str, Any] | None], dict[str, Any]] = _own_config
    # qualify: "module:function" turning a local source of this kind into the dense FP32
    # checkpoint transformers loads (see DENSE_REFERENCE), and what that checkpoint holds,
    # as qualify's report says it
    reference: str = AS_STORED
    reference_description: str = "the checkpoint's tensors, loaded by transformers"

    def reference_checkpoint(self) -> Callable[..., Path]:
        """The reference checkpoint function, imported now (evaluation sits above this)."""
        module, _, function = self.reference.partition(":")
        return getattr(importlib.import_module(module), function)


def _gguf_layout(source: TensorSource) -> SourceLayout:
    if not isinstance(source, GGUFCheckpoint):
        raise TypeError(f"a GGUF layout needs a GGUFCheckpoint, not {type(source).__name__}")
    return gguf_source_layout(source)


def _open_gguf(
    model: str | Path,
    revision: str | None,
    gguf_file: str | None,
    config_json: str | Path | None,
) -> OpenedCheckpoint:
    return open_gguf(model, config_from_checkpoint, revision, gguf_file, config_json)


def _resolve_gguf(source: str, revision: str | None) -> ResolvedCheckpoint:
    return resolve_gguf(source, revision)


def _gguf_config(path: Path, known: Mapping[str, Any] | None) -> dict[str, Any]:
    return config_from_checkpoint(GGUFCheckpoint(path), known)


def _open_modelopt(opened: OpenedCheckpoint) -> OpenedCheckpoint:
    # an Omni checkpoint's decoder modules, named in its quantization config with or without
    # their language_model. prefix
    return open_modelopt(opened, DECODER_SCOPES)


def _local_modelopt(path: Path) -> TensorSource:
    return _open_modelopt(local_checkpoint(path)).tensors()


GGUF_KIND = SourceKind(
    name=GGUF,
    layout=_gguf_layout,
    resolve=_resolve_gguf,
    local_tensors=GGUFCheckpoint,
    claims_name=lambda model, gguf_file: is_gguf(model) or gguf_file is not None,
    open=_open_gguf,
    local_config=_gguf_config,
    reference=f"{DENSE_REFERENCE}:gguf_decoded",
    reference_description="the GGUF tensors dequantized to FP32 by gguf-py, converter changes "
    "undone",
)
MODELOPT_KIND = SourceKind(
    name=MODELOPT,
    layout=modelopt_source_layout,
    local_tensors=_local_modelopt,
    claims_config=is_modelopt,
    refine=_open_modelopt,
    keeps_quantization=True,
    reference=f"{DENSE_REFERENCE}:modelopt_decoded",
    reference_description="the ModelOpt weights decoded to FP32 (NVFP4 / FP8 reference decodes)",
)
SAFETENSORS_KIND = SourceKind(name=SAFETENSORS, layout=safetensors_source_layout)
# build_from_module's state dict: named like a safetensors checkpoint, never named by a path
MEMORY_KIND = SourceKind(name=MEMORY, layout=safetensors_source_layout)

# In detection order; plain safetensors is what no other kind claims.
SOURCE_KINDS: dict[str, SourceKind] = {
    k.name: k for k in (GGUF_KIND, MODELOPT_KIND, SAFETENSORS_KIND, MEMORY_KIND)
}


def _named_kind(model: str | Path, gguf_file: str | None = None) -> SourceKind | None:
    return next((k for k in SOURCE_KINDS.values() if k.claims_name(model, gguf_file)), None)


def _configured_kind(raw: Mapping[str, Any], directory: Path) -> SourceKind:
    claimed = (k for k in SOURCE_KINDS.values() if k.claims_config(raw, directory))
    return next(claimed, SAFETENSORS_KIND)


def open_checkpoint(
    model: str | Path,
    revision: str | None = None,
    *,
    gguf_file: str | None = None,
    config_json: str | Path | None = None,
) -> OpenedCheckpoint:
    """A local checkpoint directory, a .gguf file, or a hub id (at its pin): config read,
    weights not yet. `gguf_file` picks one GGUF file of a hub repository; `config_json`
    supplies the fields a GGUF file does not carry (cross-checked against its metadata)."""
    named = _named_kind(model, gguf_file)
    if named is not None and named.open is not None:
        return named.open(model, revision, gguf_file, config_json)
    opened = open_safetensors(model, revision)
    if config_json is not None:  # it was silently ignored: the checkpoint's own config ruled
        raise ConfigError(
            f"--config {config_json} (config=...) supplies the fields a GGUF file does not "
            f"carry; {model} is a safetensors checkpoint, whose own config.json is used: drop "
            "--config, or edit that config.json"
        )
    return _configured_kind(opened.raw_config, opened.resolved.path).refine(opened)


def local_kind(path: str | Path) -> SourceKind:
    """The source kind of a local checkpoint (directory, .safetensors or .gguf file)."""
    path = Path(path)
    kind = _named_kind(path)
    if kind is None:
        kind = SAFETENSORS_KIND
        if path.is_dir() and (path / CONFIG_FILE).is_file():
            kind = _configured_kind(local_checkpoint(path).raw_config, path)
    return kind


def local_tensors(path: str | Path) -> TensorSource:
    """The tensor index of a local checkpoint (directory, .safetensors or .gguf file), with
    each tensor's storage as an export sees it (a ModelOpt checkpoint's packed weights too)."""
    return local_kind(path).local_tensors(Path(path))


def resolve_source(source: str | Path, revision: str | None = None) -> ResolvedCheckpoint:
    """A package's source checkpoint (as recorded or given) with its weights present."""
    kind = _named_kind(source) or SAFETENSORS_KIND
    return kind.resolve(str(source), revision)


def layout_of(source: TensorSource) -> SourceLayout:
    """The name map and conventions of a tensor source's kind."""
    if source.kind not in SOURCE_KINDS:
        raise ConfigError(
            f"{type(source).__name__}: unknown source kind {source.kind!r}; known: "
            f"{', '.join(SOURCE_KINDS)}"
        )
    return SOURCE_KINDS[source.kind].layout(source)
