"""The independent reference of the multi-token-prediction head: plain torch written from the
computation (docs/decoder_contract.md), with transformers' NemotronH RMSNorm, attention and
MoE modules for the blocks, FP32.

At position t: e = enorm(embed(token t+1)), h = hnorm(H_t), x = eh_proj([e, h]),
x += attention(norm0(x)) over the head's own cache (no RoPE), x += moe(norm1(x)),
out = final_layernorm(x), logits = lm_head(out).

A head of distinct depths (MTPDepthReference, one per depth, any sequence of attention / MoE
blocks): depth j at position t takes depth j-1's output at t (H_t for depth 0) and token
t+j+1; teacher_forced_depths runs every depth over a whole sequence of true (and, at its
end, drafted) tokens, as Megatron / DeepSeek MTP train them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from transformers import NemotronHConfig as HFNemotronHConfig
from transformers.models.nemotron_h.modeling_nemotron_h import (
    NemotronHAttention,
    NemotronHMoE,
    NemotronHRMSNorm,
)


class _ConcatCache:
    """The cache interface NemotronHAttention calls (update appends along the sequence)."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, **_: Any):
        if self.keys is None:
            self.keys, self.values = key, value
        else:
            self.keys = torch.cat([self.keys, key], dim=2)
            self.values = torch.cat([self.values, value], dim=2)
        return self.keys, self.values


def _tensor(value: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(value, dtype=np.float32))


def _eager_norms(
    tensors: Mapping[str, Any], prefix: str, attention_config: Any, moe_config: Any
) -> Callable[[str], NemotronHRMSNorm]:
    """Set both configs to transformers' eager attention / experts and return a loader of the
    head's RMSNorm modules by tensor name (after `prefix`)."""
    attention_config._attn_implementation = "eager"
    moe_config._experts_implementation = "eager"
    hidden, eps = attention_config.hidden_size, attention_config.layer_norm_epsilon

    def norm(name: str) -> NemotronHRMSNorm:
        module = NemotronHRMSNorm(hidden, eps)
        module.weight.data = _tensor(tensors[prefix + name])
        return module

    return norm


def _load_moe(moe: NemotronHMoE, tensors: Mapping[str, Any], prefix: str) -> None:
    """Per-expert released tensors -> transformers' stacked experts; the rest by name."""
    state: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {"up_proj": {}, "down_proj": {}}
    pattern = re.compile(re.escape(prefix) + r"experts\.(\d+)\.(up_proj|down_proj)\.weight$")
    for name, value in tensors.items():
        if not name.startswith(prefix):
            continue
        match = pattern.match(name)
        if match:
            experts[match[2]][int(match[1])] = _tensor(value)
        else:
            state[name[len(prefix) :]] = _tensor(value)
    for proj, by_index in experts.items():
        state[f"experts.{proj}"] = torch.stack([by_index[e] for e in sorted(by_index)])
    missing, unexpected = moe.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    # Identity latent projections have no parameters; everything else must be loaded.
    assert not missing, missing


