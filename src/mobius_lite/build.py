"""The Python entry points: build(model) for checkpoints and build_from_module(module).

build() validates in order of cost, so that every unsupported input fails before anything large
is fetched, read or written: task, dtype / execution provider route, config (fetched alone for
hub ids), weight format, then every tensor name, shape and dtype from safetensors headers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_lite.components.context import Backend
from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_text_config
from mobius_lite.enums import Precision
from mobius_lite.errors import ConfigError
from mobius_lite.package import ModelPackage
from mobius_lite.routes import check_route, check_weight_format, parse_backend
from mobius_lite.sources import MemorySource
from mobius_lite.sources.open import SAFETENSORS, open_checkpoint
from mobius_lite.tasks import SUPPORTED_TASKS, TASKS


def check_task(task: str) -> str:
    if task not in SUPPORTED_TASKS:
        raise ConfigError(
            f"task {task!r} is not supported; choose one of {', '.join(SUPPORTED_TASKS)}"
        )
    return task


def build(
    model: Any,
    dtype: Precision | str = Precision.F32,
    revision: str | None = None,
    ep: str = "cpu",
    task: str = "text-generation",
    *,
    weights_backend: Backend | str = Backend.STANDARD,
    dequantize: bool = False,
    gguf_file: str | None = None,
    config: str | Path | None = None,
) -> ModelPackage:
    """Export a Nemotron-H checkpoint: a local directory, a .gguf file, or a hub id (pinned,
    see registry; `gguf_file` picks one GGUF file of a hub repository).

    Packed weights (GGUF blocks, ModelOpt NVFP4 / FP8) stay packed and compute on
    `weights_backend` ("standard": standard ONNX ops; "ort": onnxruntime's own ops); with
    `dequantize` they become dense `dtype` weights. `config` is a config.json for the
    fields a GGUF file does not carry. Nothing but config, tokenizer and tensor headers is
    read here; tensor data is streamed by ModelPackage.save. The resolved commit is
    recorded in metadata["source"].
    """
    check_task(task)
    precision, provider = check_route(dtype, ep)
    backend = parse_backend(weights_backend)
    opened = open_checkpoint(model, revision, gguf_file=gguf_file, config_json=config)
    text_config = load_text_config(opened.raw_config)
    check_weight_format(opened.raw_config, opened.kind)
    opened = opened.with_weights()  # hub: the same commit's shards, now the config is good
    source = opened.tensors()
    graphs, shared = TASKS[task](
        text_config, source, opened.kind, precision, backend, dequantize, opened.unused_rules
    )
    return ModelPackage(
        config=text_config,
        precision=precision,
        graphs=graphs,
        source=source,
        source_dir=opened.resolved.path,
        provider=provider,
        extra_files=opened.extra_files,
        shared=shared,
        metadata={"source": opened.resolved.source_record()},
    )


def build_from_module(
    module: Any,
    config: Any = None,
    task: str = "text-generation",
    dtype: Precision | str = Precision.F32,
    ep: str = "cpu",
) -> ModelPackage:
    """Export an in-memory transformers NemotronHForCausalLM (its state dict is the source)."""
    check_task(task)
    precision, provider = check_route(dtype, ep)
    raw = config if config is not None else module.config
    if isinstance(raw, NemotronHConfig):
        parsed = raw
    else:
        parsed = NemotronHConfig.from_dict(raw if isinstance(raw, dict) else raw.to_dict())
    source = MemorySource(module.state_dict())
    graphs, shared = TASKS[task](parsed, source, SAFETENSORS, precision)
    return ModelPackage(
        config=parsed,
        precision=precision,
        graphs=graphs,
        source=source,
        provider=provider,
        shared=shared,
    )
