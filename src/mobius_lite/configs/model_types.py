"""The registry of model types the exporter knows, by config.json's model_type; each entry is a
`ModelType` (configs/model_type_entry.py).

Adding a model type is one entry here (or in DECODER_TYPES for a decoder an Omni config may
carry) plus its own modules: its config reader, its task's graphs, its reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mobius_lite.configs.loader import DECODER_TYPES, unsupported
from mobius_lite.configs.model_type_entry import ModelConfig, ModelType
from mobius_lite.configs.omni import NEMOTRON_H_OMNI

MODEL_TYPES: dict[str, ModelType] = {t.name: t for t in (*reversed(DECODER_TYPES), NEMOTRON_H_OMNI)}


def model_type_of(raw: Mapping[str, Any]) -> ModelType:
    """The entry of a config dict's model_type (one ConfigError naming the supported ones)."""
    name = raw.get("model_type")
    if name not in MODEL_TYPES:
        raise unsupported(name, tuple(MODEL_TYPES))
    return MODEL_TYPES[name]


def read_config(raw: dict[str, Any]) -> tuple[ModelType, ModelConfig]:
    """A config dict's model type and its config, validated: the one parse of a build."""
    model_type = model_type_of(raw)
    return model_type, model_type.read_config(raw)