class MTPHeadReference:
    """The head over its own growing cache; `step` is one call of mtp.onnx."""

    def __init__(
        self,
        tensors: Mapping[str, Any],
        attention_config: HFNemotronHConfig,
        moe_config: HFNemotronHConfig,
        embeddings: Any,
        lm_head: Any,
        prefix: str = "mtp.layers.",
    ) -> None:
        """tensors: the head's checkpoint tensors (names as released, `prefix` in front of
        `{i}.`); the configs give the attention block's and the MoE block's sizes."""
        norm = _eager_norms(tensors, prefix, attention_config, moe_config)

        self.enorm, self.hnorm = norm("0.enorm.weight"), norm("0.hnorm.weight")
        self.eh_proj = _tensor(tensors[prefix + "0.eh_proj.weight"])
        self.attention_norm, self.moe_norm = norm("0.norm.weight"), norm("1.norm.weight")
        self.final_layernorm = norm("1.final_layernorm.weight")
        self.attention = NemotronHAttention(attention_config, layer_idx=0).eval()
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(self.attention, proj).weight.data = _tensor(
                tensors[f"{prefix}0.mixer.{proj}.weight"]
            )
        self.moe = NemotronHMoE(moe_config).eval()
        _load_moe(self.moe, tensors, f"{prefix}1.mixer.")
        self.embeddings = _tensor(embeddings)
        self.lm_head = _tensor(lm_head)
        self.cache = _ConcatCache()
        self.mask = None

    @torch.no_grad()
    def step(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """ids [B, S] (tokens t+1), hidden [B, S, H] (the decoder's final-normed H_t),
        mask [B, past + S] (1 = real) -> logits, mtp_hidden_states and the head's K/V."""
        ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        h = torch.from_numpy(np.asarray(hidden, dtype=np.float32))
        keys_real = torch.from_numpy(np.asarray(mask)).bool()
        batch, seq = ids_t.shape
        total = keys_real.shape[1]
        past = total - seq
        e = self.enorm(torch.nn.functional.embedding(ids_t, self.embeddings))
        x = torch.nn.functional.linear(torch.cat([e, self.hnorm(h)], dim=-1), self.eh_proj)
        # causal after the past, padding keys never attended
        query_pos = past + torch.arange(seq)[:, None]
        allowed = (torch.arange(total)[None, :] <= query_pos)[None] & keys_real[:, None, :]
        additive = torch.zeros(batch, 1, seq, total)
        additive.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
        attended, _ = self.attention(
            self.attention_norm(x), attention_mask=additive, cache=self.cache
        )
        x = x + attended
        x = x + self.moe(self.moe_norm(x))
        out = self.final_layernorm(x)
        logits = torch.nn.functional.linear(out, self.lm_head)
        return {
            "logits": logits.numpy(),
            "mtp_hidden_states": out.numpy(),
            "present.mtp.0.key": self.cache.keys.numpy(),
            "present.mtp.0.value": self.cache.values.numpy(),
        }


class MTPDepthReference:
    """One depth of a head of distinct depths (mtp_use_repeated_layer false) over its own
    growing caches: blocks of `kinds` ("attention" / "moe") at mtp.layers.{first + k}, the
    first fusing the token embedding with its input hidden state (enorm, hnorm, eh_proj),
    each pre-norm + residual, the last with final_layernorm; logits with the shared lm_head.
    Depth j at position i is fed depth j-1's output there (the decoder's final-normed hidden
    state for depth 0) and token t_{i+j+1}."""

    def __init__(
        self,
        tensors: Mapping[str, Any],
        kinds: list[str],
        first: int,
        attention_config: HFNemotronHConfig,
        moe_config: HFNemotronHConfig,
        embeddings: Any,
        lm_head: Any,
        prefix: str = "mtp.layers.",
    ) -> None:
        norm = _eager_norms(tensors, prefix, attention_config, moe_config)

        last = first + len(kinds) - 1
        self.enorm, self.hnorm = norm(f"{first}.enorm.weight"), norm(f"{first}.hnorm.weight")
        self.eh_proj = _tensor(tensors[f"{prefix}{first}.eh_proj.weight"])
        self.final_layernorm = norm(f"{last}.final_layernorm.weight")
        self.blocks: list[tuple[int, str, NemotronHRMSNorm, Any]] = []
        for offset, kind in enumerate(kinds):
            index = first + offset
            if kind == "attention":
                mixer: Any = NemotronHAttention(attention_config, layer_idx=0).eval()
                for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    getattr(mixer, proj).weight.data = _tensor(
                        tensors[f"{prefix}{index}.mixer.{proj}.weight"]
                    )
            else:
                mixer = NemotronHMoE(moe_config).eval()
                _load_moe(mixer, tensors, f"{prefix}{index}.mixer.")
            self.blocks.append((index, kind, norm(f"{index}.norm.weight"), mixer))
        self.embeddings = _tensor(embeddings)
        self.lm_head = _tensor(lm_head)
        self.reset()

    def reset(self) -> None:
        """Empty caches (one per attention block)."""
        self.caches = {index: _ConcatCache() for index, kind, _, _ in self.blocks}

    @torch.no_grad()
    def step(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        """ids [B, S] (tokens t+j+1 at positions t), hidden [B, S, H] (the depth's input hidden
        states), mask [B, past + S] (1 = real) -> logits, mtp_hidden_states and each attention
        block's K/V (present.mtp.{index}.key / .value, global block indices)."""
        ids_t = torch.from_numpy(np.asarray(ids, dtype=np.int64))
        h = torch.from_numpy(np.asarray(hidden, dtype=np.float32))
        keys_real = torch.from_numpy(np.asarray(mask)).bool()
        batch, seq = ids_t.shape
        total = keys_real.shape[1]
        query_pos = total - seq + torch.arange(seq)[:, None]
        allowed = (torch.arange(total)[None, :] <= query_pos)[None] & keys_real[:, None, :]
        additive = torch.zeros(batch, 1, seq, total)
        additive.masked_fill_(~allowed[:, None], torch.finfo(torch.float32).min)
        e = self.enorm(torch.nn.functional.embedding(ids_t, self.embeddings))
        x = torch.nn.functional.linear(torch.cat([e, self.hnorm(h)], dim=-1), self.eh_proj)
        out: dict[str, np.ndarray] = {}
        for index, kind, norm, mixer in self.blocks:
            if kind == "attention":
                cache = self.caches[index]
                attended, _ = mixer(norm(x), attention_mask=additive, cache=cache)
                x = x + attended
                out[f"present.mtp.{index}.key"] = cache.keys.numpy()
                out[f"present.mtp.{index}.value"] = cache.values.numpy()
            else:
                x = x + mixer(norm(x))
        final = self.final_layernorm(x)
        out["logits"] = torch.nn.functional.linear(final, self.lm_head).numpy()
        out["mtp_hidden_states"] = final.numpy()
        return out


def teacher_forced_depths(
    depths: list[MTPDepthReference], hidden: np.ndarray, line: np.ndarray, mask: np.ndarray
) -> list[dict[str, np.ndarray]]:
    """Every depth over positions 0..P-1 in one call each, from empty caches: depth j is fed
    the tokens line[:, j : j + P] (line[:, m] = t_{m+1}: true tokens, then drafts if any) and
    depth j-1's mtp_hidden_states (the decoder's `hidden` [B, P, H] for depth 0); `mask`
    [B, P]. Returns each depth's step outputs. Attention is causal, so position i of depth j
    sees only tokens up to line[:, i + j]."""
    positions = hidden.shape[1]
    outputs = []
    for j, depth in enumerate(depths):
        depth.reset()
        out = depth.step(line[:, j : j + positions], hidden, mask)
        outputs.append(out)
        hidden = out["mtp_hidden_states"]
    return outputs
