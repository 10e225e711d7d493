"""The demo checkpoints' config.json contents: tiny sizes, every field transformers 5 writes
for NemotronH (so `NemotronHForCausalLM.from_pretrained` reads them as they are), and the
Puzzle and Omni layouts of the released checkpoints."""

from __future__ import annotations

from typing import Any

from mobius_lite.demo.tensors import ATTENTION, MAMBA, MLP, MOE

# transformers 5's spelling in config.json of each mixer kind.
SPELLED = {MAMBA: "linear_attention", ATTENTION: "full_attention", MLP: "mlp", MOE: "moe"}
INFINITY = {"__float__": "Infinity"}  # how released configs write time_step_limit's top

TEXT_LAYERS = [MAMBA, ATTENTION, MAMBA, MLP]
MOE_LAYERS = [MAMBA, MOE, ATTENTION, MOE]


def nemotron_h_config(vocab_size: int, kinds: list[str], **overrides: Any) -> dict[str, Any]:
    """A NemotronH config.json: hidden 64, 4 + 2 attention heads of 16, 8 Mamba heads of 16
    (SSM inner size 128) in 2 groups, MLP width 128, 8 routed experts of width 32 (top 2)
    and a shared expert of 48."""
    config: dict[str, Any] = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "dtype": "float32",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "layers_block_type": [SPELLED[k] for k in kinds],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "attention_bias": False,
        "max_position_embeddings": 4096,
        "intermediate_size": 128,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "ssm_state_size": 16,
        "mamba_num_heads": 8,
        "mamba_head_dim": 16,
        "n_groups": 2,
        "conv_kernel": 4,
        "expand": 2,
        "chunk_size": 16,
        "use_conv_bias": True,
        "mamba_proj_bias": False,
        "mamba_hidden_act": "silu",
        "mamba_ssm_cache_dtype": "float32",
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        "time_step_limit": [0.0, INFINITY],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 48,
        "n_shared_experts": 1,
        "moe_latent_size": None,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 1.0,
        "num_nextn_predict_layers": 0,
        "mtp_layers_block_type": [SPELLED[ATTENTION], SPELLED[MOE]],
        "layer_norm_epsilon": 1e-5,
        "residual_in_fp32": False,
        "tie_word_embeddings": False,
        "use_cache": True,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    config.update(overrides)
    return config


# A Puzzle checkpoint's blocks: each block's own sizes (heads, expert count, top-k, widths,
# latent, shared expert) differ from the globals and from each other.
PUZZLE_BLOCKS: list[dict[str, Any]] = [
    {"block_type": MAMBA},
    {
        "block_type": MOE,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
    },
    {"block_type": ATTENTION, "num_attention_heads": 2, "num_key_value_heads": 1},
    {"block_type": MLP, "intermediate_size": 96},
    {
        "block_type": MOE,
        "n_routed_experts": 6,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 24,
        "moe_latent_size": 32,
        "n_shared_experts": 0,
        "n_group": 2,
        "topk_group": 1,
    },
]


def puzzle_config(vocab_size: int) -> dict[str, Any]:
    """A nemotron_h_puzzle config.json: the NemotronH globals without the per-block members
    (moe_intermediate_size, num_experts_per_tok), and `block_configs`."""
    config = nemotron_h_config(vocab_size, [MAMBA])
    for name in ("moe_intermediate_size", "num_experts_per_tok", "layers_block_type"):
        config.pop(name)
    config.update(
        architectures=["NemotronHPuzzleForCausalLM"],
        model_type="nemotron_h_puzzle",
        block_configs=[dict(block) for block in PUZZLE_BLOCKS],
    )
    return config


def puzzle_layer_configs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Each block's effective sizes: the globals, then the block's own entries."""
    return [{**config, **block} for block in config["block_configs"]]


# The Omni vision tower (C-RADIO): 2 blocks of width 32, 4 x 4 patches, an 8 x 8 position
# table, 2 class tokens and 3 registers; videos in tubelets of 2 frames.
VISION: dict[str, Any] = {
    "model_type": "radio",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "patch_size": 4,
    "max_img_size": 32,
    "num_cls_tokens": 2,
    "num_registers": 3,
    "video_temporal_patch_size": 2,
    "layer_norm_eps": 1e-6,
    "mlp_ratio": 4.0,
    "qkv_bias": True,
    "num_channels": 3,
    "summary_idxs": [0, 1],
    "hidden_act": "gelu",
    "layerscale_value": 1.0,
    "norm_mean": [0.48145466, 0.4578275, 0.40821073],
    "norm_std": [0.26862954, 0.26130258, 0.27577711],
}
PROJECTOR_HIDDEN = 48
DOWNSAMPLE_RATIO = 0.5
# preprocessor_config.json: the image processor's patch size is the tower's, and the patch
# budget small (an image becomes 16 to 64 patches, 4 to 16 tokens after the 2 x 2 merge).
IMAGE_PROCESSOR: dict[str, Any] = {
    "patch_size": VISION["patch_size"],
    "downsample_ratio": DOWNSAMPLE_RATIO,
    "min_num_patches": 16,
    "max_num_patches": 64,
    "max_model_len": 4096,
    "image_mean": VISION["norm_mean"],
    "image_std": VISION["norm_std"],
}


def omni_config(text: dict[str, Any], image_token_id: int, video_token_id: int) -> dict[str, Any]:
    """A nemotron_h_omni config.json around a text config (no audio tower)."""
    text = {k: v for k, v in text.items() if k not in ("architectures", "dtype")}
    return {
        "architectures": ["NemotronH_Omni_Reasoning_V3"],
        "model_type": "nemotron_h_omni",
        "dtype": "float32",
        "text_config": text,
        "vision_config": dict(VISION),
        "vision_hidden_size": VISION["hidden_size"],
        "projector_hidden_size": PROJECTOR_HIDDEN,
        "downsample_ratio": DOWNSAMPLE_RATIO,
        "video_pruning_rate": 0.0,
        "video_temporal_patch_size": VISION["video_temporal_patch_size"],
        "image_token_id": image_token_id,
        "video_token_id": video_token_id,
        "audio_config": None,
        "audio_token_id": None,
    }
