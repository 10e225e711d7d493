"""The Python entry points: build(model) for checkpoints and build_from_module(module).

build() validates in order of cost, so that every unsupported input fails before anything large
is fetched, read or written: task, dtype / execution provider route, config (fetched alone for
hub ids), weight format, then every tensor name, shape and dtype from safetensors headers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.model_type_entry import ModelConfig, ModelType
from mobius_lite.configs.model_types import MODEL_TYPES, read_config
from mobius_lite.configs.nemotron_h import LEGACY_FIELD_NAMES
from mobius_lite.enums import Activations, Backend, DraftHead, GraphRole, Precision
from mobius_lite.errors import ConfigError, RouteError
from mobius_lite.formats.quantize.recipe import QuantizePlan, QuantType
from mobius_lite.models.nemotron_h_fields import check_tensor_fields, stated_fields
from mobius_lite.models.nemotron_h_names import MTP_FUSION_WEIGHT
from mobius_lite.models.nemotron_h_quant import choose_quantization
from mobius_lite.package import ModelPackage
from mobius_lite.routes import (
    check_activations,
    check_draft_head,
    check_graph_kernels,
    check_route,
    check_weight_format,
    parse_backend,
)
from mobius_lite.source_kinds import SAFETENSORS_KIND, SOURCE_KINDS, layout_of, open_checkpoint
from mobius_lite.sources import MemorySource
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.memory import checkpoint_state_dict
from mobius_lite.sources.open import OpenedCheckpoint
from mobius_lite.sources.quantized import QuantizedSource
from mobius_lite.sources.tokenizer_file import check_tokenizer_json
from mobius_lite.tasks import SUPPORTED_TASKS, TASKS, TEXT_GENERATION, TaskGraphs
from mobius_lite.tasks.options import ExportOptions

MODULE_HINT = "Check that the config given belongs to this module's weights."


class BuildWarning(UserWarning):
    """Something about the checkpoint the package does not carry, said without stopping the
    build (the CLI prints each as one `warning:` line on stderr)."""


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
            "(leave --task out, task=None in Python, to use it)"
        )
    return task


def decoder_raw_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The decoder's part of a config dict: an Omni config's text_config (llm_config), else
    the config itself."""
    for key in ("text_config", "llm_config"):
        if isinstance(raw.get(key), dict):
            return raw[key]
    return raw


def check_fields_against_tensors(
    raw: dict[str, Any], model_type: ModelType, parsed: ModelConfig, source: TensorSource
) -> None:
    """A field config.json leaves out whose default the tensors contradict (hidden_size,
    vocab_size, ...) is named now, before the binding lists every wrong-shape tensor."""
    stated = stated_fields(decoder_raw_config(raw), LEGACY_FIELD_NAMES)
    check_tensor_fields(stated, model_type.decoder(parsed), source, layout_of(source))


def check_draft_head_target(route: DraftHead, decoder: NemotronHConfig) -> None:
    """A fast draft head asked of a checkpoint whose config declares no head: a RouteError
    before any weight is read (the flag would otherwise do nothing, silently)."""
    if route is DraftHead.FAST and not decoder.has_mtp_head:
        raise RouteError(
            "--draft-head fast: the config declares no multi-token-prediction head "
            "(num_nextn_predict_layers is 0, or a Puzzle config without mtp_block_configs), "
            "so there is no head to route; drop the flag"
        )


