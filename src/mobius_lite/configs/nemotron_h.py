"""The Nemotron-H text config: read from config.json (released or transformers 5.x layout) or
constructed directly, validated once, and resolved into one LayerSpec per layer."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mobius_lite.configs.layers import (
    MTP_SCOPE,
    AttentionSpec,
    LayerSpec,
    MambaSpec,
    MLPSpec,
    MoESpec,
)
from mobius_lite.configs.values import (
    decode_float,
    encode_float,
    require_divides,
    require_positive_int,
)
from mobius_lite.enums import LayerKind, Precision
from mobius_lite.errors import ConfigError
from mobius_lite.sources.config_json import read_config_json

# Older config field names -> the names transformers 5.x writes.
LEGACY_FIELD_NAMES = {
    "mamba_n_groups": "n_groups",
    "mamba_d_conv": "conv_kernel",
    "mamba_expand": "expand",
    "mamba_dt_min": "time_step_min",
    "mamba_dt_max": "time_step_max",
    "mamba_dt_limit": "time_step_limit",
    "mamba_dt_init_floor": "time_step_floor",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_chunk_size": "chunk_size",
    "mamba_d_state": "ssm_state_size",
    "num_local_experts": "n_routed_experts",
}

# Every spelling of a layer kind found in released and transformers configs.
BLOCK_TYPE_NAMES = {
    "mamba": LayerKind.MAMBA,
    "linear_attention": LayerKind.MAMBA,
    "m": LayerKind.MAMBA,
    "attention": LayerKind.ATTENTION,
    "full_attention": LayerKind.ATTENTION,
    "*": LayerKind.ATTENTION,
    "mlp": LayerKind.MLP,
    "-": LayerKind.MLP,
    "moe": LayerKind.MOE,
    "e": LayerKind.MOE,
}

SSM_CACHE_DTYPES = tuple(p.numpy_name for p in Precision)


def parse_layer_kind(name: Any, field_name: str) -> LayerKind:
    """Map one block-type spelling (e.g. 'linear_attention', 'M') to a LayerKind."""
    kind = BLOCK_TYPE_NAMES.get(str(name).lower()) if isinstance(name, str) else None
    if kind is None:
        raise ConfigError(
            f"{field_name}: unknown layer kind {name!r}; expected one of "
            "mamba/linear_attention (M), attention/full_attention (*), mlp (-), moe (E)"
        )
    return kind


@dataclass(frozen=True)
class NemotronHConfig:
    """Nemotron-H text decoder hyperparameters, with transformers 5.x field names and defaults.

    Construct it directly or with `from_dict` / `from_file`; both run the same validation and
    resolve the same `layers`, so they give the same graph and cache ABI.
    """

    vocab_size: int = 131072
    hidden_size: int = 4096
    layers_block_type: tuple[LayerKind, ...] = (
        LayerKind.MAMBA,
        LayerKind.MOE,
        LayerKind.ATTENTION,
        LayerKind.MLP,
    )
    tie_word_embeddings: bool = False
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | tuple[int, ...] | None = 2
    max_position_embeddings: int = 4096
    layer_norm_epsilon: float = 1e-5
    # attention
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    attention_bias: bool = False
    sliding_window: int | None = None
    # mlp
    intermediate_size: int = 21504
    mlp_hidden_act: str = "relu2"
    mlp_bias: bool = False
    # mamba
    ssm_state_size: int = 128
    mamba_num_heads: int = 128
    mamba_head_dim: int = 64
    mamba_hidden_act: str = "silu"
    n_groups: int = 8
    conv_kernel: int = 4
    expand: int = 2
    chunk_size: int = 128
    use_conv_bias: bool = True
    use_bias: bool = False
    # time_step_min/max/floor only initialise dt_bias; time_step_limit is the runtime clamp.
    time_step_min: float = 0.001
    time_step_max: float = 0.1
    time_step_floor: float = 1e-4
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    mamba_ssm_cache_dtype: str = "float32"
    # moe
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 7688
    moe_shared_expert_intermediate_size: int = 7688
    moe_latent_size: int | None = None
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    # multi-token prediction head: its own graph (mtp.onnx) when the checkpoint holds it.
    # num_nextn_predict_layers is the head's depth: the chained drafts it was trained for.
    num_nextn_predict_layers: int = 0
    mtp_layers_block_type: tuple[LayerKind, ...] = (LayerKind.ATTENTION, LayerKind.MOE)
    # Megatron's name: True / None, the weights hold one depth (mtp_layers_block_type's
    # blocks) that every chained draft repeats (Nemotron 3.5 Lightning, 3 Super / Ultra);
    # False, they hold num_nextn_predict_layers distinct depths, chained in order.
    mtp_use_repeated_layer: bool | None = None
    model_type: str = "nemotron_h"
    layers: tuple[LayerSpec, ...] = field(init=False, repr=False, compare=False)
    # The head's blocks (mtp.layers.{i}), empty without a head; see mtp_layer_spec.
    mtp_layers: tuple[LayerSpec, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = tuple(
            parse_layer_kind(k, f"layers_block_type[{i}]") if not isinstance(k, LayerKind) else k
            for i, k in enumerate(self.layers_block_type)
        )
        object.__setattr__(self, "layers_block_type", kinds)
        mtp_kinds = tuple(
            parse_layer_kind(k, f"mtp_layers_block_type[{i}]")
            if not isinstance(k, LayerKind)
            else k
            for i, k in enumerate(self.mtp_layers_block_type)
        )
        object.__setattr__(self, "mtp_layers_block_type", mtp_kinds)
        limit = tuple(
            decode_float(v, f"time_step_limit[{i}]") for i, v in enumerate(self.time_step_limit)
        )
        object.__setattr__(self, "time_step_limit", limit)
        if isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))
        self._validate()
        object.__setattr__(
            self, "layers", tuple(self.layer_spec(i, k) for i, k in enumerate(kinds))
        )
        object.__setattr__(self, "mtp_layers", self.resolve_mtp_layers())

    # ----------------------------------------------------------------- validation
    def _validate(self) -> None:
        if not self.layers_block_type:
            raise ConfigError("layers_block_type is empty: the model has no layers")
        for name in ("vocab_size", "hidden_size"):
            require_positive_int(getattr(self, name), name)
        if self.mlp_hidden_act != "relu2":
            raise ConfigError(f"mlp_hidden_act={self.mlp_hidden_act!r}: only 'relu2' is supported")
        if self.mamba_hidden_act != "silu":
            raise ConfigError(
                f"mamba_hidden_act={self.mamba_hidden_act!r}: only 'silu' is supported"
            )
        if self.mamba_ssm_cache_dtype not in SSM_CACHE_DTYPES:
            raise ConfigError(
                f"mamba_ssm_cache_dtype={self.mamba_ssm_cache_dtype!r}: expected one of "
                f"{', '.join(SSM_CACHE_DTYPES)}"
            )
        if len(self.time_step_limit) != 2 or not (
            0.0 <= self.time_step_limit[0] <= self.time_step_limit[1]
        ):
            raise ConfigError(
                f"time_step_limit={self.time_step_limit!r}: expected [low, high] "
                "with 0 <= low <= high"
            )
        if not self.layer_norm_epsilon > 0:
            raise ConfigError(f"layer_norm_epsilon must be > 0, found {self.layer_norm_epsilon}")
        self._validate_mtp()

    def _validate_mtp(self) -> None:
        """A head of attention / MoE blocks, as vLLM's NemotronHMTP runs it, of depth
        num_nextn_predict_layers (one depth repeated, or that many distinct ones)."""
        depth = self.num_nextn_predict_layers
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ConfigError(
                f"num_nextn_predict_layers={depth!r}: expected the head's depth, an integer "
                ">= 0 (0: no multi-token-prediction head)"
            )
        if self.mtp_use_repeated_layer not in (None, True, False):
            raise ConfigError(
                f"mtp_use_repeated_layer={self.mtp_use_repeated_layer!r}: expected true or false"
            )
        if not depth:
            return
        kinds = self.mtp_layers_block_type
        if not kinds or any(k not in (LayerKind.ATTENTION, LayerKind.MOE) for k in kinds):
            raise ConfigError(
                "mtp_layers_block_type="
                f"{[k.value for k in kinds]}: the multi-token-prediction head's blocks must "
                "be attention or moe (e.g. ['full_attention', 'moe'], pattern '*E')"
            )

    # ----------------------------------------------------------------- resolution
    def layer_spec(self, index: int, kind: LayerKind, **overrides: Any) -> LayerSpec:
        """Resolve layer `index` of `kind`, with optional per-layer field overrides (Puzzle)."""
        get = lambda name: overrides.get(name, getattr(self, name))  # noqa: E731
        where = f"layer {index} ({kind.value})"
        if kind is LayerKind.MAMBA:
            spec: Any = MambaSpec(
                num_heads=require_positive_int(get("mamba_num_heads"), "mamba_num_heads"),
                head_dim=require_positive_int(get("mamba_head_dim"), "mamba_head_dim"),
                ssm_state_size=require_positive_int(get("ssm_state_size"), "ssm_state_size"),
                n_groups=require_positive_int(get("n_groups"), "n_groups"),
                conv_kernel=require_positive_int(get("conv_kernel"), "conv_kernel"),
                use_conv_bias=bool(get("use_conv_bias")),
                use_bias=bool(get("use_bias")),
                chunk_size=require_positive_int(get("chunk_size"), "chunk_size"),
                time_step_limit=self.time_step_limit,
                norm_epsilon=self.layer_norm_epsilon,
                ssm_cache_dtype=self.mamba_ssm_cache_dtype,
            )
            require_divides(spec.num_heads, spec.n_groups, f"{where}: mamba_num_heads / n_groups")
            if spec.conv_kernel < 2:
                raise ConfigError(f"{where}: conv_kernel must be >= 2, found {spec.conv_kernel}")
        elif kind is LayerKind.ATTENTION:
            spec = AttentionSpec(
                num_heads=require_positive_int(get("num_attention_heads"), "num_attention_heads"),
                num_kv_heads=require_positive_int(
                    get("num_key_value_heads"), "num_key_value_heads"
                ),
                head_dim=require_positive_int(get("head_dim"), "head_dim"),
            )
            require_divides(
                spec.num_heads,
                spec.num_kv_heads,
                f"{where}: num_attention_heads / num_key_value_heads",
            )
            if get("attention_bias"):
                raise ConfigError(
                    f"{where}: attention_bias=True is not supported (Nemotron-H attention has no "
                    "projection biases); set it to false if the checkpoint has none"
                )
            if get("sliding_window") is not None:
                raise ConfigError(
                    f"{where}: sliding_window={get('sliding_window')!r} is not supported; "
                    "Nemotron-H attention is global"
                )
        elif kind is LayerKind.MLP:
            spec = MLPSpec(
                intermediate_size=require_positive_int(
                    get("intermediate_size"), "intermediate_size"
                ),
                bias=bool(get("mlp_bias")),
            )
        else:
            latent = get("moe_latent_size")
            spec = MoESpec(
                n_routed_experts=require_positive_int(get("n_routed_experts"), "n_routed_experts"),
                num_experts_per_tok=require_positive_int(
                    get("num_experts_per_tok"), "num_experts_per_tok"
                ),
                moe_intermediate_size=require_positive_int(
                    get("moe_intermediate_size"), "moe_intermediate_size"
                ),
                shared_intermediate_size=int(get("moe_shared_expert_intermediate_size") or 0),
                n_shared_experts=int(get("n_shared_experts") or 0),
                latent_size=None
                if latent is None
                else require_positive_int(latent, "moe_latent_size"),
                n_group=require_positive_int(get("n_group"), "n_group"),
                topk_group=require_positive_int(get("topk_group"), "topk_group"),
                norm_topk_prob=bool(get("norm_topk_prob")),
                routed_scaling_factor=decode_float(
                    get("routed_scaling_factor"), "routed_scaling_factor"
                ),
                bias=bool(get("mlp_bias")),
            )
            self._validate_moe(spec, where)
        return LayerSpec(index=index, kind=kind, mixer=spec)

    @property
    def mtp_depths(self) -> int:
        """How many distinct depths the head's weights hold: 1 (repeated by every chained
        draft) unless mtp_use_repeated_layer is false; 0 without a head."""
        if not self.num_nextn_predict_layers:
            return 0
        return 1 if self.mtp_use_repeated_layer is not False else self.num_nextn_predict_layers

    def resolve_mtp_layers(self) -> tuple[LayerSpec, ...]:
        """The head's blocks (mtp.layers.{i}: each depth's blocks in turn), or () when the
        config declares no head."""
        kinds = self.mtp_layers_block_type * self.mtp_depths
        return tuple(self.mtp_layer_spec(i, k) for i, k in enumerate(kinds))

    def mtp_depth_layers(self, depth: int) -> tuple[LayerSpec, ...]:
        """Depth `depth`'s blocks: mtp.layers.{depth * B .. depth * B + B - 1}, B the blocks of
        one depth (mtp_layers_block_type); the first fuses, the last has the final norm."""
        if not 0 <= depth < self.mtp_depths:
            raise ValueError(f"the head has {self.mtp_depths} depth(s), not a depth {depth}")
        per_depth = len(self.mtp_layers_block_type)
        return self.mtp_layers[depth * per_depth : (depth + 1) * per_depth]

    def mtp_layer_spec(self, index: int, kind: LayerKind, **overrides: Any) -> LayerSpec:
        """Resolve the head's block `index` (mtp.layers.{index}): the global sizes, with
        optional overrides (Puzzle's mtp_block_configs)."""
        spec = NemotronHConfig.layer_spec(self, index, kind, **overrides)
        return dataclasses.replace(spec, scope=MTP_SCOPE)

    @property
    def has_mtp_head(self) -> bool:
        """Whether the config declares a multi-token-prediction head."""
        return bool(self.mtp_layers)

    @staticmethod
    def _validate_moe(spec: MoESpec, where: str) -> None:
        require_divides(spec.n_routed_experts, spec.n_group, f"{where}: n_routed_experts / n_group")
        per_group = spec.n_routed_experts // spec.n_group
        if per_group < 2:
            raise ConfigError(
                f"{where}: each routing group needs at least 2 experts (the group score is the sum "
                f"of its top-2), found n_routed_experts={spec.n_routed_experts}, "
                f"n_group={spec.n_group}"
            )
        if spec.topk_group > spec.n_group:
            raise ConfigError(
                f"{where}: topk_group={spec.topk_group} exceeds n_group={spec.n_group}"
            )
        if spec.num_experts_per_tok > spec.topk_group * per_group:
            raise ConfigError(
                f"{where}: num_experts_per_tok={spec.num_experts_per_tok} exceeds the "
                f"{spec.topk_group * per_group} experts reachable in "
                f"topk_group={spec.topk_group} groups"
            )
        if spec.n_shared_experts not in (0, 1):
            raise ConfigError(
                f"{where}: n_shared_experts={spec.n_shared_experts}: only 0 or 1 shared expert "
                "(of width moe_shared_expert_intermediate_size) is supported"
            )
        if spec.n_shared_experts and spec.shared_intermediate_size <= 0:
            raise ConfigError(
                f"{where}: n_shared_experts=1 needs moe_shared_expert_intermediate_size > 0"
            )

    # ----------------------------------------------------------------- reading
    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> NemotronHConfig:
        """Read a config.json dict as NVIDIA released it or as transformers 5.x writes it."""
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, found {type(raw).__name__}")
        data = dict(raw)
        for old, new in LEGACY_FIELD_NAMES.items():
            if old in data:
                value = data.pop(old)
                data.setdefault(new, value)
        kinds = data.pop("layers_block_type", None) or data.pop("layer_types", None)
        pattern = data.pop("hybrid_override_pattern", None)
        if kinds is None and pattern is not None:
            if not isinstance(pattern, str):
                raise ConfigError(f"hybrid_override_pattern must be a string, found {pattern!r}")
            kinds = [
                parse_layer_kind(ch, f"hybrid_override_pattern[{i}]")
                for i, ch in enumerate(pattern)
            ]
        elif kinds is not None and pattern is not None:
            from_pattern = [
                parse_layer_kind(ch, f"hybrid_override_pattern[{i}]")
                for i, ch in enumerate(pattern)
            ]
            listed = [parse_layer_kind(k, f"layers_block_type[{i}]") for i, k in enumerate(kinds)]
            if from_pattern != listed:
                raise ConfigError(
                    "layers_block_type and hybrid_override_pattern disagree: "
                    f"{''.join(k.pattern_char for k in listed)} vs {pattern}"
                )
        if kinds is None:
            raise ConfigError(
                "config has neither layers_block_type nor hybrid_override_pattern: "
                "the layer topology is unknown"
            )
        if not isinstance(kinds, (list, tuple)):
            raise ConfigError(f"layers_block_type must be a list, found {kinds!r}")
        mtp_kinds = _mtp_kinds(data)
        if mtp_kinds is not None:
            data["mtp_layers_block_type"] = mtp_kinds
        declared = data.pop("num_hidden_layers", None)
        if declared is not None and declared != len(kinds):
            raise ConfigError(
                f"num_hidden_layers={declared} but the layer pattern lists {len(kinds)} layers"
            )
        if "time_step_limit" in data:
            limit = data["time_step_limit"]
            if not isinstance(limit, (list, tuple)):
                raise ConfigError(f"time_step_limit must be a [low, high] pair, found {limit!r}")
            data["time_step_limit"] = tuple(limit)
        if data.get("head_dim") is None and "num_attention_heads" in data:
            data["head_dim"] = int(data.get("hidden_size", cls.hidden_size)) // int(
                data["num_attention_heads"]
            )
        if data.get("num_key_value_heads") is None and "num_attention_heads" in data:
            data["num_key_value_heads"] = data["num_attention_heads"]
        names = {f.name for f in dataclasses.fields(cls) if f.init}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["layers_block_type"] = tuple(kinds)
        for float_field in (
            "layer_norm_epsilon",
            "time_step_min",
            "time_step_max",
            "time_step_floor",
        ):
            if float_field in kwargs:
                kwargs[float_field] = decode_float(kwargs[float_field], float_field)
        return cls(**kwargs)

    @classmethod
    def from_file(cls, path: str | Path) -> NemotronHConfig:
        """Read config.json (or the config.json inside a checkpoint directory)."""
        return cls.from_dict(read_config_json(path))

    def to_dict(self) -> dict[str, Any]:
        """The config as transformers 5.x writes it (layers_block_type spelled its way)."""
        spelled = {
            LayerKind.MAMBA: "linear_attention",
            LayerKind.ATTENTION: "full_attention",
            LayerKind.MLP: "mlp",
            LayerKind.MOE: "moe",
        }
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if f.name in ("layers_block_type", "mtp_layers_block_type"):
                value = [spelled[k] for k in value]
            elif f.name == "mtp_use_repeated_layer" and value is None:
                continue  # unset: the config.json of a checkpoint that does not say
            elif f.name == "time_step_limit":
                value = [encode_float(v) for v in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    # ----------------------------------------------------------------- views
    @property
    def num_hidden_layers(self) -> int:
        return len(self.layers)

    def layers_of(self, kind: LayerKind) -> tuple[LayerSpec, ...]:
        return tuple(layer for layer in self.layers if layer.kind is kind)

    @property
    def pattern(self) -> str:
        return "".join(layer.kind.pattern_char for layer in self.layers)


def _mtp_kinds(data: dict[str, Any]) -> tuple[LayerKind, ...] | None:
    """The head's block kinds from mtp_layers_block_type or the legacy
    mtp_hybrid_override_pattern (e.g. "*E"), popped from `data`; None when neither is given."""
    listed = data.pop("mtp_layers_block_type", None)
    pattern = data.pop("mtp_hybrid_override_pattern", None)
    if listed is not None and (isinstance(listed, str) or not isinstance(listed, (list, tuple))):
        raise ConfigError(f"mtp_layers_block_type must be a list, found {listed!r}")
    if pattern is not None and not isinstance(pattern, str):
        raise ConfigError(f"mtp_hybrid_override_pattern must be a string, found {pattern!r}")
    kinds = (
        None
        if listed is None
        else tuple(parse_layer_kind(k, f"mtp_layers_block_type[{i}]") for i, k in enumerate(listed))
    )
    from_pattern = (
        None
        if pattern is None
        else tuple(
            parse_layer_kind(ch, f"mtp_hybrid_override_pattern[{i}]")
            for i, ch in enumerate(pattern)
        )
    )
    if kinds is not None and from_pattern is not None and kinds != from_pattern:
        raise ConfigError(
            "mtp_layers_block_type and mtp_hybrid_override_pattern disagree: "
            f"{''.join(k.pattern_char for k in kinds)} vs {pattern}; drop one of them"
        )
    return kinds if kinds is not None else from_pattern
