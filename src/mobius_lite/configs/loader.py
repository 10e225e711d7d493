"""Pick the config reader for a checkpoint by its model_type."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.configs.puzzle import PUZZLE_MODEL_TYPE, NemotronHPuzzleConfig
from mobius_lite.errors import ConfigError
from mobius_lite.sources.config_json import read_config_json

SUPPORTED_MODEL_TYPES = ("nemotron_h", PUZZLE_MODEL_TYPE)


def load_text_config(raw: dict[str, Any]) -> NemotronHConfig:
    """The decoder config of a checkpoint's config.json dict, validated and resolved."""
    model_type = raw.get("model_type")
    if model_type == "nemotron_h":
        return NemotronHConfig.from_dict(raw)
    if model_type == PUZZLE_MODEL_TYPE:
        return NemotronHPuzzleConfig.from_dict(raw)
    raise ConfigError(
        f"model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
    )


def load_config_file(path: str | Path) -> NemotronHConfig:
    return load_text_config(read_config_json(path))
