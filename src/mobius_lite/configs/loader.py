"""The decoder model types (nemotron_h, nemotron_h_puzzle, transformers' split
nemotron_h_dense / nemotron_h_sparse) and the reader of their configs.

A decoder config names its model_type, or (inside an Omni config) may leave it out: it is
then the first decoder type that recognises it, plain Nemotron-H otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_lite.configs.model_type_entry import ModelType
from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.configs.nemotron_h_split import NemotronHDenseConfig, NemotronHSparseConfig
from mobius_lite.configs.puzzle import PUZZLE_MODEL_TYPE, NemotronHPuzzleConfig
from mobius_lite.enums import Task
from mobius_lite.errors import ConfigError
from mobius_lite.sources.config_json import read_config_json

TRANSFORMERS_REFERENCE = "mobius_lite.evaluation.reference:transformers_reference"

NEMOTRON_H = ModelType(
    name=NemotronHConfig.model_type,
    read_config=NemotronHConfig.from_dict,
    task=Task.TEXT_GENERATION,
    reference=TRANSFORMERS_REFERENCE,
    reference_name="transformers",
)
NEMOTRON_H_PUZZLE = ModelType(
    name=PUZZLE_MODEL_TYPE,
    read_config=NemotronHPuzzleConfig.from_dict,
    task=Task.TEXT_GENERATION,
    reference="mobius_lite.evaluation.puzzle_reference:puzzle_reference_model",
    reference_name="puzzle",
    recognizes=lambda raw: "block_configs" in raw,
)
# transformers' split types: NemotronHConfig's fields; transformers releases that have no
# such model_type are given the config as nemotron_h (the same modules and names).
SPLIT_REFERENCE = "mobius_lite.evaluation.reference:split_transformers_reference"
NEMOTRON_H_DENSE = ModelType(
    name=NemotronHDenseConfig.model_type,
    read_config=NemotronHDenseConfig.from_dict,
    task=Task.TEXT_GENERATION,
    reference=SPLIT_REFERENCE,
    reference_name="transformers",
)
NEMOTRON_H_SPARSE = ModelType(
    name=NemotronHSparseConfig.model_type,
    read_config=NemotronHSparseConfig.from_dict,
    task=Task.TEXT_GENERATION,
    reference=SPLIT_REFERENCE,
    reference_name="transformers",
)
# In the order a config without model_type is tried; the last is the default.
DECODER_TYPES: tuple[ModelType, ...] = (
    NEMOTRON_H_PUZZLE,
    NEMOTRON_H_DENSE,
    NEMOTRON_H_SPARSE,
    NEMOTRON_H,
)
SUPPORTED_MODEL_TYPES = tuple(t.name for t in reversed(DECODER_TYPES))


def unsupported(model_type: Any, supported: tuple[str, ...]) -> ConfigError:
    return ConfigError(
        f"model_type {model_type!r} is not supported; supported: {', '.join(supported)}"
    )


def decoder_type(raw: Mapping[str, Any]) -> ModelType:
    """The decoder model type of a config dict (ConfigError naming the supported ones)."""
    by_name = {t.name: t for t in DECODER_TYPES}
    if "model_type" not in raw:
        return next((t for t in DECODER_TYPES if t.recognizes(raw)), DECODER_TYPES[-1])
    if raw["model_type"] not in by_name:
        raise unsupported(raw["model_type"], SUPPORTED_MODEL_TYPES)
    return by_name[raw["model_type"]]


def load_text_config(raw: dict[str, Any]) -> NemotronHConfig:
    """The decoder config of a checkpoint's config.json dict, validated and resolved."""
    if "model_type" not in raw:  # only a config inside an Omni config may leave it out
        raise unsupported(None, SUPPORTED_MODEL_TYPES)
    model_type = decoder_type(raw)
    return model_type.decoder(model_type.read_config(raw))


def load_config_file(path: str | Path) -> NemotronHConfig:
    return load_text_config(read_config_json(path))
