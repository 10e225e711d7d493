"""The Python entry points: build(model) for checkpoints and build_from_module(module).

build() validates in order of cost, so that every unsupported input fails before anything large
is fetched, read or written: task, dtype / execution provider route, config (fetched alone for
hub ids), weight format, then every tensor name, shape and dtype from safetensors headers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_text_config, read_config_json
from mobius_lite.enums import Precision
from mobius_lite.errors import ConfigError
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.package import TOKENIZER_FILES, ModelPackage
from mobius_lite.routes import check_route, check_source_dtypes, check_weight_format
from mobius_lite.sources import MemorySource, SafetensorsCheckpoint
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.hub import fetch_weights, resolve_checkpoint
from mobius_lite.weights.binding import bind_model, graph_parameters, plan_bindings

SUPPORTED_TASKS = ("text-generation",)


def check_task(task: str) -> str:
    if task not in SUPPORTED_TASKS:
        raise ConfigError(
            f"task {task!r} is not supported; choose one of {', '.join(SUPPORTED_TASKS)}"
        )
    return task


def unused_tensor_rules(config: NemotronHConfig) -> dict[str, str]:
    """Source tensors that are expected and deliberately not exported, with the reason."""
    rules = {}
    if config.num_nextn_predict_layers > 0:
        rules[r"^mtp\."] = "multi-token-prediction head: not part of the decoder graph"
    if config.tie_word_embeddings:
        rules[r"^lm_head\.weight$"] = "tied to backbone.embeddings.weight"
    return rules


def package_from_source(
    config: NemotronHConfig,
    source: TensorSource,
    dtype: Precision | str = Precision.F32,
    *,
    source_dir: Path | None = None,
) -> ModelPackage:
    """Build the decoder graph for `config` and bind every parameter to `source` (lazily)."""
    precision = Precision.parse(dtype)
    decoder, _ = build_decoder(config, precision)
    plan = plan_bindings(graph_parameters(decoder), source, unused_tensor_rules(config))
    check_source_dtypes((b.sources[0], b.source_dtype) for b in plan.bindings)
    bind_model(decoder, plan, source)
    extras = []
    if source_dir is not None:
        extras = [source_dir / f for f in TOKENIZER_FILES if (source_dir / f).is_file()]
    return ModelPackage(
        config=config,
        precision=precision,
        decoder=decoder,
        source=source,
        plan=plan,
        source_dir=source_dir,
        extra_files=extras,
    )


def build(
    model: str | Path,
    dtype: Precision | str = Precision.F32,
    revision: str | None = None,
    ep: str = "cpu",
    task: str = "text-generation",
) -> ModelPackage:
    """Export a Nemotron-H checkpoint: a local directory or a hub id (pinned, see registry).

    Nothing but config, tokenizer and safetensors headers is read here; tensor data is streamed
    by ModelPackage.save. The resolved commit is recorded in metadata["source"].
    """
    check_task(task)
    precision, provider = check_route(dtype, ep)
    resolved = resolve_checkpoint(model, revision, weights=False)
    raw = read_config_json(resolved.path)
    config = load_text_config(raw)
    check_weight_format(raw)
    resolved = fetch_weights(resolved)  # hub: the same commit's shards, now the config is good
    source = SafetensorsCheckpoint(resolved.path)
    package = package_from_source(config, source, precision, source_dir=resolved.path)
    package.provider = provider
    package.metadata["source"] = resolved.source_record()
    return package


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
    package = package_from_source(parsed, MemorySource(module.state_dict()), precision)
    package.provider = provider
    return package
