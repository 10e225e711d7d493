"""Random Nemotron-H tensors under the released checkpoint names, from numpy alone.

The names and shapes are those transformers' `save_pretrained` writes for NemotronH
(`backbone.layers.N.mixer.*`, one tensor per expert, `lm_head.weight`), the MTP head's
`mtp.layers.*` names vLLM and the released checkpoints use, and the Puzzle layout (`model.`
prefix). Values are scaled like a trained model's, so activations stay in range: weights
~ N(0, 1 / fan_in), norm weights near 1, A_log from log(U(0.5, 4.5)), dt_bias from U(-1, 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

Tensors = dict[str, np.ndarray]
# transformers 5 spells the mixers in layers_block_type as below; the demo writes this spelling.
MAMBA, ATTENTION, MLP, MOE = "mamba", "attention", "mlp", "moe"


class Random:
    """The demo's random source: one numpy generator, every value float32."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def weight(self, *shape: int) -> np.ndarray:
        return (self.rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    def norm(self, size: int) -> np.ndarray:
        return (1.0 + 0.2 * self.rng.standard_normal(size)).astype(np.float32)

    def bias(self, size: int, scale: float = 0.05) -> np.ndarray:
        return (scale * self.rng.standard_normal(size)).astype(np.float32)

    def uniform(self, low: float, high: float, size: int) -> np.ndarray:
        return self.rng.uniform(low, high, size).astype(np.float32)


def mamba_tensors(c: Mapping[str, Any], r: Random) -> Tensors:
    """One Mamba2 mixer: in_proj packs [z, x, B, C, dt]; conv1d runs over [x, B, C]."""
    h, heads = c["hidden_size"], c["mamba_num_heads"]
    inner = heads * c["mamba_head_dim"]
    conv = inner + 2 * c["n_groups"] * c["ssm_state_size"]
    return {
        "A_log": np.log(r.uniform(0.5, 4.5, heads)),
        "D": r.norm(heads),
        "dt_bias": r.uniform(-1.0, 1.0, heads),
        "conv1d.weight": r.weight(conv, 1, c["conv_kernel"]),
        "conv1d.bias": r.bias(conv, 0.2),
        "in_proj.weight": r.weight(inner + conv + heads, h),
        "norm.weight": r.norm(inner),
        "out_proj.weight": r.weight(h, inner),
    }


def attention_tensors(c: Mapping[str, Any], r: Random) -> Tensors:
    h, d = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    return {
        "q_proj.weight": r.weight(q, h),
        "k_proj.weight": r.weight(kv, h),
        "v_proj.weight": r.weight(kv, h),
        "o_proj.weight": r.weight(h, q),
    }


def mlp_tensors(c: Mapping[str, Any], r: Random) -> Tensors:
    h, inner = c["hidden_size"], c["intermediate_size"]
    return {"up_proj.weight": r.weight(inner, h), "down_proj.weight": r.weight(h, inner)}


def moe_tensors(c: Mapping[str, Any], r: Random) -> Tensors:
    """Router (with its score-correction bias), one tensor pair per expert, the shared expert
    when the config has one, the latent projections when moe_latent_size is set."""
    h, experts, inner = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
    latent = c.get("moe_latent_size")
    width = latent or h
    out = {
        "gate.weight": r.weight(experts, h),
        "gate.e_score_correction_bias": r.bias(experts),
    }
    for e in range(experts):
        out[f"experts.{e}.up_proj.weight"] = r.weight(inner, width)
        out[f"experts.{e}.down_proj.weight"] = r.weight(width, inner)
    shared = c.get("moe_shared_expert_intermediate_size") or 0
    if c.get("n_shared_experts", 1) and shared:
        out["shared_experts.up_proj.weight"] = r.weight(shared, h)
        out["shared_experts.down_proj.weight"] = r.weight(h, shared)
    if latent:
        out["fc1_latent_proj.weight"] = r.weight(latent, h)
        out["fc2_latent_proj.weight"] = r.weight(h, latent)
    return out


MIXERS = {MAMBA: mamba_tensors, ATTENTION: attention_tensors, MLP: mlp_tensors, MOE: moe_tensors}


def decoder_tensors(
    config: Mapping[str, Any],
    kinds: list[str],
    r: Random,
    *,
    root: str = "backbone.",
    head: str = "lm_head.weight",
    layer_configs: list[Mapping[str, Any]] | None = None,
) -> Tensors:
    """Embedding, one block per entry of `kinds` (`layer_configs[i]`: that layer's own sizes,
    a Puzzle block's; default the global config), final norm and lm_head."""
    h, vocab = config["hidden_size"], config["vocab_size"]
    out = {f"{root}embeddings.weight": r.weight(vocab, h)}
    for i, kind in enumerate(kinds):
        own = layer_configs[i] if layer_configs else config
        prefix = f"{root}layers.{i}."
        out[prefix + "norm.weight"] = r.norm(h)
        for name, value in MIXERS[kind](own, r).items():
            out[prefix + "mixer." + name] = value
    out[f"{root}norm_f.weight"] = r.norm(h)
    out[head] = r.weight(vocab, h)
    return out


def mtp_head_tensors(config: Mapping[str, Any], r: Random, prefix: str = "") -> Tensors:
    """A one-depth MTP head (an attention block, then a MoE block) under vLLM's released
    names: layer 0 holds the fusion (enorm, hnorm, eh_proj) and the attention, layer 1 the
    MoE and the final norm."""
    h = config["hidden_size"]
    out = {
        "mtp.layers.0.enorm.weight": r.norm(h),
        "mtp.layers.0.hnorm.weight": r.norm(h),
        "mtp.layers.0.eh_proj.weight": r.weight(h, 2 * h),
        "mtp.layers.0.norm.weight": r.norm(h),
        "mtp.layers.1.norm.weight": r.norm(h),
        "mtp.layers.1.final_layernorm.weight": r.norm(h),
    }
    for name, value in attention_tensors(config, r).items():
        out["mtp.layers.0.mixer." + name] = value
    for name, value in moe_tensors(config, r).items():
        out["mtp.layers.1.mixer." + name] = value
    return {prefix + name: value for name, value in out.items()}
