"""Nemotron-H Omni's audio tower config: the Parakeet FastConformer spec (transformers'
ParakeetEncoderConfig field names) and what the audio graph needs from an Omni config.json.

Validated once, where the Omni config is parsed (configs/omni.py): every error is a
ConfigError naming the field, raised before any tensor is read.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius_lite.configs.values import omni_text_config
from mobius_lite.errors import ConfigError

ACTIVATIONS = ("silu", "swish", "relu", "gelu", "gelu_pytorch_tanh")  # hidden_act values
# What NemotronH_Omni_Reasoning_V3_Config supplies when an audio config omits them (released
# checkpoints predate the fields and mean False; ParakeetEncoderConfig itself defaults to True).
_OMNI_AUDIO_DEFAULTS = {"attention_bias": False, "scale_input": False}


@dataclass(frozen=True)
class ParakeetSpec:
    """What the graph needs from a ParakeetEncoderConfig (transformers' field names)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    attention_bias: bool
    convolution_bias: bool
    conv_kernel_size: int
    subsampling_layers: int  # log2(subsampling_factor) stride convs
    subsampling_channels: int
    subsampling_kernel_size: int
    subsampling_stride: int
    num_mel_bins: int
    scale_input: bool

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def subsampled_length(self, frames: int) -> int:
        """Host-side twin of subsampled_lengths(): frames after every stride conv."""
        k, s = self.subsampling_kernel_size, self.subsampling_stride
        for _ in range(self.subsampling_layers):
            frames = (frames + 2 * ((k - 1) // 2) - k) // s + 1
        return frames

    @property
    def subsampled_mel_bins(self) -> int:
        return self.num_mel_bins // self.subsampling_stride**self.subsampling_layers

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> ParakeetSpec:
        """Validate a ParakeetEncoderConfig dict (its own defaults); errors name the field."""
        defaults = dict(
            hidden_size=1024,
            num_hidden_layers=24,
            num_attention_heads=8,
            intermediate_size=4096,
            hidden_act="silu",
            attention_bias=True,
            convolution_bias=True,
            conv_kernel_size=9,
            subsampling_factor=8,
            subsampling_conv_channels=256,
            num_mel_bins=80,
            subsampling_conv_kernel_size=3,
            subsampling_conv_stride=2,
            scale_input=True,
        )
        c = {**defaults, **{k: v for k, v in config.items() if v is not None}}
        hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
        if hidden % heads:
            raise ConfigError(
                f"audio_config.hidden_size={hidden} is not a multiple of num_attention_heads"
            )
        if c.get("head_dim") not in (None, hidden // heads):
            raise ConfigError("audio_config.head_dim must be hidden_size / num_attention_heads")
        factor = int(c["subsampling_factor"])
        if factor < 2 or factor & (factor - 1):
            raise ConfigError(f"audio_config.subsampling_factor={factor} is not a power of 2")
        kernel = int(c["conv_kernel_size"])
        if kernel % 2 == 0:
            raise ConfigError(
                f"audio_config.conv_kernel_size={kernel} must be odd ('same' padding)"
            )
        act = str(c["hidden_act"])
        if act not in ACTIVATIONS:
            raise ConfigError(f"audio_config.hidden_act={act!r} is not one of {ACTIVATIONS}")
        spec = cls(
            hidden_size=hidden,
            num_layers=int(c["num_hidden_layers"]),
            num_heads=heads,
            intermediate_size=int(c["intermediate_size"]),
            hidden_act=act,
            attention_bias=bool(c["attention_bias"]),
            convolution_bias=bool(c["convolution_bias"]),
            conv_kernel_size=kernel,
            subsampling_layers=int(math.log2(factor)),
            subsampling_channels=int(c["subsampling_conv_channels"]),
            subsampling_kernel_size=int(c["subsampling_conv_kernel_size"]),
            subsampling_stride=int(c["subsampling_conv_stride"]),
            num_mel_bins=int(c["num_mel_bins"]),
            scale_input=bool(c["scale_input"]),
        )
        bins = spec.num_mel_bins
        for _ in range(spec.subsampling_layers):
            bins = spec.conv_length(bins)
        if bins != spec.subsampled_mel_bins:
            # the reference sizes subsampling.linear from num_mel_bins // stride**layers
            raise ConfigError(
                f"audio_config.num_mel_bins={spec.num_mel_bins} subsamples to {bins} bins, not "
                f"{spec.subsampled_mel_bins}: use a multiple of "
                f"{spec.subsampling_stride**spec.subsampling_layers}"
            )
        return spec

    def conv_length(self, length: int) -> int:
        """One stride conv of the subsampling on a length (python ints)."""
        k, s = self.subsampling_kernel_size, self.subsampling_stride
        return (length + 2 * ((k - 1) // 2) - k) // s + 1


@dataclass(frozen=True)
class OmniAudioConfig:
    """What the audio graph needs from an Omni config.json (audio_config, or the released
    spelling sound_config with model_type "parakeet")."""

    encoder: ParakeetSpec
    projection_hidden_size: int
    projection_bias: bool
    text_hidden_size: int

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> OmniAudioConfig:
        """Validate the audio fields of an Omni config dict; errors name the field."""
        text = omni_text_config(config)
        audio = config.get("audio_config")
        if audio is None:
            audio = config.get("sound_config")
        if audio is None:
            raise ConfigError("audio_config (or sound_config) is missing: no audio tower")
        if not isinstance(audio, Mapping):
            raise ConfigError("audio_config must be a mapping")
        audio = {k: v for k, v in audio.items() if k != "model_type"}
        for name in ("projection_hidden_size", "projection_bias"):
            if audio.get(name) is None:
                raise ConfigError(f"audio_config.{name} is missing (the projector needs it)")
        return cls(
            encoder=ParakeetSpec.from_dict({**_OMNI_AUDIO_DEFAULTS, **audio}),
            projection_hidden_size=int(audio["projection_hidden_size"]),
            projection_bias=bool(audio["projection_bias"]),
            text_hidden_size=int(text["hidden_size"]),
        )
