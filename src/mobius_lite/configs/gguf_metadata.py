"""GGUF metadata of a nemotron_h / nemotron_h_moe file -> a transformers-style config.json dict.

Read as llama.cpp's loader reads it: the per-layer `{arch}.attention.head_count_kv` and
`{arch}.feed_forward_length` arrays give the layer kinds (recurrent when both are 0, attention
when only the FFN length is 0, otherwise an FFN layer: a dense MLP in nemotron_h, a MoE in
nemotron_h_moe, where llama.cpp builds every FFN layer as MoE). Fields a GGUF does not carry
take GGUF_ABSENT_DEFAULTS, or the values of an optional config.json, which is cross-checked.

A Puzzle GGUF (llama.cpp's converter writes NemotronHPuzzleForCausalLM as nemotron_h_moe) carries
`{arch}.feed_forward_length`, `{arch}.expert_feed_forward_length` and `{arch}.expert_used_count`
as per-layer arrays (0 where a layer has no MoE); the expert count, shared-expert length and
latent size stay global. It is read into a nemotron_h_puzzle config whose block_configs hold
each layer's own sizes (configs/puzzle.py resolves them into the same LayerSpecs as for the
Puzzle safetensors release): a MoE layer's width and top-k, an attention layer's head counts,
and a MoE layer without shared-expert tensors as n_shared_experts = 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_lite.configs.loader import load_text_config
from mobius_lite.configs.nemotron_h import LEGACY_FIELD_NAMES, parse_layer_kind
from mobius_lite.configs.puzzle import PUZZLE_MODEL_TYPE
from mobius_lite.configs.values import decode_float
from mobius_lite.enums import LayerKind
from mobius_lite.errors import ConfigError

ARCHITECTURES = ("nemotron_h", "nemotron_h_moe")
PUZZLE_ARCHITECTURE = "NemotronHPuzzleForCausalLM"
# Per-layer arrays that make a nemotron_h_moe file a Puzzle one (scalars in the other files).
PUZZLE_PER_LAYER_KEYS = ("expert_feed_forward_length", "expert_used_count")

# llama.cpp's hybrid converter writes this context length when the model has no RoPE
# (GraniteHybridModel: `add_context_length(2**20)`); it is a placeholder, not the trained length.
NO_ROPE_CONTEXT_LENGTH = 2**20

# Fields the GGUF metadata does not carry, with the value used when no config.json gives them.
GGUF_ABSENT_DEFAULTS: dict[str, Any] = {
    # SSD chunk length of the prefill scan: a kernel choice, not a weight property (transformers'
    # and the released configs' default).
    "chunk_size": 128,
    # Runtime dt clamp; released configs use (0, inf), i.e. no clamp (llama.cpp applies none).
    "time_step_limit": [0.0, {"__float__": "Infinity"}],
    # dt_bias initialisation bounds only; unused at inference (transformers defaults).
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "time_step_floor": 1e-4,
    # in_proj / out_proj biases: llama.cpp's nemotron_h loader has none.
    "use_bias": False,
    # Attention projection biases: Nemotron-H has none.
    "attention_bias": False,
    # Activations are fixed by the architecture (llama.cpp: LLM_FFN_RELU_SQR, SiLU in Mamba2).
    "mlp_hidden_act": "relu2",
    "mamba_hidden_act": "silu",
    # SSM state precision of the cache: the released configs' float32.
    "mamba_ssm_cache_dtype": "float32",
    # No multi-token-prediction head unless {arch}.nextn_predict_layers says so (the
    # converter folds the head into one extra block then).
    "num_nextn_predict_layers": 0,
}

_SPELLED = {
    LayerKind.MAMBA: "mamba",
    LayerKind.ATTENTION: "attention",
    LayerKind.MLP: "mlp",
    LayerKind.MOE: "moe",
}


def _f32(value: Any) -> float:
    """A float32 GGUF value as the shortest decimal that round-trips (1e-5, not 9.99999e-06)."""
    return float(str(np.float32(value)))


class _Meta:
    def __init__(self, metadata: Mapping[str, Any], arch: str) -> None:
        self.metadata, self.arch = metadata, arch

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.arch}.{key}", default)

    def require(self, key: str) -> Any:
        full = f"{self.arch}.{key}"
        if full not in self.metadata:
            raise ConfigError(f"GGUF metadata has no {full}, which llama.cpp requires")
        return self.metadata[full]

    def per_layer(self, key: str, n_layer: int) -> list[int]:
        value = self.require(key)
        values = [int(v) for v in value] if isinstance(value, list) else [int(value)] * n_layer
        if len(values) != n_layer:
            raise ConfigError(
                f"{self.arch}.{key} has {len(values)} entries for {n_layer} layers (block_count)"
            )
        return values


def _uniform(values: list[int], layers: list[int], what: str) -> int | None:
    """The one value `values` take at `layers` (None if there are no such layers)."""
    seen = sorted({values[i] for i in layers})
    if len(seen) > 1:
        raise ConfigError(
            f"{what} differs between layers ({seen}); per-layer sizes are not supported for GGUF"
        )
    return seen[0] if seen else None


def _layer_kinds(kv: list[int], ff: list[int], moe: bool) -> list[LayerKind]:
    ffn_kind = LayerKind.MOE if moe else LayerKind.MLP
    return [
        LayerKind.MAMBA if h == 0 and f == 0 else LayerKind.ATTENTION if f == 0 else ffn_kind
        for h, f in zip(kv, ff, strict=True)
    ]


def _rms_epsilon(meta: _Meta) -> float:
    rms, plain = (
        meta.get("attention.layer_norm_rms_epsilon"),
        meta.get("attention.layer_norm_epsilon"),
    )
    if rms is None and plain is None:
        raise ConfigError(
            f"GGUF metadata has no {meta.arch}.attention.layer_norm_rms_epsilon "
            "(nor layer_norm_epsilon)"
        )
    if rms is not None and plain is not None and np.float32(rms) != np.float32(plain):
        raise ConfigError(
            f"{meta.arch}.attention.layer_norm_rms_epsilon={_f32(rms)} and "
            f"layer_norm_epsilon={_f32(plain)} disagree"
        )
    return _f32(rms if rms is not None else plain)


def _moe_fields(meta: _Meta, ff: list[int], moe_layers: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "n_routed_experts": int(meta.require("expert_count")),
        "num_experts_per_tok": int(meta.require("expert_used_count")),
    }
    expert_ff = meta.get("expert_feed_forward_length")
    out["moe_intermediate_size"] = (
        int(expert_ff) if expert_ff is not None else _uniform(ff, moe_layers, "feed_forward_length")
    )
    out.update(_shared_and_routing(meta))
    return out


def _shared_and_routing(meta: _Meta) -> dict[str, Any]:
    """The MoE fields every layer shares: shared expert, grouping, weights, latent size."""
    out: dict[str, Any] = {}
    shared_ff = int(meta.get("expert_shared_feed_forward_length", 0) or 0)
    shared = meta.get("expert_shared_count")
    shared = int(shared) if shared is not None else (1 if shared_ff > 0 else 0)
    if shared and not shared_ff:
        raise ConfigError(
            f"{meta.arch}.expert_shared_count={shared} but there is no "
            "expert_shared_feed_forward_length"
        )
    out["n_shared_experts"] = shared
    out["moe_shared_expert_intermediate_size"] = shared_ff
    out["n_group"] = int(meta.get("expert_group_count", 1) or 1)
    out["topk_group"] = int(meta.get("expert_group_used_count", 1) or 1)
    # llama.cpp's defaults when absent: no renormalisation, no scaling (scale 0 means 1).
    out["norm_topk_prob"] = bool(meta.get("expert_weights_norm", False))
    scale = meta.get("expert_weights_scale")
    out["routed_scaling_factor"] = _f32(scale) if scale else 1.0
    latent = meta.get("moe_latent_size")
    out["moe_latent_size"] = int(latent) if latent else None
    return out


def is_puzzle(metadata: Mapping[str, Any]) -> bool:
    """A nemotron_h_moe file whose expert width or top-k is a per-layer array."""
    arch = metadata.get("general.architecture")
    return arch == "nemotron_h_moe" and any(
        isinstance(metadata.get(f"{arch}.{key}"), list) for key in PUZZLE_PER_LAYER_KEYS
    )


def _puzzle_kinds(kv: list[int], ff: list[int], used: list[int]) -> list[LayerKind]:
    """Recurrent when neither heads nor FFN, attention when only heads, MoE when the layer has
    experts; an FFN width without experts can only be a dense MLP."""
    kinds = []
    for h, f, k in zip(kv, ff, used, strict=True):
        if f == 0:
            kinds.append(LayerKind.MAMBA if h == 0 else LayerKind.ATTENTION)
        else:
            kinds.append(LayerKind.MOE if k > 0 else LayerKind.MLP)
    return kinds


def _puzzle_blocks(
    meta: _Meta,
    kinds: list[LayerKind],
    sizes: dict[str, list[int]],
    shapes: Mapping[str, tuple[int, ...]] | None,
    shared: int,
) -> list[dict[str, Any]]:
    """One block_configs entry per layer: its kind and the sizes that are its own."""
    blocks: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        block: dict[str, Any] = {"block_type": _SPELLED[kind]}
        if kind is LayerKind.ATTENTION:
            block["num_attention_heads"] = sizes["heads"][i]
            block["num_key_value_heads"] = sizes["kv"][i]
        elif kind is LayerKind.MLP:
            block["intermediate_size"] = sizes["ff"][i]
        elif kind is LayerKind.MOE:
            width, top_k = sizes["expert_ff"][i], sizes["used"][i]
            if width <= 0:
                raise ConfigError(
                    f"{meta.arch}.expert_feed_forward_length[{i}]={width} but layer {i} uses "
                    f"{top_k} experts (expert_used_count); a MoE layer needs its expert width"
                )
            block["moe_intermediate_size"] = width
            block["num_experts_per_tok"] = top_k
            if shared and shapes is not None and f"blk.{i}.ffn_up_shexp.weight" not in shapes:
                block["n_shared_experts"] = 0  # this layer was pruned to no shared expert
        blocks.append(block)
    return blocks


def _puzzle_fields(
    meta: _Meta,
    n_layer: int,
    kv: list[int],
    ff: list[int],
    heads: list[int],
    shapes: Mapping[str, tuple[int, ...]] | None,
) -> tuple[list[LayerKind], dict[str, Any]]:
    """(layer kinds, the Puzzle-specific config fields) of a Puzzle GGUF."""
    used = meta.per_layer("expert_used_count", n_layer)
    expert_ff = (
        meta.per_layer("expert_feed_forward_length", n_layer)
        if meta.get("expert_feed_forward_length") is not None
        else ff
    )
    kinds = _puzzle_kinds(kv, ff, used)
    out: dict[str, Any] = {
        "model_type": PUZZLE_MODEL_TYPE,
        "architectures": [PUZZLE_ARCHITECTURE],
        "n_routed_experts": int(meta.require("expert_count")),
    }
    out.update(_shared_and_routing(meta))
    sizes = {"heads": heads, "kv": kv, "ff": ff, "expert_ff": expert_ff, "used": used}
    out["block_configs"] = _puzzle_blocks(meta, kinds, sizes, shapes, out["n_shared_experts"])
    firsts = {k: next((i for i, x in enumerate(kinds) if x is k), None) for k in LayerKind}
    if firsts[LayerKind.MOE] is not None:  # globals a MoE block inherits unless it overrides
        out["moe_intermediate_size"] = expert_ff[firsts[LayerKind.MOE]]
        out["num_experts_per_tok"] = used[firsts[LayerKind.MOE]]
    if firsts[LayerKind.MLP] is not None:
        out["intermediate_size"] = ff[firsts[LayerKind.MLP]]
    return kinds, out


def _from_tensors(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "token_embd.weight" in shapes:
        out["vocab_size"] = int(shapes["token_embd.weight"][0])
    if "output.weight" not in shapes:
        out["tie_word_embeddings"] = True  # llama.cpp then reuses token_embd as the output
    out["use_conv_bias"] = any(n.endswith(".ssm_conv1d.bias") for n in shapes)
    out["mlp_bias"] = any(n.endswith((".ffn_up.bias", ".ffn_up_exps.bias")) for n in shapes)
    return out


def _gguf_fields(
    metadata: Mapping[str, Any], tensor_shapes: Mapping[str, tuple[int, ...]] | None
) -> dict[str, Any]:
    """The config.json fields a GGUF file's metadata (and, when given, its tensor shapes)
    carry, checked as llama.cpp reads them."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"general.architecture={arch!r}: expected one of {', '.join(ARCHITECTURES)}"
        )
    meta = _Meta(metadata, str(arch))
    blocks = int(meta.require("block_count"))
    nextn = _nextn_layers(meta, blocks)
    n_layer = blocks - nextn  # the head's block (the last one) is not a decoder layer
    kv = meta.per_layer("attention.head_count_kv", blocks)[:n_layer]
    ff = meta.per_layer("feed_forward_length", blocks)[:n_layer]
    heads = meta.per_layer("attention.head_count", blocks)[:n_layer]
    puzzle: dict[str, Any] = {}
    if is_puzzle(metadata):
        kinds, puzzle = _puzzle_fields(meta, n_layer, kv, ff, heads, tensor_shapes)
    else:
        kinds = _layer_kinds(kv, ff, moe=arch == "nemotron_h_moe")
    at = {k: [i for i, kind in enumerate(kinds) if kind is k] for k in LayerKind}

    out: dict[str, Any] = {
        "model_type": "nemotron_h",
        "architectures": ["NemotronHForCausalLM"],
        "layers_block_type": [_SPELLED[k] for k in kinds],
        "num_hidden_layers": n_layer,
        "hidden_size": int(meta.require("embedding_length")),
        "layer_norm_epsilon": _rms_epsilon(meta),
        "max_position_embeddings": int(meta.get("context_length", NO_ROPE_CONTEXT_LENGTH)),
    }
    vocab = meta.get("vocab_size")
    tokens = metadata.get("tokenizer.ggml.tokens")
    if vocab is not None:
        out["vocab_size"] = int(vocab)
    elif tokens is not None:
        out["vocab_size"] = len(tokens)  # llama.cpp's fallback: the token list's length

    if at[LayerKind.ATTENTION]:
        first = at[LayerKind.ATTENTION][:1] if puzzle else at[LayerKind.ATTENTION]
        out.update(_attention_fields(meta, heads, kv, first))
    if at[LayerKind.MAMBA]:
        out.update(_mamba_fields(meta))
    if puzzle:
        out.update(puzzle)  # per-layer sizes live in its block_configs
    else:
        if at[LayerKind.MLP]:
            out["intermediate_size"] = _uniform(ff, at[LayerKind.MLP], "feed_forward_length")
        if at[LayerKind.MOE]:
            out.update(_moe_fields(meta, ff, at[LayerKind.MOE]))
    for field, key in (
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
        ("pad_token_id", "tokenizer.ggml.padding_token_id"),
    ):
        if key in metadata:
            out[field] = int(metadata[key])
    if tensor_shapes is not None:
        out.update(_from_tensors(tensor_shapes))
    if f"{arch}.nextn_predict_layers" in metadata:
        out.update(_nextn_fields(meta, blocks, nextn, out))
    return out


