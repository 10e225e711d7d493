"""Reading a checkpoint's config.json as a plain dict (no config classes: no import cycle)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mobius_lite.errors import ConfigError
from mobius_lite.layout import CONFIG_FILE


def read_config_json(path: str | Path) -> dict[str, Any]:
    """config.json of a checkpoint directory (or the file itself) as a dict."""
    path = Path(path)
    if path.is_dir():
        path = path / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(f"no config.json at {path}: is this a Hugging Face checkpoint directory?")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} must hold a JSON object")
    return raw
