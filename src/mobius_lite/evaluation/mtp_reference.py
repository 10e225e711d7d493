"""The independent reference of the multi-token-prediction head: vLLM's NemotronHMTP
computation written in torch (FP32) from the checkpoint's own tensors.

One depth is a sequence of B blocks, its pattern of attention ("*") and MoE ("E") blocks as
the config spells it (mtp_block_configs' block types, mtp_layers_block_type or
mtp_hybrid_override_pattern; "*E" without any). At position t the first block fuses:
e = RMSNorm_enorm(embed(token t+1)), h = RMSNorm_hnorm(hidden t), x = eh_proj([e, h]); each
block adds its mixer on its own pre-norm: x += Attention(RMSNorm(x)) (causal over that block's
own cache, no positional embedding) or x += MoE(RMSNorm(x)) (transformers' NemotronHMoE, the
backbone's semantics); the last block ends with mtp_hidden = RMSNorm_final(x), and logits =
lm_head(mtp_hidden). Tensors are read by name with safetensors (the mtp.* ones, also found as
model.mtp.*, and the shared embedding table and lm_head), never from the package. The head is
one depth, which chained drafts repeat (Nemotron 3.5 Lightning's depth 2, Super / Ultra's
latent MoE: transformers' NemotronHMoE with fc1 / fc2 latent projections), or one depth j of a
head of distinct depths (its blocks mtp.layers.{jB .. jB+B-1}: mtp.onnx's for depth 0,
mtp_depth{j}.onnx's otherwise). Requires the `reference` extra (torch, transformers).
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
ATTENTION, MOE = "*", "E"
# the spellings of a head block's kind (case-insensitive): the config allows these two only
BLOCK_SPELLINGS = {
    "*": ATTENTION,
    "attention": ATTENTION,
    "full_attention": ATTENTION,
    "e": MOE,
    "moe": MOE,
}
DEFAULT_PATTERN = "*E"  # transformers' default mtp_layers_block_type ['full_attention', 'moe']
EMBEDDINGS = ("backbone.embeddings.weight", "model.embeddings.weight", "model.embed_tokens.weight")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


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
    """The head of checkpoint folder `checkpoint` (Omni: its language_model.), stepped with
    one KV cache per attention block: `step(input_ids, hidden_states, attention_mask)` as
    mtp.onnx is called. For a head of distinct depths, `depth` j picks that depth's blocks (as
    mtp_depth{j}.onnx binds them); each cache is named by its block's global index,
    present.mtp.{jB + k} for block k of the depth. The tensors in `t` are named as depth 0's
    (mtp.layers.{k}.*) whatever the depth."""

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
        self.pattern = head_pattern(text)
        mtp = _depth_blocks(mtp, head_prefix, self.pattern, _distinct_depths(text), depth)
        self.first_index = len(self.pattern) * depth
        embed = next((prefix + n for n in EMBEDDINGS if prefix + n in where), None)
        head = prefix + "lm_head.weight" if prefix + "lm_head.weight" in where else embed
        if embed is None or head is None:
            raise ConfigError(f"{checkpoint} has no embedding table for the head")
        t = _read(where, [*mtp, embed, head])
        t = {
            _as_depth_zero(
                name.removeprefix(head_prefix if name.startswith(head_prefix + "mtp.") else prefix),
                self.first_index,
            ): v
            for name, v in t.items()
        }
        self.embed, self.lm_head = t.pop(embed.removeprefix(prefix)), t[head.removeprefix(prefix)]
        self.t = t
        _check_blocks(t, self.pattern, self.first_index)
        self.eps = float(text.get("layer_norm_epsilon", text.get("rms_norm_eps", 1e-5)))
        # block k -> (query heads, key / value heads, head_dim), for each attention block
        self.attention_shapes = {
            k: self._attention_shape(k, text)
            for k, kind in enumerate(self.pattern)
            if kind == ATTENTION
        }
        self.moes = {
            k: self._moe(k, HFConfig, NemotronHMoE, text, torch)
            for k, kind in enumerate(self.pattern)
            if kind == MOE
        }
        self.reset(1)

    @property
    def cache_indices(self) -> list[int]:
        """The global block index of each attention block's cache (present.mtp.{i})."""
        return [self.first_index + k for k in self.attention_shapes]

    @property
    def moe(self) -> Any:
        """The MoE module of a head with one MoE block ("*E"; the training study reads it)."""
        if len(self.moes) != 1:
            raise ValueError(f"the head's pattern {self.pattern!r} has {len(self.moes)} MoE blocks")
        return next(iter(self.moes.values()))

    def _attention_shape(self, k: int, text: dict) -> tuple[int, int, int]:
        """Block k's (heads, key / value heads, head_dim): head_dim from the config (Puzzle:
        the block's own entry), the head counts from its projections' rows."""
        block = head_block(text, k)
        head_dim = int(
            block.get("head_dim")
            or text.get("head_dim")
            or text["hidden_size"] // text["num_attention_heads"]
        )
        p = f"mtp.layers.{k}.mixer."
        q_rows, kv_rows = self.t[p + "q_proj.weight"].shape[0], self.t[p + "k_proj.weight"].shape[0]
        if q_rows % head_dim or kv_rows % head_dim or (q_rows // head_dim) % (kv_rows // head_dim):
            raise ConfigError(
                f"mtp.layers.{self.first_index + k}.mixer: q_proj has {q_rows} rows and k_proj "
                f"{kv_rows}, which are not whole heads of head_dim {head_dim} in groups"
            )
        return q_rows // head_dim, kv_rows // head_dim, head_dim

    def _moe(self, k: int, hf_config: Any, moe_class: Any, text: dict, torch: Any) -> Any:
        """transformers' NemotronHMoE of block k, sized from the head's own tensors (Puzzle's
        head has its own expert count and sizes), holding them."""
        p = f"mtp.layers.{k}.mixer."
        experts = sorted(
            {int(n[len(p) :].split(".")[1]) for n in self.t if n.startswith(p + "experts.")}
        )
        up = self.t[f"{p}experts.0.up_proj.weight"]
        latent = self.t.get(f"{p}fc1_latent_proj.weight")
        fields = {name: text[name] for name in MOE_FIELDS if name in text}
        block = head_block(text, k)
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
        for proj in ("up_proj", "down_proj"):
            state[f"experts.{proj}"] = torch.stack(
                [self.t[f"{p}experts.{e}.{proj}.weight"] for e in experts]
            )
        module.load_state_dict(state, strict=True)
        return module

    def reset(self, batch: int) -> None:
        """Empty caches, one per attention block, for `batch` rows."""
        import torch

        self.keys: dict[int, Any] = {}
        self.values: dict[int, Any] = {}
        for k, (_, kv_heads, head_dim) in self.attention_shapes.items():
            shape = (batch, kv_heads, 0, head_dim)
            self.keys[k], self.values[k] = torch.zeros(shape), torch.zeros(shape)

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> dict[str, np.ndarray]:
        """One call; attention_mask covers the head's past + current positions (as mtp.onnx).
        Returns logits, mtp_hidden_states and present.mtp.{i}.key/value of each attention
        block (global index i) as numpy FP32."""
        import torch

        with torch.no_grad():
            logits, final = self.forward(
                torch.from_numpy(np.asarray(input_ids, np.int64)),
                torch.from_numpy(np.asarray(hidden_states, np.float32)),
                torch.from_numpy(np.asarray(attention_mask, np.int64)),
            )
        out = {"logits": logits.numpy(), "mtp_hidden_states": final.numpy()}
        for k in self.attention_shapes:
            out[f"present.mtp.{self.first_index + k}.key"] = self.keys[k].numpy()
            out[f"present.mtp.{self.first_index + k}.value"] = self.values[k].numpy()
        return out

    def forward(self, ids: Any, hidden: Any, attention_mask: Any) -> tuple[Any, Any]:
        """The computation on torch tensors (differentiable:
        benchmarks/investigations/train_mtp_head.py trains the tensors in `self.t` and the MoE
        module through it); returns (logits, mtp_hidden_states) and appends the new positions
        to each attention block's cache."""
        t, eps = self.t, self.eps
        e = _rms(self.embed[ids], t["mtp.layers.0.enorm.weight"], eps)
        h = _rms(hidden, t["mtp.layers.0.hnorm.weight"], eps)
        x = torch_cat([e, h]) @ t["mtp.layers.0.eh_proj.weight"].T
        mask = attention_mask.bool()
        for k, kind in enumerate(self.pattern):
            normed = _rms(x, t[f"mtp.layers.{k}.norm.weight"], eps)
            mixed = self._attention(k, normed, mask) if kind == ATTENTION else self.moes[k](normed)
            x = x + mixed
        last = len(self.pattern) - 1
        final = _rms(x, t[f"mtp.layers.{last}.final_layernorm.weight"], eps)
        return final @ self.lm_head.T, final

    def _attention(self, k: int, x: Any, mask: Any) -> Any:
        """Attention block k over its own cache (which it extends), causal after the past,
        keys the mask marks 0 never attended; no positional embedding."""
        import torch

        t, p = self.t, f"mtp.layers.{k}.mixer."
        heads, kv_heads, head_dim = self.attention_shapes[k]
        batch, seq, _ = x.shape

        def project(name: str, count: int) -> Any:
            y = x @ t[f"{p}{name}.weight"].T
            if f"{p}{name}.bias" in t:
                y = y + t[f"{p}{name}.bias"]
            return y.view(batch, seq, count, head_dim).transpose(1, 2)

        q = project("q_proj", heads)
        self.keys[k] = torch.cat([self.keys[k], project("k_proj", kv_heads)], 2)
        self.values[k] = torch.cat([self.values[k], project("v_proj", kv_heads)], 2)
        repeat = heads // kv_heads
        keys = self.keys[k].repeat_interleave(repeat, 1)
        values = self.values[k].repeat_interleave(repeat, 1)
        total = keys.shape[2]
        scores = (q @ keys.transpose(-1, -2)) / head_dim**0.5
        causal = torch.ones(seq, total, dtype=torch.bool).tril(total - seq)
        allowed = causal[None, None] & mask[:, None, None, :]
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        out = (scores.softmax(-1) @ values).transpose(1, 2).reshape(batch, seq, -1)
        y = out @ t[f"{p}o_proj.weight"].T
        return y + t[f"{p}o_proj.bias"] if f"{p}o_proj.bias" in t else y


def head_pattern(text: dict) -> str:
    """One depth's blocks as a pattern of "*" (attention) and "E" (MoE), read from the config
    as spelled: Puzzle's mtp_block_configs (one entry per block of a depth), else
    mtp_layers_block_type and / or mtp_hybrid_override_pattern (which must agree), else "*E".
    Any other block kind is refused: the config allows a head of these two only."""
    blocks = text.get("mtp_block_configs")
    if blocks:
        if not isinstance(blocks, list) or not all(isinstance(b, dict) for b in blocks):
            raise ConfigError(f"mtp_block_configs: expected a list of objects, found {blocks!r}")
        return "".join(
            _kind(block.get("block_type"), f"mtp_block_configs[{i}].block_type")
            for i, block in enumerate(blocks)
        )
    listed = text.get("mtp_layers_block_type")
    spelled = text.get("mtp_hybrid_override_pattern")
    from_list = from_pattern = None
    if listed is not None:
        if isinstance(listed, str) or not isinstance(listed, list) or not listed:
            raise ConfigError(f"mtp_layers_block_type: expected a list of kinds, found {listed!r}")
        from_list = "".join(
            _kind(kind, f"mtp_layers_block_type[{i}]") for i, kind in enumerate(listed)
        )
    if spelled is not None:
        if not isinstance(spelled, str) or not spelled:
            raise ConfigError(f"mtp_hybrid_override_pattern: expected a pattern, found {spelled!r}")
        from_pattern = "".join(
            _kind(char, f"mtp_hybrid_override_pattern[{i}]") for i, char in enumerate(spelled)
        )
    if from_list is not None and from_pattern is not None and from_list != from_pattern:
        raise ConfigError(
            f"mtp_layers_block_type ({from_list!r}) and mtp_hybrid_override_pattern "
            f"({from_pattern!r}) disagree: the reference cannot tell the head's blocks"
        )
    return from_list or from_pattern or DEFAULT_PATTERN


def _kind(spelling: Any, where: str) -> str:
    kind = BLOCK_SPELLINGS.get(spelling.lower()) if isinstance(spelling, str) else None
    if kind is None:
        raise ConfigError(
            f"{where} is {spelling!r}: the head reference computes attention ('*', "
            "'attention', 'full_attention') and MoE ('E', 'moe') blocks only, the blocks a "
            "multi-token-prediction head may have"
        )
    return kind


def _distinct_depths(text: dict) -> int:
    """How many distinct depths the head's weights hold: num_nextn_predict_layers when
    mtp_use_repeated_layer is false, else one (repeated by every chained draft)."""
    if text.get("mtp_use_repeated_layer") is False:
        return int(text.get("num_nextn_predict_layers") or 1)
    return 1


def _block_of(name: str, prefix: str) -> int:
    """The block index of a head tensor name `{prefix}mtp.layers.{i}.*`."""
    return int(name[len(prefix) :].split(".")[2])


def _depth_blocks(
    names: list[str], prefix: str, pattern: str, depths: int, depth: int
) -> list[str]:
    """The names of depth `depth`'s blocks (mtp.layers.{depth B .. depth B + B - 1}, B =
    len(pattern)), which the reference computes: the depth every chained draft repeats
    (depth 0), or one depth of a head of distinct depths. Weights that hold other blocks than
    `depths` depths of `pattern`, or a depth the head does not have, are refused."""
    width = len(pattern)
    blocks = sorted({_block_of(n, prefix) for n in names if ".layers." in n})
    if blocks != list(range(width * depths)):
        raise ConfigError(
            f"the head's weights hold blocks mtp.layers.{blocks}: the config describes "
            f"{depths} depth(s) of {pattern!r} (mtp.layers.0-{width * depths - 1})"
        )
    if not 0 <= depth < depths:
        raise ConfigError(f"the head has {depths} depth(s): there is no depth {depth}")
    first = width * depth
    return [
        n for n in names if ".layers." not in n or first <= _block_of(n, prefix) < first + width
    ]


def _as_depth_zero(name: str, first: int) -> str:
    """mtp.layers.{first + k}.* -> mtp.layers.{k}.*: every depth computes as depth 0."""
    parts = name.split(".", 3)
    if first == 0 or parts[:2] != ["mtp", "layers"]:
        return name
    return ".".join([*parts[:2], str(int(parts[2]) - first), parts[3]])


def _check_blocks(t: dict[str, Any], pattern: str, first: int) -> None:
    """The depth's blocks are the config's `pattern` and hold every tensor its computation
    reads (names in `t` as depth 0's): otherwise one ConfigError saying, under the
    checkpoint's names, which kinds the tensors show or which names are missing."""
    last = len(pattern) - 1
    span = f"mtp.layers.{first}-{first + last}"
    found = "".join(_found_kind(t, k) for k in range(len(pattern)))
    if found != pattern:
        raise ConfigError(
            f"the head's blocks {span} are {found!r} by their tensors (q_proj: attention '*', "
            f"gate: MoE 'E', '?': neither or both), but the config describes {pattern!r}"
        )
    missing = []
    for k, kind in enumerate(pattern):
        p = f"mtp.layers.{k}."
        needed = [p + "norm.weight"]
        if k == 0:
            needed += [p + "enorm.weight", p + "hnorm.weight", p + "eh_proj.weight"]
        if k == last:
            needed.append(p + "final_layernorm.weight")
        if kind == ATTENTION:
            needed += [f"{p}mixer.{proj}.weight" for proj in PROJECTIONS]
        else:
            needed += [f"{p}mixer.experts.0.{proj}.weight" for proj in ("up_proj", "down_proj")]
        missing += [n for n in needed if n not in t]
    if missing:
        from mobius_lite.listing import format_names

        raise ConfigError(
            f"the head's depth of {pattern!r} ({span}) lacks "
            f"{format_names([_as_global(n, first) for n in missing])}: an incomplete head"
        )


def _found_kind(t: dict[str, Any], k: int) -> str:
    """Block k's kind by its tensors: "*" (q_proj), "E" (a router gate), "?" otherwise."""
    attention = f"mtp.layers.{k}.mixer.q_proj.weight" in t
    moe = f"mtp.layers.{k}.mixer.gate.weight" in t
    return ATTENTION if attention and not moe else MOE if moe and not attention else "?"


def _as_global(name: str, first: int) -> str:
    parts = name.split(".", 3)
    return ".".join([*parts[:2], str(int(parts[2]) + first), parts[3]])


def head_block(text: dict, k: int) -> dict:
    """Puzzle's mtp_block_configs entry of block k of a depth (the list is one depth's blocks,
    which every depth has): the head's own sizes and routing, which differ from the
    backbone's; {} for other configs."""
    blocks = text.get("mtp_block_configs") or []
    return dict(blocks[k % len(blocks)]) if blocks else {}
