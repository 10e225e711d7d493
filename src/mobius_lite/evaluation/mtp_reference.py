"""The independent reference of the multi-token-prediction head: vLLM's NemotronHMTP
computation written in torch (FP32) from the checkpoint's own tensors.

At position t: e = RMSNorm_enorm(embed(token t+1)), h = RMSNorm_hnorm(hidden t),
x = eh_proj([e, h]); x += Attention(RMSNorm(x)) (causal over the head's cache, no positional
embedding); x += MoE(RMSNorm(x)) (transformers' NemotronHMoE, the backbone's semantics);
mtp_hidden = RMSNorm_final(x), logits = lm_head(mtp_hidden). Tensors are read by name with
safetensors (the mtp.* ones, also found as model.mtp.*, and the shared embedding table and
lm_head), never from the package. The head is one depth, which chained drafts repeat
(Nemotron 3.5 Lightning's depth 2, Super / Ultra's latent MoE: transformers' NemotronHMoE with
fc1 / fc2 latent projections), or one depth j of a head of distinct depths (its blocks
mtp.layers.{2j, 2j+1}: mtp.onnx's for depth 0, mtp_depth{j}.onnx's otherwise). Requires the
`reference` extra (torch, transformers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import ConfigError

OMNI_PREFIX = "language_model."
# The config fields transformers' NemotronHMoE reads (sizes come from the tensors)
MOE_FIELDS = (
    "hidden_size",
    "mlp_hidden_act",
    "mlp_bias",
    "num_experts_per_tok",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
)
BLOCKS_PER_DEPTH = 2  # an attention block, then a MoE block ("*E")
EMBEDDINGS = ("backbone.embeddings.weight", "model.embeddings.weight", "model.embed_tokens.weight")


def _tensor_files(checkpoint: Path) -> dict[str, Path]:
    """Every tensor name of the checkpoint folder's safetensors files, and its file."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for path in sorted(checkpoint.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                where.setdefault(name, path)
    return where


def _read(where: dict[str, Path], names: list[str]) -> dict[str, Any]:
    from safetensors import safe_open

    out = {}
    for name in names:
        with safe_open(str(where[name]), "pt") as f:
            out[name] = f.get_tensor(name).float()
    return out


def torch_cat(parts: list[Any]) -> Any:
    import torch

    return torch.cat(parts, -1)


def _rms(x: Any, weight: Any, eps: float) -> Any:
    return weight * (x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt())


