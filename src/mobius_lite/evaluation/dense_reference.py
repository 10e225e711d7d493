"""The checkpoints qualify's transformers reference loads, one function per source kind.

Each source kind names its function here (`SourceKind.reference`, source_kinds.py). A
safetensors checkpoint is read by transformers as it is. A source whose weights transformers
cannot load is first decoded into a dense FP32 safetensors checkpoint in a scratch directory,
with the released tensor names, so that the same transformers model runs on the values the
package's packed weights hold:
- a GGUF file (or split set): every tensor dequantized by gguf-py (`gguf.quants.dequantize`),
  then the converter's changes undone (models/nemotron_h_gguf.py records them: A = -exp(A_log)
  back to A_log, reshapes, the per-head q/k row order, stacked experts split per expert, a
  dropped `output` restored as token_embd);
- a ModelOpt checkpoint: NVFP4 and FP8 weights decoded by the numpy reference decodes
  (formats/modelopt), activation / KV scales dropped as the export drops them; a package that
  quantized its dense lm_head at export (`--quantize-output` alone) has it dequantized as
  below;
- a package quantized at export (`--quantize` / `--quantize-output`, a dense safetensors
  source): the source with each tensor the manifest records as quantized replaced by its
  dequantized value (evaluation/quantized_reference.py).
A decoded checkpoint takes as much disk as the model in FP32; the caller removes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.quantized_reference import (
    DENSE_FILE,
    dequantized,
    write_dequantized_checkpoint,
)
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.models.nemotron_h_names import (
    EMBEDDING_WEIGHT,
    LM_HEAD_WEIGHT,
    MTP_PREFIX,
    STACKED_EXPERTS,
    expert_names,
)


@dataclass(frozen=True)
class ReferenceRequest:
    """What a reference checkpoint function is asked for: `source` (a local checkpoint of its
    kind) with its config dict `raw_config`, written, when it must be, into `workdir`; `keep`:
    only the tensors whose released name it accepts (None: all); `recipes`: the tensors the
    package quantized at export (released name -> Recipe)."""

    source: Path
    raw_config: Mapping[str, Any]
    workdir: Path
    keep: Callable[[str], bool] | None = None
    recipes: Mapping[str, Recipe] = field(default_factory=dict)


def is_head_reference_tensor(name: str) -> bool:
    """What the MTP head's reference reads (evaluation/mtp_reference.py): the head's own
    tensors, the embedding table and lm_head it shares with the decoder."""
    return name.startswith(MTP_PREFIX) or name in (EMBEDDING_WEIGHT, LM_HEAD_WEIGHT)


def as_stored(request: ReferenceRequest) -> Path:
    """A dense safetensors checkpoint: the source itself, or, for a package quantized at export,
    its copy with those tensors dequantized."""
    if not request.recipes:
        return request.source
    return write_dequantized_checkpoint(
        request.source,
        dict(request.recipes),
        dict(request.raw_config),
        request.workdir,
        request.keep,
    )


def gguf_decoded(request: ReferenceRequest) -> Path:
    """A GGUF file (or split set) decoded to the released tensors, in FP32."""
    _no_recipes(request, "a GGUF file")
    return _write_dense(_gguf_dense(request.source, request.keep), request)


def modelopt_decoded(request: ReferenceRequest) -> Path:
    """A ModelOpt checkpoint with every weight decoded to FP32; the dense tensors the package
    quantized at export (`--quantize-output`: lm_head) replaced by the values their blocks
    stand for."""
    return _write_dense(_modelopt_dense(request.source, request.recipes), request)


def _no_recipes(request: ReferenceRequest, what: str) -> None:
    if request.recipes:  # build refuses --quantize and --quantize-output on these sources
        raise ConfigError(
            f"{request.source} is {what}, whose weights are already packed; a package quantized "
            "at export comes from a dense safetensors checkpoint (or, lm_head alone, a ModelOpt "
            "one): pass that one"
        )


def _write_dense(tensors: dict[str, np.ndarray], request: ReferenceRequest) -> Path:
    """The decoded tensors (those `keep` accepts) and the config, less its quantization, as a
    safetensors checkpoint in the request's workdir."""
    from safetensors.numpy import save_file

    if request.keep is not None:
        tensors = {name: value for name, value in tensors.items() if request.keep(name)}
    config = {k: v for k, v in request.raw_config.items() if k != "quantization_config"}
    workdir = request.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    save_file(tensors, str(workdir / DENSE_FILE))
    return workdir