def _attention_fields(
    meta: _Meta, heads: list[int], kv: list[int], layers: list[int]
) -> dict[str, Any]:
    """Head counts (the one value at `layers`) and the one head_dim of the attention layers."""
    fields: dict[str, Any] = {
        "num_attention_heads": _uniform(heads, layers, "head_count"),
        "num_key_value_heads": _uniform(kv, layers, "head_count_kv"),
    }
    key_len, value_len = meta.get("attention.key_length"), meta.get("attention.value_length")
    if key_len is None or (value_len is not None and int(value_len) != int(key_len)):
        raise ConfigError(
            f"{meta.arch}.attention.key_length={key_len} / value_length={value_len}: Nemotron-H "
            "attention needs one head_dim"
        )
    fields["head_dim"] = int(key_len)
    return fields


def _mamba_fields(meta: _Meta) -> dict[str, Any]:
    """The Mamba mixers' sizes: heads, head dim, state size, groups, conv kernel."""
    n_ssm_heads = int(meta.require("ssm.time_step_rank"))
    inner = int(meta.require("ssm.inner_size"))
    if n_ssm_heads <= 0 or inner % n_ssm_heads:
        raise ConfigError(
            f"{meta.arch}.ssm.inner_size={inner} is not a multiple of "
            f"ssm.time_step_rank={n_ssm_heads} (the Mamba head count)"
        )
    return {
        "mamba_num_heads": n_ssm_heads,
        "mamba_head_dim": inner // n_ssm_heads,
        "ssm_state_size": int(meta.require("ssm.state_size")),
        "n_groups": int(meta.require("ssm.group_count")),
        "conv_kernel": int(meta.require("ssm.conv_kernel")),
    }


