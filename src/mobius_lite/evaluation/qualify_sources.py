"""What qualify's reference reads: the source's config, and its weights as transformers loads them.

A safetensors checkpoint is read by transformers as it is. A source whose weights transformers
cannot load is first decoded into a dense FP32 safetensors checkpoint in a temporary directory,
with the released tensor names, so that the same transformers model runs on the values the
package's packed weights hold:
- a GGUF file (or split set): every tensor dequantized by gguf-py (`gguf.quants.dequantize`),
  then the converter's changes undone (models/nemotron_h_gguf.py records them: A = -exp(A_log)
  back to A_log, reshapes, the per-head q/k row order, stacked experts split per expert, a
  dropped `output` restored as token_embd);
- a ModelOpt checkpoint: NVFP4 and FP8 weights decoded by the numpy reference decodes
  (formats/modelopt), activation / KV scales dropped as the export drops them.
The decoded checkpoint takes as much disk as the model in FP32, and is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.gguf_metadata import config_from_checkpoint
from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.source_kinds import local_kind
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.gguf_file import GGUF, is_gguf
from mobius_lite.sources.modelopt_open import MODELOPT
from mobius_lite.sources.safetensors_files import SAFETENSORS

# the source kinds (source_kinds.SOURCE_KINDS) the reference reads
SAFETENSORS_SOURCE, GGUF_SOURCE, MODELOPT_SOURCE = SAFETENSORS, GGUF, MODELOPT
DENSE_FILE = "model.safetensors"
MAX_DIFFERENCES = 3
LM_HEAD = "lm_head.weight"
EMBEDDINGS = "backbone.embeddings.weight"


def source_kind(source: Path) -> str:
    """Which reader the reference needs: GGUF_SOURCE, MODELOPT_SOURCE or SAFETENSORS_SOURCE;
    ConfigError for anything qualify cannot read as a source."""
    if is_gguf(source):
        if not source.is_file():
            raise ConfigError(f"--source {source}: no such GGUF file")
        return GGUF_SOURCE
    if not source.is_dir():
        raise ConfigError(
            f"--source {source}: not a checkpoint directory or .gguf file; pass the checkpoint "
            "directory or the GGUF file the package was built from"
        )
    return local_kind(source).name


def source_config(source: Path, kind: str, package_raw: dict[str, Any]) -> dict[str, Any]:
    """The source's config dict. A GGUF carries only part of a config: the fields it lacks
    come from the package's config.json, every field it has is cross-checked against it."""
    if kind != GGUF_SOURCE:
        return read_config_json(source)
    from mobius_lite.sources.gguf_file import GGUFCheckpoint

    try:
        return config_from_checkpoint(GGUFCheckpoint(source), package_raw)
    except ConfigError as exc:
        message = str(exc).replace("config.json gives", "the package's config.json gives")
        raise ConfigError(
            f"--source {source} is not the model this package was built from: {message}; pass "
            "the GGUF file the package was exported from"
        ) from None


def spec_differences(a: Any, b: Any, path: str = "") -> list[str]:
    """`field.path a vs b` for every leaf field of two (nested) dataclasses that differs."""
    if dataclasses.is_dataclass(a) and type(a) is type(b):
        out: list[str] = []
        for item in dataclasses.fields(a):
            if item.compare:
                name = f"{path}.{item.name}" if path else item.name
                out += spec_differences(getattr(a, item.name), getattr(b, item.name), name)
        return out
    if a == b:
        return []
    if dataclasses.is_dataclass(a) or dataclasses.is_dataclass(b):  # e.g. another mixer kind
        return [f"{path} {type(a).__name__} vs {type(b).__name__}"]
    shown = [x.value if hasattr(x, "value") else x for x in (a, b)]
    return [f"{path} {shown[0]} vs {shown[1]}"]


def check_same_model(package: NemotronHConfig, source: NemotronHConfig, where: Path) -> None:
    """The source must describe the same decoder as the package, or nothing is comparable; the
    error names each differing field with both values."""
    problems = []
    for name in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if getattr(package, name) != getattr(source, name):
            problems.append(f"{name} {getattr(package, name)} vs {getattr(source, name)}")
    if not problems:
        for a, b in zip(package.layers, source.layers, strict=True):
            problems += [f"layer {a.index}: {d}" for d in spec_differences(a, b)]
    if problems:
        shown = problems[:MAX_DIFFERENCES]
        if len(problems) > MAX_DIFFERENCES:
            shown.append(f"{len(problems) - MAX_DIFFERENCES} more")
        raise ConfigError(
            f"--source {where} is not the model this package was built from (package vs "
            f"source: {'; '.join(shown)}); pass the checkpoint, or the .gguf file, the package "
            "was exported from"
        )


