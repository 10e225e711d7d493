"""Random Omni vision-tower and projector tensors under the released checkpoint names (what
transformers' `save_pretrained` writes for NemotronH_Omni_Reasoning_V3): the C-RADIO tower
under `vision_model.radio_model.`, the projector as `mlp1.{0,1,3}`."""

from __future__ import annotations

from typing import Any

import numpy as np

from mobius_lite.demo.tensors import Random, Tensors


def vision_tensors(
    vision: dict[str, Any], text_hidden: int, projector: int, ratio: float, r: Random
) -> Tensors:
    """Patch and video embedders, class / register tokens, position table, the blocks
    (pre-norm attention with a fused qkv, GELU MLP, LayerScale 1), and the projector: a norm
    over the pixel-shuffled features (hidden / ratio^2), then two linear layers."""
    h, patch = vision["hidden_size"], vision["patch_size"]
    channels = vision["num_channels"]
    grid = vision["max_img_size"] // patch
    root = "vision_model.radio_model.model."
    out: Tensors = {
        root + "patch_generator.embedder.weight": r.weight(h, channels * patch * patch),
        root + "patch_generator.video_embedder.weight": r.weight(
            h, channels * patch * patch * vision["video_temporal_patch_size"]
        ),
        root + "patch_generator.pos_embed": r.weight(1, grid * grid, h) * np.float32(np.sqrt(h)),
    }
    tokens = vision["num_cls_tokens"] + vision["num_registers"]
    out[root + "patch_generator.cls_token.token"] = r.weight(tokens, h) * np.float32(np.sqrt(h))
    mlp = int(h * vision["mlp_ratio"])
    for i in range(vision["num_hidden_layers"]):
        b = f"{root}blocks.{i}."
        out.update(
            {
                b + "norm1.weight": r.norm(h),
                b + "norm1.bias": r.bias(h),
                b + "attn.qkv.weight": r.weight(3 * h, h),
                b + "attn.qkv.bias": r.bias(3 * h),
                b + "attn.proj.weight": r.weight(h, h),
                b + "attn.proj.bias": r.bias(h),
                b + "layer_scale1.lambda1": np.ones(h, np.float32),
                b + "norm2.weight": r.norm(h),
                b + "norm2.bias": r.bias(h),
                b + "mlp.fc1.weight": r.weight(mlp, h),
                b + "mlp.fc1.bias": r.bias(mlp),
                b + "mlp.fc2.weight": r.weight(h, mlp),
                b + "mlp.fc2.bias": r.bias(h),
                b + "layer_scale2.lambda1": np.ones(h, np.float32),
            }
        )
    out["vision_model.radio_model.summary_idxs"] = np.asarray(vision["summary_idxs"], np.int64)
    shuffled = int(round(h / (ratio * ratio)))
    out["mlp1.0.weight"] = r.norm(shuffled)
    out["mlp1.1.weight"] = r.weight(projector, shuffled)
    out["mlp1.3.weight"] = r.weight(text_hidden, projector)
    return out