def _nextn_layers(meta: _Meta, blocks: int) -> int:
    """{arch}.nextn_predict_layers: how many of the last blocks are the MTP head (0 or 1)."""
    value = meta.get("nextn_predict_layers", 0) or 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value not in (0, 1):
        raise ConfigError(
            f"{meta.arch}.nextn_predict_layers={value!r}: only 0 or 1 multi-token-prediction "
            "block is supported"
        )
    if value >= blocks:
        raise ConfigError(
            f"{meta.arch}.nextn_predict_layers={value} leaves no decoder layer of block_count "
            f"{blocks}"
        )
    return int(value)


def _nextn_fields(meta: _Meta, blocks: int, nextn: int, out: dict[str, Any]) -> dict[str, Any]:
    """The head llama.cpp's converter folds into block n_layer: one attention and one MoE
    sub-layer with the backbone's sizes (the head reuses the decoder's attention / MoE
    fields, so its block must agree with them)."""
    fields: dict[str, Any] = {"num_nextn_predict_layers": nextn}
    if not nextn:
        return fields
    head = blocks - 1
    kv = meta.per_layer("attention.head_count_kv", blocks)[head]
    n_head = meta.per_layer("attention.head_count", blocks)[head]
    if not kv:
        raise ConfigError(
            f"{meta.arch}: the multi-token-prediction block {head} has head_count_kv 0; the "
            "head's first sub-layer is attention"
        )
    for field, value in (("num_attention_heads", n_head), ("num_key_value_heads", kv)):
        if field in out and out[field] != value:
            raise ConfigError(
                f"{meta.arch}: the multi-token-prediction block {head} has {field}={value}, "
                f"the decoder's attention layers {out[field]}; a head with its own attention "
                "sizes is not supported for GGUF"
            )
        out.setdefault(field, value)
    if "head_dim" not in out:
        out["head_dim"] = int(meta.require("attention.key_length"))
    if "n_routed_experts" not in out:
        out.update(_moe_fields(meta, meta.per_layer("feed_forward_length", blocks), [head]))
    fields["mtp_layers_block_type"] = ["attention", "moe"]
    return fields