class MtpReference:
    """The head of checkpoint folder `checkpoint` (Omni: its language_model.), stepped with its
    own KV cache: `step(input_ids, hidden_states, attention_mask)` as mtp.onnx is called. For a
    head of distinct depths, `depth` j picks that depth's blocks (as mtp_depth{j}.onnx binds
    them); its cache is named by their global index, present.mtp.{2j}."""

    def __init__(self, checkpoint: str | Path, depth: int = 0) -> None:
        import torch
        from transformers import NemotronHConfig as HFConfig
        from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

        checkpoint = Path(checkpoint)
        raw = json.loads((checkpoint / "config.json").read_text())
        text = raw.get("text_config") or raw.get("llm_config") or raw
        where = _tensor_files(checkpoint)
        prefix = OMNI_PREFIX if any(n.startswith(OMNI_PREFIX + "mtp.") for n in where) else ""
        # the head's own names: mtp.*, or model.mtp.* (transformers-layout checkpoints)
        head_prefix = next(
            (
                p
                for p in (prefix, prefix + "model.")
                if any(n.startswith(p + "mtp.") for n in where)
            ),
            prefix,
        )
        mtp = sorted(n for n in where if n.startswith(head_prefix + "mtp."))
        if not mtp:
            raise ConfigError(f"{checkpoint} has no mtp.* tensors: the model has no MTP head")
        mtp = _depth_blocks(mtp, head_prefix, _distinct_depths(text), depth)
        self.cache_index = BLOCKS_PER_DEPTH * depth
        embed = next((prefix + n for n in EMBEDDINGS if prefix + n in where), None)
        head = prefix + "lm_head.weight" if prefix + "lm_head.weight" in where else embed
        if embed is None or head is None:
            raise ConfigError(f"{checkpoint} has no embedding table for the head")
        t = _read(where, [*mtp, embed, head])
        t = {
            _as_depth_zero(
                name.removeprefix(head_prefix if name.startswith(head_prefix + "mtp.") else prefix),
                depth,
            ): v
            for name, v in t.items()
        }
        self.embed, self.lm_head = t.pop(embed.removeprefix(prefix)), t[head.removeprefix(prefix)]
        self.t = t
        self.eps = float(text.get("layer_norm_epsilon", text.get("rms_norm_eps", 1e-5)))
        q = t["mtp.layers.0.mixer.q_proj.weight"]
        k = t["mtp.layers.0.mixer.k_proj.weight"]
        attention = head_block(text, "attention")
        self.head_dim = int(
            attention.get("head_dim")
            or text.get("head_dim")
            or text["hidden_size"] // text["num_attention_heads"]
        )
        self.heads = q.shape[0] // self.head_dim
        self.kv_heads = k.shape[0] // self.head_dim
        self.moe = self._moe(HFConfig, NemotronHMoE, text, torch)
        self.reset(1)

    def _moe(self, hf_config: Any, moe_class: Any, text: dict, torch: Any) -> Any:
        """transformers' NemotronHMoE sized from the head's own tensors (Puzzle's head has its
        own expert count and sizes), holding them."""
        p = "mtp.layers.1.mixer."
        experts = sorted(
            {int(n[len(p) :].split(".")[1]) for n in self.t if n.startswith(p + "experts.")}
        )
        up = self.t[f"{p}experts.0.up_proj.weight"]
        latent = self.t.get(f"{p}fc1_latent_proj.weight")
        fields = {k: text[k] for k in MOE_FIELDS if k in text}
        block = head_block(text, "moe")
        shared = self.t.get(f"{p}shared_experts.up_proj.weight")
        fields.update(
            n_routed_experts=len(experts),
            moe_intermediate_size=up.shape[0],
            moe_latent_size=None if latent is None else latent.shape[0],
            moe_shared_expert_intermediate_size=1 if shared is None else shared.shape[0],
        )
        for name in MOE_FIELDS:
            if block.get(name) is not None:
                fields[name] = block[name]
        config = hf_config(**fields)
        config._experts_implementation = "eager"
        module = moe_class(config).eval()
        if shared is None:  # a head without a shared expert (Puzzle n_shared_experts 0)
            from mobius_lite.evaluation.puzzle_reference import _no_shared_expert

            module.shared_experts = _no_shared_expert()
        state = {
            n[len(p) :]: v for n, v in self.t.items() if n.startswith(p) and ".experts." not in n
        }
        state["experts.up_proj"] = torch.stack(
            [self.t[f"{p}experts.{e}.up_proj.weight"] for e in experts]
        )
        state["experts.down_proj"] = torch.stack(
            [self.t[f"{p}experts.{e}.down_proj.weight"] for e in experts]
        )
        module.load_state_dict(state, strict=True)
        return module

    def reset(self, batch: int) -> None:
        import torch

        shape = (batch, self.kv_heads, 0, self.head_dim)
        self.key, self.value = torch.zeros(shape), torch.zeros(shape)

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> dict[str, np.ndarray]:
        """One call; attention_mask covers the head's past + current positions (as mtp.onnx).
        Returns logits, mtp_hidden_states and present.mtp.0.key/value as numpy FP32."""
        import torch

        with torch.no_grad():
            logits, final = self.forward(
                torch.from_numpy(np.asarray(input_ids, np.int64)),
                torch.from_numpy(np.asarray(hidden_states, np.float32)),
                torch.from_numpy(np.asarray(attention_mask, np.int64)),
            )
        return {
            "logits": logits.numpy(),
            "mtp_hidden_states": final.numpy(),
            f"present.mtp.{self.cache_index}.key": self.key.numpy(),
            f"present.mtp.{self.cache_index}.value": self.value.numpy(),
        }

    def forward(self, ids: Any, hidden: Any, attention_mask: Any) -> tuple[Any, Any]:
        """The computation on torch tensors (differentiable:
        benchmarks/investigations/train_mtp_head.py trains the tensors in `self.t` and the MoE
        module through it); returns (logits, mtp_hidden_states) and appends the new positions
        to the cache."""
        t, eps = self.t, self.eps
        e = _rms(self.embed[ids], t["mtp.layers.0.enorm.weight"], eps)
        h = _rms(hidden, t["mtp.layers.0.hnorm.weight"], eps)
        x = torch_cat([e, h]) @ t["mtp.layers.0.eh_proj.weight"].T
        x = x + self._attention(_rms(x, t["mtp.layers.0.norm.weight"], eps), attention_mask.bool())
        x = x + self.moe(_rms(x, t["mtp.layers.1.norm.weight"], eps))
        final = _rms(x, t["mtp.layers.1.final_layernorm.weight"], eps)
        return final @ self.lm_head.T, final

    def _attention(self, x: Any, mask: Any) -> Any:
        import torch

        t, p = self.t, "mtp.layers.0.mixer."
        batch, seq, _ = x.shape

        def project(name: str, heads: int) -> Any:
            y = x @ t[f"{p}{name}.weight"].T
            if f"{p}{name}.bias" in t:
                y = y + t[f"{p}{name}.bias"]
            return y.view(batch, seq, heads, self.head_dim).transpose(1, 2)

        q = project("q_proj", self.heads)
        self.key = torch.cat([self.key, project("k_proj", self.kv_heads)], 2)
        self.value = torch.cat([self.value, project("v_proj", self.kv_heads)], 2)
        repeat = self.heads // self.kv_heads
        k = self.key.repeat_interleave(repeat, 1)
        v = self.value.repeat_interleave(repeat, 1)
        total = k.shape[2]
        scores = (q @ k.transpose(-1, -2)) / self.head_dim**0.5
        causal = torch.ones(seq, total, dtype=torch.bool).tril(total - seq)
        allowed = causal[None, None] & mask[:, None, None, :]
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, -1)
        y = out @ t[f"{p}o_proj.weight"].T
        return y + t[f"{p}o_proj.bias"] if f"{p}o_proj.bias" in t else y