def _gguf_dense(path: Path, keep: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file (or those whose released name `keep` accepts) dequantized
    by gguf-py, in the released layout and names, each weight times its `.scale` tensor
    where it has one (`.input_scale`: unused, as in the export)."""
    import gguf

    from mobius_lite.models.nemotron_h_gguf import nemotron_h_gguf_mapping
    from mobius_lite.models.nemotron_h_gguf_scales import output_scales
    from mobius_lite.sources.gguf_file import GGUFCheckpoint, split_parts

    stored = {
        tensor.name: tensor
        for part in split_parts(path)
        for tensor in gguf.GGUFReader(part).tensors
    }
    checkpoint = GGUFCheckpoint(path)
    scales = output_scales(checkpoint)
    out: dict[str, np.ndarray] = {}
    for mapping in nemotron_h_gguf_mapping(checkpoint):
        if keep is not None and not keep(mapping.checkpoint_name):
            continue
        tensor = stored[mapping.gguf_name]
        values = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
        values = _undo_conversion(values.reshape(mapping.gguf_shape), mapping, stored, scales)
        stacked = STACKED_EXPERTS.match(mapping.checkpoint_name)
        if stacked:  # the released checkpoint stores one matrix per expert
            names = expert_names(stacked["prefix"], stacked["proj"], len(values))
            for name, matrix in zip(names, values, strict=True):
                out[name] = np.ascontiguousarray(matrix)
        else:
            out[mapping.checkpoint_name] = values
    if LM_HEAD_WEIGHT not in out and EMBEDDING_WEIGHT in out:
        # the converter drops `output` when it equals token_embd (llama.cpp then computes the
        # logits with token_embd); transformers would initialise a missing lm_head at random
        out[LM_HEAD_WEIGHT] = out[EMBEDDING_WEIGHT].copy()
    return out


def _undo_conversion(
    values: np.ndarray, mapping: Any, stored: Mapping[str, Any], scales: Mapping[str, str]
) -> np.ndarray:
    """One dequantized GGUF tensor in the checkpoint's layout: times its `.scale`, rows back in
    the checkpoint's order, A_log from A, the checkpoint's shape."""
    from mobius_lite.models.nemotron_h_gguf import LayoutTransform, ValueTransform

    scale = scales.get(mapping.gguf_name)
    if scale is not None:  # llama.cpp's `.scale`: the weight is its blocks times it
        factor = np.asarray(stored[scale].data, np.float32).reshape(-1)  # [1], or [E] experts
        values = values * factor.reshape(-1, *(1,) * (values.ndim - 1))
    if mapping.layout is LayoutTransform.HEAD_ROW_PERMUTE:
        values = values[mapping.row_order()]
    if mapping.values is ValueTransform.NEGATED_EXP:
        values = np.log(-values)  # A = -exp(A_log)
    return np.ascontiguousarray(values.reshape(mapping.checkpoint_shape))


def _modelopt_dense(
    directory: Path, recipes: Mapping[str, Recipe] | None = None
) -> dict[str, np.ndarray]:
    """Every weight of a ModelOpt checkpoint decoded to FP32 (NVFP4: codes x E4M3 block scale
    x global scale; FP8: E4M3 x scale); scales are consumed or, for activations / KV, dropped;
    integer tensors (an Omni tower's indices and counters) are kept as stored.
    A dense tensor with a recipe takes the values its quantization stands for
    (quantized_reference.dequantized: gguf-py's or onnxruntime's quantizer, not the export's);
    a recipe on a packed or absent tensor is a package this checkpoint cannot have made."""
    from mobius_lite.formats.modelopt import fp8, nvfp4
    from mobius_lite.formats.modelopt.storage import FP8WeightStorage, NVFP4CodeStorage
    from mobius_lite.source_kinds import local_tensors
    from mobius_lite.sources.modelopt_open import COMPANIONS, WEIGHT

    recipes = recipes or {}
    source = local_tensors(directory)
    absent = sorted(set(recipes) - set(source.names()))
    if absent:
        raise ConfigError(
            f"the package quantized {', '.join(absent[:5])} at export; {directory} has no such "
            "tensor: pass the checkpoint the package was built from"
        )
    out: dict[str, np.ndarray] = {}
    for name in source.names():
        if name.endswith(COMPANIONS):
            continue
        module = name.removesuffix(WEIGHT)
        storage = source.info(name).storage
        if name in recipes and isinstance(storage, (NVFP4CodeStorage, FP8WeightStorage)):
            raise ConfigError(
                f"the package quantized {name} at export, but {directory} stores it packed "
                f"({storage.name}): pass the checkpoint the package was built from"
            )
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
            dense = np.asarray(source.read(name))
            if dense.dtype.kind in "iub":  # indices and counters (Omni's towers) as stored
                out[name] = dense
                continue
            dense = dense.astype(np.float32)
            if name in recipes:
                dense = dequantized(dense, recipes[name])
        out[name] = np.ascontiguousarray(np.asarray(dense, dtype=np.float32))
    return out
