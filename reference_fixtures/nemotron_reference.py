"""The independent reference: transformers' NemotronHForCausalLM in torch FP32, plus the
layout maps from its caches to the package's cache ABI."""

from __future__ import annotations

from typing import Any

import torch
from transformers import NemotronHConfig as HFNemotronHConfig
from transformers import NemotronHForCausalLM

# the cache layout map lives in the package (qualify uses it); re-exported for the tests
from mobius_lite.evaluation.cache_layout import reference_cache_arrays  # noqa: F401
from mobius_lite.evaluation.reference import pinned_torch  # noqa: F401

TINY_BASE: dict[str, Any] = dict(
    vocab_size=97,
    hidden_size=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    intermediate_size=48,
    ssm_state_size=8,
    mamba_num_heads=4,
    mamba_head_dim=8,
    n_groups=2,
    conv_kernel=4,
    chunk_size=4,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=24,
    n_group=1,
    topk_group=1,
    layer_norm_epsilon=1e-5,
)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Give every parameter non-trivial values (norm weights, D, biases, router bias too)."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("A_log"):
            p.data = torch.log(torch.rand(p.shape, generator=gen) * 4 + 0.5)
        elif name.endswith("dt_bias"):
            p.data = torch.rand(p.shape, generator=gen) * 2 - 1
        elif p.ndim == 1:
            p.data = 1.0 + 0.2 * torch.randn(p.shape, generator=gen)
        else:
            p.data = torch.randn(p.shape, generator=gen) * (1.0 / max(p.shape[-1], 1) ** 0.5)
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            b.data = 0.05 * torch.randn(b.shape, generator=gen)


def make_reference(overrides: dict[str, Any], seed: int = 0) -> NemotronHForCausalLM:
    config = HFNemotronHConfig(**{**TINY_BASE, **overrides})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).eval()
    randomize(model, seed)
    return model
