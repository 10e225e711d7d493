"""The Python entry points: build(model) for checkpoints and build_from_module(module).

build() validates in order of cost, so that every unsupported input fails before anything large
is fetched, read or written: task, dtype / execution provider route, config (fetched alone for
hub ids), weight format, then every tensor name, shape and dtype from safetensors headers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.model_type import ModelConfig, ModelType
from mobius_lite.configs.model_types import MODEL_TYPES, read_config
from mobius_lite.enums import Activations, Backend, DraftHead, Precision
from mobius_lite.errors import ConfigError, RouteError
from mobius_lite.package import ModelPackage
from mobius_lite.routes import (
    check_activations,
    check_draft_head,
    check_route,
    check_weight_format,
    parse_backend,
)
from mobius_lite.source_kinds import SOURCE_KINDS, layout_of, open_checkpoint
from mobius_lite.sources import MemorySource
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.memory import checkpoint_state_dict
from mobius_lite.tasks import SUPPORTED_TASKS, TASKS, TEXT_GENERATION, TaskGraphs
from mobius_lite.tasks.options import ExportOptions

MODULE_HINT = "Check that the config given belongs to this module's weights."


def check_task(task: str | None, model_type: str | None = None) -> str:
    """The task to export: the one asked for, checked against the model type, or the model
    type's own (text-generation for Nemotron-H and Puzzle, image-text-to-text for Omni)."""
    known = MODEL_TYPES.get(model_type) if model_type is not None else None
    default = known.task.value if known is not None else TEXT_GENERATION
    if task is None:
        return default
    if task not in SUPPORTED_TASKS:
        raise ConfigError(
            f"task {task!r} is not supported; choose one of {', '.join(SUPPORTED_TASKS)}"
        )
    if model_type is not None and task != default:
        raise ConfigError(
            f"task {task!r} does not fit model_type {model_type!r}; its task is {default!r} "
            "(leave --task out to use it)"
        )
    return task


def package_graphs(
    model_type: ModelType, config: ModelConfig, source: TensorSource, options: ExportOptions
) -> TaskGraphs:
    """The graphs of the model type's task for a checkpoint, from its one parsed config."""
    return TASKS[model_type.task](config, source, layout_of(source), options)


def build(
    model: Any,
    dtype: Precision | str = Precision.F32,
    revision: str | None = None,
    ep: str = "cpu",
    task: str | None = None,
    *,
    weights_backend: Backend | str = Backend.STANDARD,
    dequantize: bool = False,
    gguf_file: str | None = None,
    config: str | Path | None = None,
    activations: Activations | str = Activations.EXACT,
    draft_head: DraftHead | str = DraftHead.EXACT,
    state_window_kernel: bool = False,
) -> ModelPackage:
    """Export a Nemotron-H checkpoint: a local directory, a .gguf file, or a hub id (pinned,
    see registry; `gguf_file` picks one GGUF file of a hub repository). Omni checkpoints
    export as several graphs (task image-text-to-text, see tasks/omni.py).

    Packed weights (GGUF blocks, ModelOpt NVFP4 / FP8) stay packed and compute on
    `weights_backend` ("standard": standard ONNX ops; "ort": onnxruntime's own ops, which also
    gives the Mamba mixers onnxruntime's native conv / SSD kernels); with
    `dequantize` they become dense `dtype` weights. `config` is a config.json for the
    fields a GGUF file does not carry. `activations` ("exact", "exact-fused", "int8";
    enums.Activations) moves packed matmuls and experts onto onnxruntime's
    fused CPU kernels (needs weights_backend "ort", f32, cpu). `draft_head` ("exact",
    "fast"; enums.DraftHead) is the route of the MTP head, when the checkpoint has one: fast
    puts its packed weights on int8-activation kernels (same needs; docs/speculative.md).
    `state_window_kernel` takes the decoder's speculation windows from onnxruntime's
    `state_window` attribute (weights_backend "ort", ep "cuda"; not yet run on a GPU here:
    benchmarks/gpu_check.py checks it).
    Nothing but config, tokenizer
    and tensor headers is read here; tensor data is streamed by ModelPackage.save. The
    resolved commit is recorded in metadata["source"].
    """
    if task is not None:
        check_task(task)
    precision, provider = check_route(dtype, ep)
    backend = parse_backend(weights_backend)
    mode = check_activations(activations, backend, precision, provider)
    head_route = check_draft_head(draft_head, backend, precision, provider)
    if state_window_kernel and (backend is not Backend.ORT or provider != "cuda"):
        raise RouteError(
            "the state_window kernels run on onnxruntime's CUDA provider only (its CPU kernels "
            "refuse state_window > 0): build them with the ort backend for the cuda provider"
        )
    opened = open_checkpoint(model, revision, gguf_file=gguf_file, config_json=config)
    check_task(task, opened.raw_config.get("model_type"))
    check_weight_format(opened.raw_config, SOURCE_KINDS[opened.kind])
    # the one parse of the config: its errors come before any weight download
    model_type, parsed = read_config(opened.raw_config)
    opened = opened.with_weights()  # hub: the same commit's shards, now the config is good
    source = opened.tensors()
    options = ExportOptions(
        precision,
        backend,
        dequantize,
        opened.unused_rules,
        activations=mode,
        binding_hint=opened.binding_hint,
        draft_head=head_route,
        state_window_kernel=state_window_kernel,
    )
    exported = package_graphs(model_type, parsed, source, options)
    return ModelPackage(
        config=exported.decoder,
        precision=precision,
        graphs=exported.graphs,
        source=source,
        source_dir=opened.resolved.path,
        provider=provider,
        extra_files=opened.extra_files,
        config_json=exported.config_json,
        shared=exported.shared,
        metadata={"source": opened.resolved.source_record()},
    )


def build_from_module(
    module: Any,
    config: Any = None,
    task: str | None = None,
    dtype: Precision | str = Precision.F32,
    ep: str = "cpu",
    *,
    weights_backend: Backend | str = Backend.STANDARD,
    activations: Activations | str = Activations.EXACT,
) -> ModelPackage:
    """Export an in-memory transformers NemotronHForCausalLM (or Omni model): its tensors, under
    the names save_pretrained gives them, are the source, so the package verifies against the
    saved checkpoint. `weights_backend` and `activations` as in build."""
    precision, provider = check_route(dtype, ep)
    backend = parse_backend(weights_backend)
    mode = check_activations(activations, backend, precision, provider)
    raw = config if config is not None else module.config
    if isinstance(raw, NemotronHConfig) or not isinstance(raw, dict):
        raw = raw.to_dict()
    check_task(task, raw.get("model_type"))
    model_type, parsed = read_config(raw)
    source = MemorySource(checkpoint_state_dict(module))
    options = ExportOptions(precision, backend, activations=mode, binding_hint=MODULE_HINT)
    exported = package_graphs(model_type, parsed, source, options)
    return ModelPackage(
        config=exported.decoder,
        precision=precision,
        graphs=exported.graphs,
        source=source,
        provider=provider,
        config_json=exported.config_json,
        shared=exported.shared,
    )