def _distinct_depths(text: dict) -> int:
    """How many distinct depths the head's weights hold: num_nextn_predict_layers when
    mtp_use_repeated_layer is false, else one (repeated by every chained draft)."""
    if text.get("mtp_use_repeated_layer") is False:
        return int(text.get("num_nextn_predict_layers") or 1)
    return 1


def _depth_blocks(names: list[str], prefix: str, depths: int, depth: int) -> list[str]:
    """The names of depth `depth`'s blocks (mtp.layers.{2 depth, 2 depth + 1}), which the
    reference computes: the depth every chained draft repeats (depth 0), or one depth of a head
    of distinct depths. A head whose weights hold other blocks than `depths` depths of "*E",
    or a depth it does not have, is refused."""
    blocks = sorted({int(n[len(prefix) :].split(".")[2]) for n in names if ".layers." in n})
    if blocks != list(range(BLOCKS_PER_DEPTH * depths)):
        raise ConfigError(
            f"the head's weights hold blocks mtp.layers.{blocks}: the reference computes "
            f"{depths} depth(s) of an attention block and a MoE block (mtp.layers.0-"
            f"{BLOCKS_PER_DEPTH * depths - 1})"
        )
    if not 0 <= depth < depths:
        raise ConfigError(f"the head has {depths} depth(s): there is no depth {depth}")
    first = BLOCKS_PER_DEPTH * depth
    return [
        n
        for n in names
        if ".layers." not in n
        or first <= int(n[len(prefix) :].split(".")[2]) < first + BLOCKS_PER_DEPTH
    ]


def _as_depth_zero(name: str, depth: int) -> str:
    """mtp.layers.{2 depth + k}.* -> mtp.layers.{k}.*: every depth computes as depth 0."""
    parts = name.split(".", 3)
    if depth == 0 or parts[:2] != ["mtp", "layers"]:
        return name
    return ".".join([*parts[:2], str(int(parts[2]) - BLOCKS_PER_DEPTH * depth), parts[3]])


def head_block(text: dict, kind: str) -> dict:
    """Puzzle's mtp_block_configs entry of `kind` ("attention", "moe"): the head's own sizes
    and routing, which differ from the backbone's; {} for other configs."""
    for block in text.get("mtp_block_configs") or []:
        if str(block.get("block_type", "")).lower() == kind:
            return dict(block)
    return {}
