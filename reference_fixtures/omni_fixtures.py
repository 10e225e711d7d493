"""Tiny Nemotron-H Omni references (transformers, torch FP32) and the processor's input layouts.

transformers' Omni image and video processors import torchvision, which is not installed here,
so the tests build their outputs as the processors do: normalised images cut into row-major,
channel-major (C, p, p) patches with image_grid_hw, and videos packed into tubelets of
video_temporal_patch_size frames stacked along channels, an odd frame count padded by repeating
the last frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import torch
from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3_Config,
)
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
)

PATCH = 4
TEMPORAL = 2
TINY_VISION: dict[str, Any] = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    patch_size=PATCH,
    max_img_size=32,  # an 8 x 8 position table: grids above 8 are upsampled, below cropped
    num_cls_tokens=2,
    num_registers=3,
    video_temporal_patch_size=TEMPORAL,
    layer_norm_eps=1e-6,
)
TINY_TEXT: dict[str, Any] = dict(
    vocab_size=50,
    hidden_size=24,
    num_hidden_layers=1,
    layers_block_type=["mamba"],
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=8,
    intermediate_size=16,
    ssm_state_size=8,
    mamba_num_heads=2,
    mamba_head_dim=8,
    n_groups=1,
)


def omni_config(final_layernorm: bool, pruning_rate: float) -> NemotronH_Omni_Reasoning_V3_Config:
    """The final vision LayerNorm exists exactly when the language model has MTP layers."""
    text = {**TINY_TEXT, "num_nextn_predict_layers": 1 if final_layernorm else 0}
    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=dict(TINY_VISION),
        text_config=text,
        vision_hidden_size=TINY_VISION["hidden_size"],
        projector_hidden_size=40,
        downsample_ratio=0.5,
        video_pruning_rate=pruning_rate,
        video_temporal_patch_size=TEMPORAL,
    )
    config._attn_implementation = "eager"
    return config


def make_omni(final_layernorm: bool, pruning_rate: float = 0.4, seed: int = 0):
    """An FP32 eager Omni model whose vision/projector tensors are all non-trivial."""
    torch.manual_seed(seed)
    model = NemotronH_Omni_Reasoning_V3(omni_config(final_layernorm, pruning_rate)).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if name.startswith("language_model.") or name.endswith("lambda1"):
            continue  # lambda1 stays layerscale_value = 1 (C-RADIO has no LayerScale)
        if name.endswith("position_embedding") or name.endswith("cls_register_token"):
            p.data = torch.randn(p.shape, generator=gen)
        elif p.ndim == 1:
            p.data = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
        else:
            p.data = torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5
    return model


def vision_state(model: torch.nn.Module) -> dict[str, np.ndarray]:
    """The non-language tensors of the state dict, by their transformers names."""
    return {
        k: v.detach().numpy()
        for k, v in model.state_dict().items()
        if not k.startswith("language_model.")
    }


def fuse_qkv(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """transformers' q_proj / k_proj / v_proj rows concatenated into the graph's fused qkv (the
    released checkpoint's attn.qkv layout), the three chunks removed."""
    fused = dict(state)
    for name in [n for n in state if ".attention.q_proj." in n]:
        parts = [name.replace(".q_proj.", f".{p}.") for p in ("q_proj", "k_proj", "v_proj")]
        fused[name.replace(".q_proj.", ".qkv.")] = np.concatenate([fused.pop(p) for p in parts])
    return fused


def bind(model: ir.Model, state: dict[str, np.ndarray]) -> set[str]:
    """Give every initializer its state-dict tensor (same name; q/k/v fused into qkv); returns
    the names left over."""
    state = fuse_qkv(state)
    missing = [n for n in model.graph.initializers if n not in state]
    if missing:
        raise KeyError(f"initializers without a state-dict tensor: {missing}")
    for name, value in model.graph.initializers.items():
        array = state[name]
        if tuple(array.shape) != tuple(value.shape):
            raise ValueError(f"{name}: {array.shape} vs graph {value.shape}")
        value.const_value = ir.tensor(np.ascontiguousarray(array), name=name)
    return set(state) - set(model.graph.initializers)


def session(model: ir.Model) -> ort.InferenceSession:
    proto = ir.serde.serialize_model(model)
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def pack_images(images: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Normalised [3, H, W] images -> (pixel_values [sum h*w, 3*p*p], image_grid_hw [n, 2])."""
    patches, grids = [], []
    for image in images:
        c, height, width = image.shape
        h, w = height // PATCH, width // PATCH
        cut = image.reshape(c, h, PATCH, w, PATCH).permute(1, 3, 0, 2, 4)
        patches.append(cut.reshape(h * w, c * PATCH * PATCH))
        grids.append((h, w))
    return torch.cat(patches).numpy(), np.array(grids, dtype=np.int64)


def pack_video(frames: torch.Tensor) -> np.ndarray:
    """[F, 3, H, W] frames -> [1, ceil(F / T), T * 3, H, W] tubelets (last frame repeated)."""
    count, c, height, width = frames.shape
    if count % TEMPORAL:
        pad = frames[-1:].expand(TEMPORAL - count % TEMPORAL, -1, -1, -1)
        frames = torch.cat([frames, pad])
    return frames.reshape(1, -1, TEMPORAL * c, height, width).numpy()
