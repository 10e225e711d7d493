"""Tiny heterogeneous Puzzle checkpoints written in the released layout (model. prefix, one
tensor per expert, block_configs), with weights from the transformers reference."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import save_file

from mobius_lite.evaluation.puzzle_reference import build_puzzle_reference
from nemotron_reference import TINY_BASE, randomize

# Global fields as a released Puzzle config.json has them: the per-block members
# (moe_intermediate_size, num_experts_per_tok) are absent at the top level.
TINY_PUZZLE_GLOBALS: dict[str, Any] = {
    **{
        k: v
        for k, v in TINY_BASE.items()
        if k not in ("moe_intermediate_size", "num_experts_per_tok")
    },
    "model_type": "nemotron_h_puzzle",
    "architectures": ["NemotronHPuzzleForCausalLM"],
    "n_shared_experts": 1,
    "moe_latent_size": None,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
    "mamba_ssm_cache_dtype": "float32",
    "time_step_limit": [0.0, {"__float__": "Infinity"}],
    "num_nextn_predict_layers": 0,
}

# Expert count, top-k, widths, latent on/off, shared on/off, grouping and head counts differ
# between layers; the last layer is a stateless MoE after the last stateful one.
HETEROGENEOUS_BLOCKS: list[dict[str, Any]] = [
    {"block_type": "mamba"},
    {
        "block_type": "moe",
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    {"block_type": "attention"},
    {
        "block_type": "moe",
        "n_routed_experts": 16,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 12,
        "moe_latent_size": 24,
        "n_shared_experts": 0,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": False,
        "routed_scaling_factor": 2.5,
    },
    {"block_type": "mamba", "mamba_num_heads": 2, "mamba_head_dim": 12, "n_groups": 1},
    {"block_type": "mlp", "intermediate_size": 40},
    {"block_type": "attention", "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
    {
        "block_type": "moe",
        "n_routed_experts": 6,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 20,
        "moe_latent_size": 16,
        "moe_shared_expert_intermediate_size": 8,
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": None,  # null: no override, as released configs write it
    },
    {
        "block_type": "moe",
        "n_routed_experts": 12,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 10,
    },
]


def puzzle_raw_config(blocks: list[dict[str, Any]], **globals_: Any) -> dict[str, Any]:
    return {**TINY_PUZZLE_GLOBALS, **globals_, "block_configs": blocks}


def mtp_tensors(raw: dict[str, Any], rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A one-depth MTP head (attention + latent MoE) under the released `mtp.layers.*` names."""
    h = raw["hidden_size"]
    heads, kv, hd = raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]
    experts, inner, latent = 4, 8, 16

    def t(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    out = {
        "mtp.layers.0.eh_proj.weight": t(h, 2 * h),
        "mtp.layers.0.enorm.weight": t(h),
        "mtp.layers.0.hnorm.weight": t(h),
        "mtp.layers.0.norm.weight": t(h),
        "mtp.layers.0.mixer.q_proj.weight": t(heads * hd, h),
        "mtp.layers.0.mixer.k_proj.weight": t(kv * hd, h),
        "mtp.layers.0.mixer.v_proj.weight": t(kv * hd, h),
        "mtp.layers.0.mixer.o_proj.weight": t(h, heads * hd),
        "mtp.layers.1.norm.weight": t(h),
        "mtp.layers.1.mixer.gate.weight": t(experts, h),
        "mtp.layers.1.mixer.gate.e_score_correction_bias": t(experts),
        "mtp.layers.1.mixer.fc1_latent_proj.weight": t(latent, h),
        "mtp.layers.1.mixer.fc2_latent_proj.weight": t(h, latent),
        "mtp.layers.1.mixer.shared_experts.up_proj.weight": t(inner, h),
        "mtp.layers.1.mixer.shared_experts.down_proj.weight": t(h, inner),
        "mtp.layers.1.final_layernorm.weight": t(h),
    }
    for e in range(experts):
        out[f"mtp.layers.1.mixer.experts.{e}.up_proj.weight"] = t(inner, latent)
        out[f"mtp.layers.1.mixer.experts.{e}.down_proj.weight"] = t(latent, inner)
    return out


def puzzle_layout(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The reference state dict renamed to the released layout: `model.` prefix (as transformers
    holds it in memory) and each stacked expert tensor [E, out, in] split into E tensors."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in state.items():
        array = tensor.detach().float().numpy()
        if name.endswith((".experts.up_proj", ".experts.down_proj")):
            prefix, proj = name.rsplit(".", 1)
            for e in range(array.shape[0]):
                out[f"{prefix}.{e}.{proj}.weight"] = np.ascontiguousarray(array[e])
        else:
            out[name] = np.ascontiguousarray(array)
    assert all(n.startswith(("model.", "lm_head.")) for n in out), sorted(out)[:5]
    return out


def write_puzzle_checkpoint(
    raw: dict[str, Any], directory: Path, *, seed: int = 0, with_mtp: bool = False
) -> tuple[Path, Any]:
    """Write config.json, an index and its shards (MTP in mtp.safetensors, as released).

    Returns (dir, reference).

    The returned reference is the randomized in-memory model the tensors were taken from.
    """
    torch.manual_seed(seed)
    model = build_puzzle_reference(raw)
    randomize(model, seed)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    shards = {"model-00001-of-00001.safetensors": puzzle_layout(model.state_dict())}
    if with_mtp:
        shards["mtp.safetensors"] = mtp_tensors(raw, np.random.default_rng(seed + 1))
    weight_map = {}
    for filename, tensors in shards.items():
        save_file(tensors, str(directory / filename))
        weight_map.update(dict.fromkeys(tensors, filename))
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return directory, model