def warn_absent_mtp_head(exported: TaskGraphs, source: TensorSource) -> None:
    """A UserWarning (one line on the CLI's stderr) when the config declares a multi-token-
    prediction head that the checkpoint does not hold: transformers' save_pretrained drops
    the mtp.* tensors, and the package then has no mtp.onnx although the config promised one."""
    config = exported.decoder
    exported_head = any(g.role is GraphRole.MTP for g in exported.graphs)
    if not config.has_mtp_head or exported_head or layout_of(source).mtp_head_present(source):
        return
    warnings.warn(
        f"the config declares a multi-token-prediction head (num_nextn_predict_layers="
        f"{config.num_nextn_predict_layers}) but the checkpoint holds none of its tensors (no "
        f"{MTP_FUSION_WEIGHT}; transformers' save_pretrained drops mtp.*): the package has no "
        f"{GraphRole.MTP.file_name}, so speculative decoding is not available",
        BuildWarning,
        stacklevel=3,
    )


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
    quantize: QuantType | str | None = None,
    quantize_output: QuantType | str | None = None,
    quantize_block_size: int | None = None,
    quantize_asymmetric: bool = False,
    draft_head: DraftHead | str = DraftHead.EXACT,
    state_window_kernel: bool = False,
) -> ModelPackage:
    """Export a Nemotron-H checkpoint: a local directory, a .gguf file, or a hub id (pinned,
    see hub_pins.py; `gguf_file` picks one GGUF file of a hub repository). Omni checkpoints
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
    route = check_build_route(
        dtype,
        ep,
        weights_backend=weights_backend,
        activations=activations,
        quantize=quantize,
        quantize_output=quantize_output,
        quantize_block_size=quantize_block_size,
        quantize_asymmetric=quantize_asymmetric,
        dequantize=dequantize,
        draft_head=draft_head,
        state_window_kernel=state_window_kernel,
    )
    opened = open_checkpoint(model, revision, gguf_file=gguf_file, config_json=config)
    check_opened(opened, model, task, route.plan, route.dequantize)
    # the one parse of the config: its errors come before any weight download
    model_type, parsed = read_config(opened.raw_config)
    check_draft_head_target(route.draft_head, model_type.decoder(parsed))
    opened = opened.with_weights()  # hub: the same commit's shards, now the config is good
    source: TensorSource = opened.tensors()
    check_fields_against_tensors(opened.raw_config, model_type, parsed, source)
    source, metadata = export_source(source, route.plan, opened.resolved.source_record())
    options = route.export_options(opened.unused_rules, opened.binding_hint)
    exported = package_graphs(model_type, parsed, source, options)
    check_graph_kernels((g.model for g in exported.graphs), route.provider)
    warn_absent_mtp_head(exported, source)
    return ModelPackage(
        config=exported.decoder,
        precision=route.precision,
        graphs=exported.graphs,
        source=source,
        source_dir=opened.resolved.path,
        provider=route.provider,
        extra_files=opened.extra_files,
        config_json=exported.config_json,
        shared=exported.shared,
        metadata=metadata,
    )


@dataclass(frozen=True)
class BuildRoute:
    """build()'s route arguments, checked before any checkpoint is opened: what the graphs
    compute in (precision, provider), with which operators and CPU kernels, the MTP head's
    route, and how the weights are stored (the plan of a quantization at export, or
    dequantized)."""

    precision: Precision
    provider: str
    backend: Backend
    activations: Activations
    plan: QuantizePlan | None
    dequantize: bool
    draft_head: DraftHead
    state_window_kernel: bool

    def export_options(self, unused_rules: Mapping[str, str], binding_hint: str) -> ExportOptions:
        """The task's export options: this route plus what the source kind says about its
        deliberately unused tensors and what a binding error tells the user to check."""
        return ExportOptions(
            self.precision,
            self.backend,
            self.dequantize,
            unused_rules,
            activations=self.activations,
            binding_hint=binding_hint,
            quantized=self.plan is not None,
            draft_head=self.draft_head,
            state_window_kernel=self.state_window_kernel,
        )


def check_build_route(
    dtype: Precision | str,
    ep: str,
    *,
    weights_backend: Backend | str,
    activations: Activations | str,
    quantize: QuantType | str | None,
    quantize_output: QuantType | str | None,
    quantize_block_size: int | None,
    quantize_asymmetric: bool,
    dequantize: bool,
    draft_head: DraftHead | str,
    state_window_kernel: bool,
) -> BuildRoute:
    """build()'s route arguments checked together, in this order, before any checkpoint is
    fetched or read (RouteError for a combination no route runs)."""
    precision, provider = check_route(dtype, ep)
    backend = parse_backend(weights_backend)
    mode = check_activations(activations, backend, precision, provider)
    plan = quantize_plan(
        quantize, quantize_output, dequantize, quantize_block_size, quantize_asymmetric
    )
    if plan is not None and plan.matmulnbits and precision is Precision.BF16:
        raise RouteError(
            f"{plan.output_recipe.type.value} weights keep their scales in f32 or f16 "
            "(MatMulNBits); build them with --dtype f32 or f16"
        )
    head_route = check_draft_head(draft_head, backend, precision, provider)
    if state_window_kernel and (backend is not Backend.ORT or provider != "cuda"):
        raise RouteError(
            "the state_window kernels run on onnxruntime's CUDA provider only (its CPU kernels "
            "refuse state_window > 0): build them with the ort backend for the cuda provider"
        )
    return BuildRoute(
        precision, provider, backend, mode, plan, dequantize, head_route, state_window_kernel
    )


def check_opened(
    opened: OpenedCheckpoint,
    model: Any,
    task: str | None,
    plan: QuantizePlan | None,
    dequantize: bool = False,
) -> None:
    """What the opened checkpoint's config and small files say, checked before its weights are
    fetched: the task fits its model type, its weight format, a quantization at export and
    `dequantize` fit its source kind, its tokenizer.json is readable. A packed source (GGUF,
    ModelOpt) takes an output-only plan at most, and only when its kind and config say its
    lm_head is dense (`OpenedCheckpoint.output_quantize_refusal`)."""
    check_task(task, opened.raw_config.get("model_type"))
    check_weight_format(opened.raw_config, SOURCE_KINDS[opened.kind])
    if dequantize and opened.dequantize_refusal is not None:
        raise RouteError(f"--dequantize: {opened.dequantize_refusal}")
    if plan is not None and opened.kind != SAFETENSORS_KIND.name:
        if not plan.output_only:
            raise RouteError(
                f"{model} is a {opened.kind} checkpoint, whose weights are already packed; "
                "quantizing at export takes a dense (BF16, FP16, FP32) safetensors checkpoint "
                "(--quantize-output alone quantizes a dense lm_head of a ModelOpt checkpoint)"
            )
        if opened.output_quantize_refusal is not None:
            raise RouteError(f"--quantize-output: {opened.output_quantize_refusal}")
    check_tokenizer_json(opened.extra_files)


def export_source(
    source: TensorSource, plan: QuantizePlan | None, source_record: dict[str, Any]
) -> tuple[TensorSource, dict[str, Any]]:
    """The tensors the graphs bind (the checkpoint's, or with a plan its tensors quantized at
    export: an output-only plan's lm_head alone, on any source check_opened let through) and
    the package metadata: where the checkpoint came from, and the quantization with the
    tensors it left dense."""
    metadata: dict[str, Any] = {"source": source_record}
    if plan is not None:
        choice = choose_quantization(source, plan)
        if plan.output_only and not (choice.recipes or choice.fallbacks):
            raise RouteError(
                "--quantize-output: the checkpoint has no lm_head.weight (its logits come from "
                "the tied embedding table), so there is no output projection to quantize"
            )
        source = QuantizedSource(source, choice.recipes)
        metadata["quantization"] = {**plan.record(), "fallbacks": list(choice.fallbacks.values())}
    return source, metadata


def quantize_plan(
    quantize: QuantType | str | None,
    output: QuantType | str | None,
    dequantize: bool,
    block: int | None = None,
    asymmetric: bool = False,
) -> QuantizePlan | None:
    """The typed plan of build's quantize arguments, None when not quantizing; `output`
    without `quantize` is an output-only plan (lm_head quantized, the rest as stored)."""
    if quantize is None and output is None:
        if block is not None or asymmetric:
            raise RouteError("the block size and asymmetry need a quantization")
        return None
    if dequantize:
        raise RouteError("quantizing at export and dequantizing packed weights exclude each other")
    return QuantizePlan.of(quantize, output, block, not asymmetric)


def module_config(module: Any, config: Any = None) -> dict[str, Any]:
    """The config dict of an in-memory model: `config` when given (a dict, or an object with
    to_dict()), else `module.config`; ConfigError for anything else (e.g. a torch.nn.Linear)."""
    what = type(module).__name__
    if not callable(getattr(module, "state_dict", None)):
        raise ConfigError(
            f"build_from_module takes a torch module (a transformers NemotronHForCausalLM or "
            f"Omni model); got a {what}. For a checkpoint on disk or a hub id use build()"
        )
    raw = config if config is not None else getattr(module, "config", None)
    if raw is None:
        raise ConfigError(
            f"the {what} module has no config: build_from_module exports a transformers "
            "NemotronHForCausalLM (or Omni model), whose .config describes it; pass config= "
            "(the model's config dict) for another module holding such weights"
        )
    if isinstance(raw, NemotronHConfig) or not isinstance(raw, dict):
        to_dict = getattr(raw, "to_dict", None)
        if not callable(to_dict):
            raise ConfigError(
                f"config must be a dict or a transformers config (with to_dict()); got a "
                f"{type(raw).__name__}"
            )
        raw = to_dict()
    return raw


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
    raw = module_config(module, config)
    check_task(task, raw.get("model_type"))
    model_type, parsed = read_config(raw)
    source = MemorySource(checkpoint_state_dict(module))
    options = ExportOptions(precision, backend, activations=mode, binding_hint=MODULE_HINT)
    exported = package_graphs(model_type, parsed, source, options)
    check_graph_kernels((g.model for g in exported.graphs), provider)
    warn_absent_mtp_head(exported, source)
    return ModelPackage(
        config=exported.decoder,
        precision=precision,
        graphs=exported.graphs,
        source=source,
        provider=provider,
        config_json=exported.config_json,
        shared=exported.shared,
    )
