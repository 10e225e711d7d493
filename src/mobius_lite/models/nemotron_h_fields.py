"""Config fields that Nemotron-H's tensors determine, checked when config.json leaves them out.

A config without `hidden_size` parses with the default (4096, as transformers does), and the
binding then lists some thirty wrong-shape tensors without naming the field. A field the
config does not state but a tensor's shape fixes is named here instead, before any binding:
"config.json has no hidden_size; its tensors say 64 (backbone.embeddings.weight is
[97, 64])". Fields the config does state are left to the binding's shape check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind
from mobius_lite.errors import ConfigError
from mobius_lite.models.nemotron_h_names import EMBEDDING_WEIGHT, SourceLayout
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import as_ref


@dataclass(frozen=True)
class TensorField:
    """A config field equal to one axis of one graph parameter (in the first layer of
    `layer_kind` when the parameter is per layer)."""

    field: str
    parameter: str  # graph parameter name; "{i}" is the layer index
    axis: int
    layer_kind: LayerKind | None = None
    spec_attr: str = ""  # per layer: the layer's mixer spec attribute the config resolved


TENSOR_FIELDS = (
    TensorField("hidden_size", EMBEDDING_WEIGHT, 1),
    TensorField("vocab_size", EMBEDDING_WEIGHT, 0),
    TensorField(
        "mamba_num_heads", "backbone.layers.{i}.mixer.A_log", 0, LayerKind.MAMBA, "num_heads"
    ),
    TensorField(
        "intermediate_size",
        "backbone.layers.{i}.mixer.up_proj.weight",
        0,
        LayerKind.MLP,
        "intermediate_size",
    ),
    TensorField(
        "n_routed_experts",
        "backbone.layers.{i}.mixer.gate.weight",
        0,
        LayerKind.MOE,
        "n_routed_experts",
    ),
)


def _parameter(spec: TensorField, config: NemotronHConfig) -> tuple[str, int] | None:
    """The graph parameter to look at and the size the config gives its axis (per layer:
    the first layer of that kind, whose spec may come from a Puzzle block config)."""
    if spec.layer_kind is None:
        return spec.parameter, getattr(config, spec.field)
    for index, layer in enumerate(config.layers):
        if layer.kind is spec.layer_kind:
            return spec.parameter.format(i=index), getattr(layer.mixer, spec.spec_attr)
    return None


def _shape(parameter: str, source: TensorSource, layout: SourceLayout) -> tuple[str, tuple]:
    """The source name and shape of a graph parameter held as one source tensor, else ("", ())."""
    available = set(source.names())
    for candidate in layout.names.alternatives(parameter, ()):
        names = as_ref(candidate).names
        if len(names) == 1 and names[0] in available:
            return names[0], tuple(source.info(names[0]).shape)
    return "", ()


def check_tensor_fields(
    stated: Callable[[str], bool],
    config: NemotronHConfig,
    source: TensorSource,
    layout: SourceLayout,
    config_name: str = "config.json",
) -> None:
    """Raise ConfigError naming the first field the config does not state (`stated(field)`
    is False) whose default disagrees with the tensors."""
    for spec in TENSOR_FIELDS:
        if stated(spec.field):
            continue
        found = _parameter(spec, config)
        if found is None:
            continue
        parameter, configured = found
        name, shape = _shape(parameter, source, layout)
        if len(shape) <= spec.axis or shape[spec.axis] == configured:
            continue
        size = shape[spec.axis]
        raise ConfigError(
            f"{config_name} has no {spec.field}; its tensors say {size} ({name} is "
            f"{list(shape)}), while the default would be {configured}: add "
            f'"{spec.field}": {size} to {config_name}'
        )


def stated_fields(raw: Mapping[str, Any], aliases: Mapping[str, str]) -> Callable[[str], bool]:
    """Whether a decoder config dict states a field, under its name or a legacy alias."""
    names = set(raw) | {aliases[k] for k in raw if k in aliases}
    return lambda field: field in names
