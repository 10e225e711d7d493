"""Nemotron-H Omni's vision tower config: the C-RADIO spec (transformers' RadioConfig field
names) and what the vision graphs need from an Omni config.json.

Validated once, where the Omni config is parsed (configs/omni.py): every error is a
ConfigError naming the field, raised before any tensor is read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius_lite.configs.values import omni_text_config
from mobius_lite.errors import ConfigError

# hidden_act spellings -> the ONNX Gelu approximation attribute (components/radio.py)
GELU_APPROXIMATION = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


@dataclass(frozen=True)
class RadioSpec:
    """The vision tower's hyperparameters, read from a RadioConfig dict (its field names)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    layer_norm_eps: float
    qkv_bias: bool
    use_swiglu_ffn: bool
    patch_size: int
    num_channels: int
    max_grid: int  # position-table side: max_img_size // patch_size
    num_prefix_tokens: int  # cls + register tokens before each image's patches
    video_temporal_patch_size: int | None
    layer_scale: bool = False  # the checkpoint holds layer_scale{1,2}.lambda1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        return self.num_channels * self.patch_size**2

    @classmethod
    def from_dict(
        cls, config: Mapping[str, Any], default_temporal_patch_size: int | None = None
    ) -> RadioSpec:
        """Validate a RadioConfig-shaped dict (missing fields take RadioConfig's defaults)."""
        hidden = int(config.get("hidden_size", 1280))
        heads = int(config.get("num_attention_heads", 16))
        ratio = float(config.get("mlp_ratio", 4.0))
        swiglu = bool(config.get("use_swiglu_ffn", False))
        act = str(config.get("hidden_act", "gelu"))
        intermediate = int(hidden * ratio)
        if swiglu:
            # RadioSwiGLUFFN keeps two thirds of the MLP width, rounded up to a multiple of 8
            intermediate = (int(intermediate * 2 / 3) + 7) // 8 * 8
        elif act not in GELU_APPROXIMATION:
            raise ConfigError(f"vision_config.hidden_act={act!r} is not supported")
        if hidden % heads:
            raise ConfigError("vision_config.hidden_size must be a multiple of num_attention_heads")
        patch = int(config.get("patch_size", 16))
        temporal = config.get("video_temporal_patch_size", default_temporal_patch_size)
        return cls(
            hidden_size=hidden,
            num_layers=int(config.get("num_hidden_layers", 32)),
            num_heads=heads,
            intermediate_size=intermediate,
            hidden_act=act,
            layer_norm_eps=float(config.get("layer_norm_eps", 1e-6)),
            qkv_bias=bool(config.get("qkv_bias", True)),
            use_swiglu_ffn=swiglu,
            patch_size=patch,
            num_channels=int(config.get("num_channels", 3)),
            max_grid=int(config.get("max_img_size", 2048)) // patch,
            num_prefix_tokens=int(config.get("num_cls_tokens", 3))
            + int(config.get("num_registers", 7)),
            video_temporal_patch_size=None if temporal is None else int(temporal),
        )


@dataclass(frozen=True)
class OmniVisionConfig:
    """What the vision graphs need from an Omni config.json (transformers' field names; the
    released legacy names llm_config / vit_hidden_size are accepted too)."""

    radio: RadioSpec
    downsample_factor: int  # 1 / downsample_ratio
    projector_hidden_size: int
    text_hidden_size: int
    final_layernorm: bool  # the language model has MTP layers (Megatron adds the norm then)
    video_pruning_rate: float

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> OmniVisionConfig:
        """Validate the fields of an Omni config dict; errors name the field."""
        text = omni_text_config(config)
        temporal = int(config.get("video_temporal_patch_size", 2))
        radio = RadioSpec.from_dict(config.get("vision_config") or {}, temporal)
        if radio.video_temporal_patch_size != temporal:
            raise ConfigError(
                "vision_config.video_temporal_patch_size and video_temporal_patch_size differ"
            )
        vision_hidden = int(config.get("vision_hidden_size", config.get("vit_hidden_size", 1280)))
        if vision_hidden != radio.hidden_size:
            raise ConfigError("vision_hidden_size must equal vision_config.hidden_size")
        ratio = float(config.get("downsample_ratio", 0.5))
        factor = round(1 / ratio)
        if factor < 1 or abs(factor * ratio - 1) > 1e-9:
            raise ConfigError(f"downsample_ratio={ratio} is not 1 / an integer")
        rate = float(config.get("video_pruning_rate", 0.0))
        if not 0.0 <= rate < 1.0:
            raise ConfigError(f"video_pruning_rate={rate} is outside [0, 1)")
        return cls(
            radio=radio,
            downsample_factor=factor,
            projector_hidden_size=int(config.get("projector_hidden_size", 4096)),
            text_hidden_size=int(text["hidden_size"]),
            final_layernorm=int(text.get("num_nextn_predict_layers", 0) or 0) > 0,
            video_pruning_rate=rate,
        )
