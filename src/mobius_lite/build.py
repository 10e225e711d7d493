"""The Python entry points: build(path) and build_from_module(module)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_config_file
from mobius_lite.enums import Precision
from mobius_lite.errors import ConfigError
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.package import TOKENIZER_FILES, ModelPackage
from mobius_lite.sources import MemorySource, SafetensorsCheckpoint
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import bind_model, graph_parameters, plan_bindings

SUPPORTED_TASKS = ("text-generation",)


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


def build(model: str | Path, dtype: Precision | str = Precision.F32) -> ModelPackage:
    """Export a local Nemotron-H checkpoint directory (config.json + safetensors)."""
    path = Path(model)
    if not path.is_dir():
        raise ConfigError(f"{model}: not a checkpoint directory")
    config = load_config_file(path)
    return package_from_source(config, SafetensorsCheckpoint(path), dtype, source_dir=path)


def build_from_module(
    module: Any,
    config: Any = None,
    task: str = "text-generation",
    dtype: Precision | str = Precision.F32,
) -> ModelPackage:
    """Export an in-memory transformers NemotronHForCausalLM (its state dict is the source)."""
    if task not in SUPPORTED_TASKS:
        raise ConfigError(f"task {task!r} is not supported; choose one of {SUPPORTED_TASKS}")
    raw = config if config is not None else module.config
    if isinstance(raw, NemotronHConfig):
        parsed = raw
    else:
        parsed = NemotronHConfig.from_dict(raw if isinstance(raw, dict) else raw.to_dict())
    return package_from_source(parsed, MemorySource(module.state_dict()), dtype)