# ----------------------------------------------------------------------------- dense copies
def reference_checkpoint(
    source: Path,
    kind: str,
    raw_config: dict[str, Any],
    workdir: Path,
    keep: Callable[[str], bool] | None = None,
) -> Path:
    """A directory transformers loads for `source`: the source itself, or its dense FP32
    decode written into `workdir` (`keep`: only the tensors whose released name it accepts;
    the others are not decoded)."""
    if kind == SAFETENSORS_SOURCE:
        return source
    from safetensors.numpy import save_file

    tensors = _gguf_dense(source, keep) if kind == GGUF_SOURCE else _modelopt_dense(source)
    if keep is not None:
        tensors = {name: value for name, value in tensors.items() if keep(name)}
    config = {k: v for k, v in raw_config.items() if k != "quantization_config"}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(tensors, str(workdir / DENSE_FILE))
    return workdir


def is_head_reference_tensor(name: str) -> bool:
    """What the MTP head's reference reads (evaluation/mtp_reference.py): the head's own
    tensors, the embedding table and lm_head it shares with the decoder."""
    return name.startswith("mtp.") or name in (EMBEDDINGS, LM_HEAD)


def _gguf_dense(path: Path, keep: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file (or those whose released name `keep` accepts) dequantized
    by gguf-py, in the released layout and names, each weight times its `.scale` tensor
    where it has one (`.input_scale`: unused, as in the export)."""
    import gguf

    from mobius_lite.models.nemotron_h_gguf import (
        LayoutTransform,
        ValueTransform,
        nemotron_h_gguf_mapping,
    )
    from mobius_lite.sources.gguf_file import GGUFCheckpoint, split_parts

    stored = {
        tensor.name: tensor
        for part in split_parts(path)
        for tensor in gguf.GGUFReader(part).tensors
    }
    out: dict[str, np.ndarray] = {}
    for mapping in nemotron_h_gguf_mapping(GGUFCheckpoint(path)):
        if keep is not None and not keep(mapping.checkpoint_name):
            continue
        tensor = stored[mapping.gguf_name]
        values = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        values = values.reshape(mapping.gguf_shape)
        scale = stored.get(mapping.gguf_name.removesuffix(".weight") + ".scale")
        if scale is not None:  # llama.cpp's `.scale`: the weight is its blocks times it
            factor = np.asarray(scale.data, np.float32).reshape(-1)  # [1], or [E] for experts
            values = values * factor.reshape(-1, *(1,) * (values.ndim - 1))
        if mapping.layout is LayoutTransform.HEAD_ROW_PERMUTE:
            values = values[mapping.row_order()]
        if mapping.values is ValueTransform.NEGATED_EXP:
            values = np.log(-values)  # A = -exp(A_log)
        values = np.ascontiguousarray(values.reshape(mapping.checkpoint_shape))
        name = mapping.checkpoint_name
        if name.endswith(("experts.up_proj", "experts.down_proj")):
            prefix, proj = name.rsplit(".", 1)
            for expert, matrix in enumerate(values):
                out[f"{prefix}.{expert}.{proj}.weight"] = np.ascontiguousarray(matrix)
        else:
            out[name] = values
    if LM_HEAD not in out and EMBEDDINGS in out:
        # the converter drops `output` when it equals token_embd (llama.cpp then computes the
        # logits with token_embd); transformers would initialise a missing lm_head at random
        out[LM_HEAD] = out[EMBEDDINGS].copy()
    return out


def _modelopt_dense(directory: Path) -> dict[str, np.ndarray]:
    """Every weight of a ModelOpt checkpoint decoded to FP32 (NVFP4: codes x E4M3 block scale
    x global scale; FP8: E4M3 x scale); scales are consumed or, for activations / KV, dropped."""
    from mobius_lite.formats.modelopt import fp8, nvfp4
    from mobius_lite.formats.modelopt.storage import FP8WeightStorage, NVFP4CodeStorage
    from mobius_lite.source_kinds import local_tensors
    from mobius_lite.sources.modelopt_open import COMPANIONS, WEIGHT

    source = local_tensors(directory)
    out: dict[str, np.ndarray] = {}
    for name in source.names():
        if name.endswith(COMPANIONS):
            continue
        module = name.removesuffix(WEIGHT)
        storage = source.info(name).storage
        if isinstance(storage, NVFP4CodeStorage):
            scale_2 = np.asarray(source.read(module + ".weight_scale_2"), np.float32)
            dense = nvfp4.dequantize(
                source.read(name),
                source.read(module + ".weight_scale"),
                scale_2.reshape(()) if scale_2.size == 1 else scale_2,
                name,
            )
        elif isinstance(storage, FP8WeightStorage):
            scale = np.asarray(source.read(module + ".weight_scale"), np.float32)
            dense = fp8.dequantize(
                source.read(name), scale.reshape(()) if scale.size == 1 else scale, name
            )
        else:
            dense = source.read(name)
        out[name] = np.ascontiguousarray(np.asarray(dense, dtype=np.float32))
    return out