def _normalise(field: str, value: Any) -> Any:
    """A comparable form of one config value (kinds parsed, floats at float32 precision)."""
    if field in ("layers_block_type", "mtp_layers_block_type"):
        return [parse_layer_kind(k, f"{field}[{i}]") for i, k in enumerate(value)]
    if field == "time_step_limit":
        return [decode_float(v, field) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, (float, dict)):
        number = decode_float(value, field)
        return number if math.isinf(number) else float(np.float32(number))
    if isinstance(value, (list, tuple)):
        return [_normalise(field, v) for v in value]
    return value


def _normalised_json(config_json: Mapping[str, Any]) -> dict[str, Any]:
    data = dict(config_json)
    for old, new in LEGACY_FIELD_NAMES.items():
        if old in data:
            data.setdefault(new, data.pop(old))
    pattern = data.pop("hybrid_override_pattern", None)
    if "layers_block_type" not in data and "layer_types" in data:
        data["layers_block_type"] = data.pop("layer_types")
    if "layers_block_type" not in data and isinstance(pattern, str):
        data["layers_block_type"] = list(pattern)
    return data


def _padded_vocab(gguf_vocab: int, config_vocab: Any) -> bool:
    """True if the GGUF token list is config_vocab padded to a multiple of 8 (the converter)."""
    if isinstance(config_vocab, bool) or not isinstance(config_vocab, int):
        return False
    return gguf_vocab > config_vocab and gguf_vocab == -(config_vocab // -8) * 8


def _cross_check(derived: dict[str, Any], given: dict[str, Any], vocab_from_list: bool) -> None:
    for field, value in derived.items():
        if field not in given or field in ("model_type", "architectures", "block_configs"):
            continue
        other = given[field]
        if field == "max_position_embeddings" and value == NO_ROPE_CONTEXT_LENGTH:
            continue  # the converter's no-RoPE placeholder, not a disagreement
        if field == "vocab_size" and vocab_from_list and _padded_vocab(value, other):
            continue
        if field == "eos_token_id" and isinstance(other, (list, tuple)) and value in other:
            continue  # config.json lists several end tokens; the GGUF names one of them
        if _normalise(field, value) != _normalise(field, other):
            raise ConfigError(
                f"GGUF metadata and config.json disagree on {field}: GGUF gives {value!r}, "
                f"config.json gives {other!r}"
            )


def config_from_gguf(
    metadata: Mapping[str, Any],
    config_json: Mapping[str, Any] | None = None,
    *,
    tensor_shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> dict[str, Any]:
    """A NemotronH config.json dict from GGUF metadata (+ tensor shapes, + optional config.json).

    tensor_shapes (GGUF name -> logical numpy shape) gives what only the tensors show: the
    vocabulary size (token_embd rows), tying (no `output` tensor) and conv / MLP biases.
    A field present in both the GGUF and config_json that disagrees is a ConfigError.
    """
    derived = _gguf_fields(metadata, tensor_shapes)
    given = _normalised_json(config_json) if config_json is not None else {}
    # Without token_embd's shape the vocabulary comes from the (possibly padded) token list.
    vocab_from_list = tensor_shapes is None or "token_embd.weight" not in tensor_shapes
    _cross_check(derived, given, vocab_from_list)
    config: dict[str, Any] = {**GGUF_ABSENT_DEFAULTS, **given, **derived}
    for field in ("max_position_embeddings", "vocab_size"):
        if field in given and _normalise(field, given[field]) != _normalise(field, config[field]):
            config[field] = given[field]  # a placeholder / padded GGUF value: the JSON's wins
    if isinstance(given.get("eos_token_id"), (list, tuple)):
        config["eos_token_id"] = list(given["eos_token_id"])
    if "tie_word_embeddings" not in derived:
        # A separate `output` tensor: the exporter uses it whatever the flag says
        # (transformers 5.x writes tied configs with a separate lm_head).
        config.setdefault("tie_word_embeddings", False)
    if config.get("model_type") == PUZZLE_MODEL_TYPE:
        config.pop("layers_block_type", None)  # the layer list of a Puzzle config is its blocks
    load_text_config(config)  # raises ConfigError naming the field if it cannot load
    return config


def config_from_checkpoint(
    checkpoint: Any, config_json: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """config_from_gguf for a GGUFCheckpoint, with its tensor shapes."""
    shapes = {name: tuple(checkpoint.logical_shape(name)) for name in checkpoint.names()}
    return config_from_gguf(checkpoint.metadata, config_json, tensor_shapes=shapes)
