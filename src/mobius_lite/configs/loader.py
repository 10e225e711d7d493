"""Pick the config reader for a checkpoint by its model_type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.configs.puzzle import PUZZLE_MODEL_TYPE, NemotronHPuzzleConfig
from mobius_lite.errors import ConfigError

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


def read_config_json(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint directory (or the file itself) as a dict."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json at {path}: is this a Hugging Face checkpoint directory?")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return raw


def load_config_file(path: str | Path) -> NemotronHConfig:
    return load_text_config(read_config_json(path))
