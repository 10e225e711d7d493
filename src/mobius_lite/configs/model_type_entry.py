"""What one model type (config.json's `model_type`) is to the exporter: the registry entry.

Each entry owns how its config is recognised and read, which task it exports and which
reference implementation qualifies its packages. The entries live with their configs
(configs/loader.py for the decoders, configs/omni.py for Omni); configs/model_types.py is the
registry that lists them. The qualify reference is named, not imported ("module:function"),
because it is evaluation code, four layers above configs: it is imported only when qualify
runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from mobius_lite.enums import Task

if TYPE_CHECKING:
    from mobius_lite.configs.nemotron_h import NemotronHConfig
    from mobius_lite.configs.omni import OmniConfig

ModelConfig: TypeAlias = "NemotronHConfig | OmniConfig"


def _never(raw: Mapping[str, Any]) -> bool:
    return False


def _itself(config: ModelConfig) -> NemotronHConfig:
    return config  # type: ignore[return-value]  # a decoder's config is its decoder's


@dataclass(frozen=True)
class ModelType:
    """One model type: its config reader, task and qualify reference."""

    name: str  # config.json's model_type
    read_config: Callable[[dict[str, Any]], ModelConfig]  # validated, resolved; ConfigError
    task: Task
    # "module:function" loading the reference torch module from a checkpoint directory
    reference: str
    reference_name: str  # how qualify's report names that implementation
    # the decoder's config within this type's config (the config itself for a decoder)
    decoder: Callable[[ModelConfig], NemotronHConfig] = _itself
    # whether a config dict that names no model_type is of this type (Omni text configs)
    recognizes: Callable[[Mapping[str, Any]], bool] = _never

    def qualify_reference(self) -> Callable[..., Any]:
        """The reference loader, imported now."""
        module, _, function = self.reference.partition(":")
        return getattr(importlib.import_module(module), function)
