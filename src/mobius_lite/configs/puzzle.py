"""NVIDIA's NAS-compressed "Puzzle" Nemotron-H (model_type nemotron_h_puzzle).

config.json carries `block_configs`: one entry per layer with its `block_type` and that layer's
overrides of the global fields (docs/puzzle.md lists the released format and its sources). The
overrides are resolved once, here, into the per-layer LayerSpecs; everything downstream reads
those and never the raw overrides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mobius_lite.configs.layers import LayerSpec
from mobius_lite.configs.nemotron_h import (
    LEGACY_FIELD_NAMES,
    NemotronHConfig,
    parse_layer_kind,
)
from mobius_lite.enums import LayerKind
from mobius_lite.errors import ConfigError
from mobius_lite.sources.config_json import read_config_json

PUZZLE_MODEL_TYPE = "nemotron_h_puzzle"

# The global fields a block of each kind may override (the fields its LayerSpec reads).
OVERRIDABLE_FIELDS: dict[LayerKind, tuple[str, ...]] = {
    LayerKind.MAMBA: (
        "mamba_num_heads",
        "mamba_head_dim",
        "ssm_state_size",
        "n_groups",
        "conv_kernel",
        "use_conv_bias",
        "use_bias",
        "chunk_size",
    ),
    LayerKind.ATTENTION: (
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "attention_bias",
        "sliding_window",
    ),
    LayerKind.MLP: ("intermediate_size", "mlp_bias"),
    LayerKind.MOE: (
        "n_routed_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "n_shared_experts",
        "moe_latent_size",
        "n_group",
        "topk_group",
        "norm_topk_prob",
        "routed_scaling_factor",
        "mlp_bias",
    ),
}

# Released Puzzle configs drop these from the global fields (they are per-block only), so a MoE
# block must give them itself unless config.json also has a global value: never a default.
REQUIRED_MOE_FIELDS = ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")

# Fields a Puzzle config.json may carry that describe the layer list in other words; each
# must agree with block_configs.
TOPOLOGY_FIELDS = (
    "layers_block_type",
    "layer_types",
    "hybrid_override_pattern",
    "num_hidden_layers",
)


@dataclass(frozen=True)
class BlockConfig:
    """One block_configs entry: the layer kind and its overrides (field name -> value)."""

    kind: LayerKind
    overrides: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, raw: Any, where: str) -> BlockConfig:
        """Read one entry as released: {"block_type": "moe", "moe_intermediate_size": 1280, ...}.

        A null value means "no override" (the released configs serialise unset fields so).
        """
        if isinstance(raw, BlockConfig):
            return raw
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{where}: expected an object with a block_type, found {raw!r}")
        if "block_type" not in raw:
            raise ConfigError(f"{where}: missing block_type (one of mamba, attention, mlp, moe)")
        kind = parse_layer_kind(raw["block_type"], f"{where}.block_type")
        allowed = OVERRIDABLE_FIELDS[kind]
        overrides: dict[str, Any] = {}
        for key, value in raw.items():
            if key == "block_type" or value is None:
                continue
            name = LEGACY_FIELD_NAMES.get(key, key)
            if name not in allowed:
                raise ConfigError(
                    f"{where} ({kind.value}): override {key!r} is not supported for a "
                    f"{kind.value} block; supported: {', '.join(allowed)}. Remove it if it "
                    "does not change the block, or report the checkpoint."
                )
            if name in overrides:
                raise ConfigError(f"{where}: {name!r} is given twice (also as a legacy name)")
            overrides[name] = tuple(value) if isinstance(value, list) else value
        return cls(kind=kind, overrides=tuple(sorted(overrides.items())))

    def as_dict(self) -> dict[str, Any]:
        """The released spelling: block_type plus the overrides."""
        return {"block_type": self.kind.value, **dict(self.overrides)}


def parse_blocks(raw: Any, field: str) -> tuple[BlockConfig, ...]:
    if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
        raise ConfigError(f"{field} must be a list of block objects, found {raw!r}")
    return tuple(BlockConfig.parse(entry, f"{field}[{i}]") for i, entry in enumerate(raw))


@dataclass(frozen=True)
class NemotronHPuzzleConfig(NemotronHConfig):
    """A Nemotron-H whose layers each carry their own sizes (block_configs).

    The layer list is block_configs; layers_block_type, if given, must agree with it. Direct
    construction and `from_dict` resolve the same `layers`, so they give the same graph.
    """

    layers_block_type: tuple[LayerKind, ...] | None = None  # derived from block_configs
    block_configs: tuple[BlockConfig, ...] = ()
    # The multi-token-prediction head's blocks, with the head's own sizes (its MoE differs
    # from the backbone's). Without them a declared head is not exported: its shape is unknown.
    mtp_block_configs: tuple[BlockConfig, ...] = ()
    model_type: str = PUZZLE_MODEL_TYPE

    def __post_init__(self) -> None:
        blocks = parse_blocks(self.block_configs, "block_configs")
        if not blocks:
            raise ConfigError(
                "block_configs is empty: a nemotron_h_puzzle config lists one block per layer"
            )
        object.__setattr__(self, "block_configs", blocks)
        mtp_blocks = parse_blocks(self.mtp_block_configs, "mtp_block_configs")
        object.__setattr__(self, "mtp_block_configs", mtp_blocks)
        if mtp_blocks:
            object.__setattr__(
                self, "mtp_layers_block_type", tuple(block.kind for block in mtp_blocks)
            )
        derived = tuple(block.kind for block in blocks)
        if self.layers_block_type is not None:
            listed = tuple(
                k if isinstance(k, LayerKind) else parse_layer_kind(k, f"layers_block_type[{i}]")
                for i, k in enumerate(self.layers_block_type)
            )
            if listed != derived:
                raise ConfigError(
                    "layers_block_type disagrees with block_configs: "
                    f"{_pattern(listed)} vs {_pattern(derived)}; the layer list of a Puzzle "
                    "checkpoint is block_configs, fix or drop layers_block_type"
                )
        object.__setattr__(self, "layers_block_type", derived)
        super().__post_init__()  # validates the globals and resolves layers via layer_spec

    def layer_spec(self, index: int, kind: LayerKind, **overrides: Any) -> LayerSpec:
        """Resolve layer `index` with its block's overrides (explicit `overrides` win)."""
        block = self.block_configs[index]
        if block.kind is not kind:
            raise ConfigError(
                f"layer {index}: block_configs says {block.kind.value}, asked for {kind.value}"
            )
        return super().layer_spec(index, kind, **{**dict(block.overrides), **overrides})

    def resolve_mtp_layers(self) -> tuple[LayerSpec, ...]:
        """The head's blocks from mtp_block_configs; () without them (shape unknown)."""
        if not self.mtp_block_configs:
            return ()
        return super().resolve_mtp_layers()

    def mtp_layer_spec(self, index: int, kind: LayerKind, **overrides: Any) -> LayerSpec:
        """The head's block `index` with its mtp_block_configs overrides."""
        block = self.mtp_block_configs[index % len(self.mtp_block_configs)]  # depth d's copy
        return super().mtp_layer_spec(index, kind, **{**dict(block.overrides), **overrides})

    # ----------------------------------------------------------------- reading
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> NemotronHPuzzleConfig:
        """Read a released Puzzle config.json (block_configs + global fields)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, found {type(raw).__name__}")
        if "block_configs" not in raw:
            raise ConfigError(
                f"model_type {raw.get('model_type')!r} config has no block_configs: a Puzzle "
                "checkpoint lists one block (block_type + overrides) per layer"
            )
        blocks = parse_blocks(raw["block_configs"], "block_configs")
        if not blocks:
            raise ConfigError("block_configs is empty: the model has no layers")
        mtp = parse_blocks(raw.get("mtp_block_configs") or [], "mtp_block_configs")
        _check_topology(raw, blocks)
        _check_required_moe_fields(raw, blocks)
        _check_required_moe_fields(raw, mtp, "mtp_block_configs")
        data = {k: v for k, v in raw.items() if k not in TOPOLOGY_FIELDS}
        data["layers_block_type"] = [block.kind.value for block in blocks]
        data["block_configs"] = blocks
        data["mtp_block_configs"] = mtp
        data["model_type"] = PUZZLE_MODEL_TYPE
        config = super().from_dict(data)
        assert isinstance(config, NemotronHPuzzleConfig)
        return config

    @classmethod
    def from_file(cls, path: str | Path) -> NemotronHPuzzleConfig:
        return cls.from_dict(read_config_json(path))

    def to_dict(self) -> dict[str, Any]:
        """The config in the released Puzzle spelling (block_configs carry the overrides)."""
        out = super().to_dict()
        out.pop("layers_block_type", None)
        out["block_configs"] = [block.as_dict() for block in self.block_configs]
        out["mtp_block_configs"] = [block.as_dict() for block in self.mtp_block_configs]
        return out


def _pattern(kinds: Sequence[LayerKind]) -> str:
    return "".join(k.pattern_char for k in kinds)


def _check_topology(raw: dict[str, Any], blocks: tuple[BlockConfig, ...]) -> None:
    """Every other description of the layer list in config.json must agree with block_configs."""
    derived = [block.kind for block in blocks]
    for field in ("layers_block_type", "layer_types"):
        listed = raw.get(field)
        if listed is None:
            continue
        if isinstance(listed, str) or not isinstance(listed, (list, tuple)):
            raise ConfigError(f"{field} must be a list, found {listed!r}")
        kinds = [parse_layer_kind(k, f"{field}[{i}]") for i, k in enumerate(listed)]
        if kinds != derived:
            raise ConfigError(
                f"{field} ({len(kinds)} layers, {_pattern(kinds)}) disagrees with block_configs "
                f"({len(derived)} layers, {_pattern(derived)}); the layer list of a Puzzle "
                f"checkpoint is block_configs: fix or drop {field}"
            )
    pattern = raw.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str):
            raise ConfigError(f"hybrid_override_pattern must be a string, found {pattern!r}")
        kinds = [
            parse_layer_kind(ch, f"hybrid_override_pattern[{i}]") for i, ch in enumerate(pattern)
        ]
        if kinds != derived:
            raise ConfigError(
                f"hybrid_override_pattern {pattern} disagrees with block_configs "
                f"{_pattern(derived)}; fix or drop hybrid_override_pattern"
            )
    declared = raw.get("num_hidden_layers")
    if declared is not None and declared != len(blocks):
        raise ConfigError(
            f"num_hidden_layers={declared} but block_configs lists {len(blocks)} layers; "
            "fix or drop num_hidden_layers"
        )


def _check_required_moe_fields(
    raw: dict[str, Any], blocks: tuple[BlockConfig, ...], field: str = "block_configs"
) -> None:
    """A MoE block's expert count, top-k and width come from the block or a global: no default."""
    globals_given = {LEGACY_FIELD_NAMES.get(k, k) for k, v in raw.items() if v is not None}
    for i, block in enumerate(blocks):
        if block.kind is not LayerKind.MOE:
            continue
        given = globals_given | {name for name, _ in block.overrides}
        missing = [name for name in REQUIRED_MOE_FIELDS if name not in given]
        if missing:
            raise ConfigError(
                f"{field}[{i}] (moe) gives no {', '.join(missing)} and config.json has "
                "no global value for it; a Puzzle checkpoint sets these per block"
            )
