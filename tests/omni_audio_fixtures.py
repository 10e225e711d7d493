"""Tiny Nemotron-H Omni references with a Parakeet sound encoder (transformers, torch FP32)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3_Config,
)
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
)

from reference_fixtures.omni_fixtures import TINY_TEXT, TINY_VISION

# Two encoder sizes; the first spells out the ParakeetEncoderConfig-style flags (attention
# bias, input scaling), the second leaves them to the Omni config's defaults (both False).
SMALL_AUDIO: dict[str, Any] = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=24,
    conv_kernel_size=5,
    subsampling_conv_channels=8,
    num_mel_bins=16,
    attention_bias=True,
    scale_input=True,
    projection_hidden_size=20,
    projection_bias=True,
)
WIDER_AUDIO: dict[str, Any] = dict(
    hidden_size=24,
    num_hidden_layers=1,
    num_attention_heads=3,
    intermediate_size=32,
    conv_kernel_size=3,
    subsampling_conv_channels=4,
    num_mel_bins=24,
    projection_hidden_size=28,
    projection_bias=False,
)


def omni_audio_config(audio: dict[str, Any]) -> NemotronH_Omni_Reasoning_V3_Config:
    """An Omni config with the tiny vision/text parts and the given audio_config."""
    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=dict(TINY_VISION),
        text_config=dict(TINY_TEXT),
        audio_config=dict(audio),
        vision_hidden_size=TINY_VISION["hidden_size"],
        projector_hidden_size=40,
    )
    config._attn_implementation = "eager"
    return config


def make_omni_audio(audio: dict[str, Any], seed: int = 0) -> NemotronH_Omni_Reasoning_V3:
    """An FP32 eager Omni model whose audio tensors (BatchNorm statistics too) are non-trivial."""
    torch.manual_seed(seed)
    model = NemotronH_Omni_Reasoning_V3(omni_audio_config(audio)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if not name.startswith(("audio_tower.", "embed_audio.")):
                continue
            if name.endswith("num_batches_tracked"):
                continue
            if name.endswith("running_var"):
                tensor.copy_(0.5 + torch.rand(tensor.shape, generator=gen))
            elif name.endswith(("running_mean", "bias_u", "bias_v")) or tensor.ndim == 1:
                base = 1.0 if name.endswith("weight") else 0.0
                tensor.copy_(base + 0.2 * torch.randn(tensor.shape, generator=gen))
            else:
                fan_in = tensor[0].numel()
                tensor.copy_(torch.randn(tensor.shape, generator=gen) / fan_in**0.5)
    return model


def audio_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The audio tower and projector tensors of the state dict, by their transformers names."""
    return {
        k: v.detach().numpy()
        for k, v in model.state_dict().items()
        if k.startswith(("audio_tower.", "embed_audio."))
    }


def padded_batch(
    lengths: list[int], frames: int, mel_bins: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random features [clips, frames, mel] (padding non-zero too: the first conv reads it) and
    the int64 mask of each clip's first `length` frames."""
    gen = np.random.default_rng(seed)
    features = gen.standard_normal((len(lengths), frames, mel_bins)).astype(np.float32)
    mask = (np.arange(frames)[None, :] < np.array(lengths)[:, None]).astype(np.int64)
    return features, mask


def waveforms(lengths: list[int], sampling_rate: int, seed: int) -> list[np.ndarray]:
    """Clips of a few tones plus noise (every frequency bin carries energy), in [-1, 1]."""
    gen = np.random.default_rng(seed)
    clips = []
    for n in lengths:
        t = np.arange(n) / sampling_rate
        tones = sum(
            0.3 * np.sin(2 * np.pi * gen.uniform(80, sampling_rate / 2.5) * t) for _ in range(3)
        )
        clips.append((tones + 0.05 * gen.standard_normal(n)).astype(np.float32))
    return clips
