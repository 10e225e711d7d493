"""Small helpers for reading released config.json values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from mobius_lite.errors import ConfigError


def decode_float(value: Any, field: str) -> float:
    """Read a float that released configs may encode as {"__float__": "Infinity"} or a string."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{field}: {value!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field}: expected a number, found {value!r}")
    return float(value)


def encode_float(value: float) -> Any:
    """The JSON-safe form of a float, using the released configs' encoding for infinities."""
    if math.isinf(value):
        return {"__float__": "Infinity" if value > 0 else "-Infinity"}
    return value


def require_positive_int(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{field} must be a positive integer, found {value!r}")
    return value


def require_divides(numerator: int, denominator: int, what: str) -> None:
    if denominator <= 0 or numerator % denominator:
        raise ConfigError(f"{what}: {numerator} is not divisible by {denominator}")


def omni_text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """An Omni config's language-model section (text_config, or the legacy llm_config)."""
    text = config.get("text_config", config.get("llm_config"))
    if not isinstance(text, Mapping):
        raise ConfigError("text_config (or llm_config) is missing")
    return text
