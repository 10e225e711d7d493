"""Config readers: raw config.json -> frozen, validated dataclasses with per-layer specs."""

from mobius_lite.configs.layers import (
    AttentionSpec,
    LayerSpec,
    MambaSpec,
    MLPSpec,
    MoESpec,
)
from mobius_lite.configs.nemotron_h import NemotronHConfig

__all__ = [
    "AttentionSpec",
    "LayerSpec",
    "MLPSpec",
    "MambaSpec",
    "MoESpec",
    "NemotronHConfig",
]
