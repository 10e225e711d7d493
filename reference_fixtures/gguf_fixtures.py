"""Tiny transformers NemotronH models written as GGUF the way llama.cpp's converter writes them,
and the reference state dict rebuilt from such a file with gguf-py alone.

Layout facts (convert_hf_to_gguf.py, NemotronHModel / GraniteHybridModel / Mamba2Model /
LlamaModel; llama-quantize for the type choices):
- names: gguf's TensorNameMap for NEMOTRON_H / NEMOTRON_H_MOE (e.g. mixer.A_log -> blk.N.ssm_a);
- A_log -> A = -exp(A_log) stored [H, 1]; D -> [H, 1]; conv1d [C, 1, K] -> [C, K];
  mixer.norm [d] -> [n_groups, d / n_groups]; q/k rows permuted per head (LlamaModel.permute,
  GraniteHybridModel.undo_permute = True); experts stacked [E, N, K];
- metadata: per-layer head_count_kv / feed_forward_length arrays (0 where the layer has none),
  context_length 2**20 (no RoPE), key/value_length = head_dim, ssm.* sizes, expert_* for MoE;
- F32 is forced for 1-D tensors, *_norm.weight, ssm_conv1d, ssm_a / ssm_d and ffn_gate_inp;
  rows that do not hold whole 256-element blocks fall back as llama-quantize does.
The reference never imports mobius_lite: it reads with gguf.GGUFReader, dequantizes with
gguf.quants.dequantize (Q1_0, which gguf-py 0.19 cannot decode: ggml's definition, written
out in q1_0_by_definition) and undoes the transforms with numpy from the facts above.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$")

# Types gguf.quants.quantize implements (the rest get random valid blocks).
GGUF_PY_QUANTIZE = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}

# llama-quantize's fallback for rows that are not whole 256-element super-blocks.
SUPERBLOCK_FALLBACK = {
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "IQ2_XXS": "IQ4_NL",
    "IQ2_XS": "IQ4_NL",
    "IQ2_S": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL",
    "IQ3_S": "IQ4_NL",
    "IQ1_S": "IQ4_NL",
    "IQ1_M": "IQ4_NL",
    "IQ4_XS": "IQ4_NL",
}

# Byte offsets of the fp16 scale fields inside one block (ggml's block_* structs).
FP16_FIELDS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "IQ1_S": (0,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
    "Q1_0": (0,),
    "NVFP4": (),  # UE4M3 scale bytes: every byte is a finite value
    "MXFP4": (),  # its E8M0 byte is set apart (random_blocks)
}
# E8M0 exponents of random MXFP4 blocks: scales 2^-10 .. 2^-4, like small weights.
MXFP4_EXPONENTS = (118, 125)
# UE4M3 scale bytes of random NVFP4 blocks: 0x08 .. 0x20 are 2^-6 .. 2^-3 (exponent field 1..4,
# bias 7), so that scale x E2M1 (at most 6) stays at the size of a small model's weights.
NVFP4_SCALE_BYTES = (0x08, 0x20)

FORCED_F32 = re.compile(r"(_norm\.weight|ssm_conv1d\.weight|ssm_a|ssm_d|ffn_gate_inp\.weight)$")

# A mix like the real presets: K / IQ types where rows allow, 32-block types elsewhere.
PRESET_MIXED: dict[str, str] = {
    r"^token_embd": "Q6_K",
    r"^output\.": "Q8_0",
    r"attn_[qk]\.": "Q4_K",
    r"attn_v\.": "Q6_K",
    r"attn_output\.": "Q5_K",
    r"ssm_in\.": "IQ2_XXS",
    r"ssm_out\.": "Q3_K",  # rows of d_inner = 32: falls back to IQ4_NL
    r"ffn_up\.": "Q3_K",
    r"ffn_down\.": "Q2_K",
    r"ffn_up_exps\.": "IQ3_S",
    r"ffn_down_exps\.": "IQ4_XS",
    r"ffn_(up|down)_shexp\.": "Q5_1",
    r"ffn_latent_(up|down)\.": "BF16",
    r"ssm_conv1d\.bias": "F16",  # 1-D: forced back to F32
}

# Every type gguf-py can both quantize and dequantize, spread over the tensors.
PRESET_GGUF_PY: dict[str, str] = {
    r"^token_embd": "Q8_0",
    r"^output\.": "F16",
    r"attn_[qv]\.": "Q4_0",
    r"attn_k\.": "Q4_1",
    r"attn_output\.": "Q5_0",
    r"ssm_in\.": "Q5_1",
    r"ssm_out\.": "BF16",
    r"ffn_(up|down)": "Q8_0",
    r"ffn_latent": "F16",
}


# What a Puzzle GGUF can say per layer: MoE width and top-k, attention head counts, a pruned
# shared expert; the expert count (8), shared width and latent size are global.
PUZZLE_GGUF_BLOCKS: list[dict[str, Any]] = [
    {"block_type": "mamba"},
    {"block_type": "moe", "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    {"block_type": "attention"},
    {
        "block_type": "moe",
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 12,
        "n_shared_experts": 0,
    },
    {"block_type": "mamba"},
    {"block_type": "attention", "num_attention_heads": 2, "num_key_value_heads": 1},
    {"block_type": "moe", "num_experts_per_tok": 1, "moe_intermediate_size": 20},
]
# chunk_size: the one Mamba field a GGUF does not carry, at the value it then takes (128)
PUZZLE_GGUF_GLOBALS: dict[str, Any] = {"moe_latent_size": 24, "chunk_size": 128}


# ----------------------------------------------------------------------------- layout
def _permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """LlamaModel.permute: per head, rows [first half | second half] become interleaved."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _kind(config: Any, layer: int) -> str:
    spelled = {"linear_attention": "mamba", "full_attention": "attention"}
    name = config.layers_block_type[layer]
    return spelled.get(name, name)


def layer_config(model: Any, layer: int) -> Any:
    """The transformers config layer `layer`'s mixer was built with (a Puzzle reference
    rebuilds each mixer from its own; otherwise the model's)."""
    return getattr(model.model.layers[layer].mixer, "config", model.config)


def converter_tensors(model: Any, arch: str) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array (numpy order) exactly as the converter would emit them."""
    config = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out: dict[str, np.ndarray] = {"token_embd.weight": sd["model.embeddings.weight"]}
    for i in range(config.num_hidden_layers):
        kind = _kind(config, i)
        if arch == "nemotron_h" and kind == "moe":
            raise ValueError(f"layer {i}: a nemotron_h GGUF has no MoE layers")
        if arch == "nemotron_h_moe" and kind == "mlp":
            raise ValueError(f"layer {i}: llama.cpp builds every nemotron_h_moe FFN as MoE")
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = sd[p + "norm.weight"]
        m = p + "mixer."
        if kind == "mamba":
            out[b + "ssm_in.weight"] = sd[m + "in_proj.weight"]
            out[b + "ssm_conv1d.weight"] = sd[m + "conv1d.weight"].squeeze(1)
            if m + "conv1d.bias" in sd:
                out[b + "ssm_conv1d.bias"] = sd[m + "conv1d.bias"]
            out[b + "ssm_dt.bias"] = sd[m + "dt_bias"]
            out[b + "ssm_a"] = (-np.exp(sd[m + "A_log"])).reshape(-1, 1)
            out[b + "ssm_d"] = sd[m + "D"].reshape(-1, 1)
            out[b + "ssm_norm.weight"] = sd[m + "norm.weight"].reshape(config.n_groups, -1)
            out[b + "ssm_out.weight"] = sd[m + "out_proj.weight"]
        elif kind == "attention":
            own = layer_config(model, i)  # a Puzzle layer's own head counts
            heads, kv_heads = own.num_attention_heads, own.num_key_value_heads
            out[b + "attn_q.weight"] = _permute_rows(sd[m + "q_proj.weight"], heads)
            out[b + "attn_k.weight"] = _permute_rows(sd[m + "k_proj.weight"], kv_heads)
            out[b + "attn_v.weight"] = sd[m + "v_proj.weight"]
            out[b + "attn_output.weight"] = sd[m + "o_proj.weight"]
        elif kind == "mlp":
            out[b + "ffn_up.weight"] = sd[m + "up_proj.weight"]
            out[b + "ffn_down.weight"] = sd[m + "down_proj.weight"]
        else:
            out[b + "ffn_gate_inp.weight"] = sd[m + "gate.weight"]
            out[b + "exp_probs_b.bias"] = sd[m + "gate.e_score_correction_bias"]
            if m + "fc1_latent_proj.weight" in sd:
                out[b + "ffn_latent_down.weight"] = sd[m + "fc1_latent_proj.weight"]
                out[b + "ffn_latent_up.weight"] = sd[m + "fc2_latent_proj.weight"]
            out[b + "ffn_up_exps.weight"] = sd[m + "experts.up_proj"]
            out[b + "ffn_down_exps.weight"] = sd[m + "experts.down_proj"]
            if m + "shared_experts.up_proj.weight" in sd:
                out[b + "ffn_up_shexp.weight"] = sd[m + "shared_experts.up_proj.weight"]
                out[b + "ffn_down_shexp.weight"] = sd[m + "shared_experts.down_proj.weight"]
    out["output_norm.weight"] = sd["model.norm_f.weight"]
    embed, head = sd["model.embeddings.weight"], sd["lm_head.weight"]
    if not (config.tie_word_embeddings and np.array_equal(embed, head)):
        out["output.weight"] = head  # the converter drops it only when it equals token_embd
    return out


# ----------------------------------------------------------------------------- types
def storage_type(name: str, shape: tuple[int, ...], types: dict[str, str]) -> str:
    """The ggml type the converter + llama-quantize give this tensor for the requested mix."""
    if len(shape) <= 1 or FORCED_F32.search(name):
        return "F32"
    wanted = next((t for pattern, t in types.items() if re.search(pattern, name)), "F32")
    block = gguf.GGML_QUANT_SIZES[Q[wanted]][0]
    if shape[-1] % block:
        wanted = SUPERBLOCK_FALLBACK.get(wanted, wanted)
        if shape[-1] % gguf.GGML_QUANT_SIZES[Q[wanted]][0]:
            wanted = "F16"
    return wanted


def random_blocks(type_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random valid bytes of a type gguf-py cannot quantize: fp16 scales finite and small."""
    qtype = Q[type_name]
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = int(np.prod(shape)) // block_elems
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = rng.uniform(2e-4, 1e-3, size=(n_blocks, 4)).astype(np.float16).view(np.uint16)
    if type_name == "IQ1_M":
        # the fp16 scale is the top nibble of each of the 4 uint16 words at bytes 48..55
        for k in range(4):
            nibble = ((scales[:, 0] >> (4 * k)) & 0xF).astype(np.uint8)
            hi = 49 + 2 * k
            blocks[:, hi] = (blocks[:, hi] & 0x0F) | (nibble << 4)
    else:
        for j, offset in enumerate(FP16_FIELDS[type_name]):
            blocks[:, offset : offset + 2] = scales[:, j : j + 1].view(np.uint8)
    if type_name == "MXFP4":
        blocks[:, 0] = rng.integers(*MXFP4_EXPONENTS, size=n_blocks, endpoint=True)
    if type_name == "NVFP4":
        blocks[:, :4] = rng.integers(*NVFP4_SCALE_BYTES, size=(n_blocks, 4), endpoint=True)
    row_bytes = shape[-1] // block_elems * block_bytes
    return blocks.reshape(*shape[:-1], row_bytes)


def encode(name: str, data: np.ndarray, type_name: str, rng: np.random.Generator) -> np.ndarray:
    if type_name == "F32":
        return np.ascontiguousarray(data, dtype=np.float32)
    if type_name in GGUF_PY_QUANTIZE:
        return gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), Q[type_name])
    return random_blocks(type_name, data.shape, rng)


# ----------------------------------------------------------------------------- tokenizer
def tokenizer_metadata(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """The tokenizer.ggml.* values the converter's NemotronH set_vocab writes (gpt2 BPE)."""
    spec = json.loads(tokenizer.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    reverse = {i: t for t, i in vocab.items()}
    reverse.update({i: t["content"] for i, t in added.items()})
    if max(reverse) >= vocab_size:
        raise ValueError(f"tokenizer has {max(reverse) + 1} tokens, more than vocab {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        else:
            tokens.append(reverse[i])
            special = i in added and added[i].get("special", False)
            types.append(int(gguf.TokenType.CONTROL if special else gguf.TokenType.NORMAL))
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokens": tokens, "types": types, "merges": merges}


# ----------------------------------------------------------------------------- writer
def write_gguf(
    path: str | Path,
    model: Any,
    arch: str,
    types: dict[str, str] | None = None,
    tokenizer: Any = None,
    split: int | None = None,
    *,
    special_tokens: dict[str, int] | None = None,
    seed: int = 0,
    extra_tensors: dict[str, np.ndarray] | None = None,
    scales: dict[str, np.ndarray] | None = None,
    puzzle: bool = False,
    packed: dict[str, tuple[np.ndarray, str]] | None = None,
    nextn: dict[str, np.ndarray] | None = None,
) -> list[Path]:
    """Write `model` as llama.cpp's converter would; returns the written file(s).

    types: regex over GGUF names -> ggml type name (first match wins, default F32).
    split: at most this many tensors per file (a `-0000i-of-0000N.gguf` split set).
    scales: GGUF weight name -> its `.scale` sidecar values ([1], or [E] for stacked experts):
    the weight is stored divided by them, so stored blocks x scale is the model's weight.
    packed: GGUF name -> (its blocks as uint8 [..., row_bytes], ggml type name), written as
    they are in place of the model's values (e.g. NVFP4 repacked from ModelOpt bytes).
    puzzle: a Puzzle reference (evaluation/puzzle_reference.py) written as the converter's
    NemotronHPuzzleModel does: nemotron_h_moe with per-layer feed_forward_length,
    expert_feed_forward_length and expert_used_count (0 for a layer without MoE) and per-layer
    head counts; expert count, shared-expert length and latent size global.
    nextn: the MTP head's tensors of block n_layer (GGUF names; mtp_fixtures.nextn_tensors),
    which then counts in block_count and the per-layer arrays as an attention + MoE block,
    with nextn_predict_layers = 1.
    """
    if puzzle and arch != "nemotron_h_moe":
        raise ValueError("the converter writes Puzzle checkpoints as nemotron_h_moe")
    if puzzle and nextn:
        raise ValueError("llama.cpp's converter writes no MTP head for Puzzle checkpoints")
    path = Path(path)
    config = model.config
    rng = np.random.default_rng(seed)
    tensors = converter_tensors(model, arch)
    for name, scale in (scales or {}).items():
        tensors[name] = tensors[name] / _per_slice(scale, tensors[name])
        tensors[name.removesuffix(".weight") + ".scale"] = np.asarray(scale, np.float32)
    tensors.update(extra_tensors or {})
    tensors.update(nextn or {})
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split or 0)

    n_layer = config.num_hidden_layers
    kinds = [_kind(config, i) for i in range(n_layer)]
    pairs = [(layer_config(model, i), kinds[i]) for i in range(n_layer)]
    ffn = config.moe_intermediate_size if arch == "nemotron_h_moe" else config.intermediate_size
    if nextn:
        kinds.append("nextn")  # attention heads and an FFN length in one block
        writer.add_uint32(f"{arch}.nextn_predict_layers", 1)
    writer.add_block_count(len(kinds))
    writer.add_context_length(2**20)  # GraniteHybridModel: no RoPE
    writer.add_embedding_length(config.hidden_size)
    writer.add_vocab_size(config.vocab_size)
    if puzzle:  # NemotronHPuzzleModel: per-layer arrays, 0 where a layer has no MoE
        widths = [c.moe_intermediate_size if k == "moe" else 0 for c, k in pairs]
        writer.add_feed_forward_length(widths)
        writer.add_head_count([c.num_attention_heads if k == "attention" else 0 for c, k in pairs])
        writer.add_head_count_kv(
            [c.num_key_value_heads if k == "attention" else 0 for c, k in pairs]
        )
    else:
        writer.add_feed_forward_length([ffn if k in ("mlp", "moe", "nextn") else 0 for k in kinds])
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(
            [config.num_key_value_heads if k in ("attention", "nextn") else 0 for k in kinds]
        )
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    writer.add_layer_norm_rms_eps(config.layer_norm_epsilon)
    writer.add_rope_scaling_finetuned(False)
    writer.add_ssm_conv_kernel(config.conv_kernel)
    writer.add_ssm_state_size(config.ssm_state_size)
    writer.add_ssm_group_count(config.n_groups)
    writer.add_ssm_inner_size(config.mamba_num_heads * config.mamba_head_dim)
    writer.add_ssm_time_step_rank(config.mamba_num_heads)
    if puzzle:  # arrays under the same keys (gguf-py 0.19's add_expert_* take scalars only)
        used = [c.num_experts_per_tok if k == "moe" else 0 for c, k in pairs]
        writer.add_array(gguf.Keys.LLM.EXPERT_USED_COUNT.format(arch=arch), used)
        writer.add_array(gguf.Keys.LLM.EXPERT_FEED_FORWARD_LENGTH.format(arch=arch), widths)
    elif arch == "nemotron_h_moe":
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == "nemotron_h_moe":
        writer.add_expert_shared_feed_forward_length(config.moe_shared_expert_intermediate_size)
        writer.add_expert_count(config.n_routed_experts)
        writer.add_expert_shared_count(config.n_shared_experts)
        writer.add_expert_weights_norm(config.norm_topk_prob)
        writer.add_expert_weights_scale(config.routed_scaling_factor)
        writer.add_expert_group_count(config.n_group)
        writer.add_expert_group_used_count(config.topk_group)
        if config.moe_latent_size is not None:
            writer.add_moe_latent_size(config.moe_latent_size)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    if tokenizer is not None:
        meta = tokenizer_metadata(tokenizer, config.vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(meta["tokens"])
        writer.add_token_types(meta["types"])
        writer.add_token_merges(meta["merges"])
        ids = special_tokens or {}
        for key, add in (
            ("bos", writer.add_bos_token_id),
            ("eos", writer.add_eos_token_id),
            ("pad", writer.add_pad_token_id),
        ):
            if key in ids:
                add(ids[key])
        if arch == "nemotron_h":
            writer.add_add_bos_token(True)  # NemotronHModel.set_vocab, non-MoE only

    for name, (blocks, _) in (packed or {}).items():
        tensors[name] = blocks  # in the converter's order (the model's), but stored as given
    for name, data in tensors.items():
        if name in (packed or {}):
            writer.add_tensor(name, data, raw_dtype=Q[packed[name][1]])  # type: ignore[index]
            continue
        if data.dtype != np.float32:
            writer.add_tensor(name, data)  # extra tensors of other dtypes, written as given
            continue
        type_name = storage_type(name, data.shape, types or {})
        stored = encode(name, data, type_name, rng)
        raw = None if type_name in ("F32", "F16") else Q[type_name]
        writer.add_tensor(name, stored, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)


# ----------------------------------------------------------------------------- reference
def _per_slice(scale: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """A `.scale` sidecar broadcast over its weight: one value, or one per expert ([E, 1, 1])."""
    scale = np.asarray(scale, np.float32).reshape(-1)
    return scale.reshape(-1, 1, 1) if weight.ndim == 3 else scale.reshape(())


def apply_sidecars(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """llama.cpp's meaning of the NVFP4 sidecars on dequantized arrays: each weight times its
    `.scale` (per expert for stacked experts); `.input_scale` (activations) dropped."""
    out = {n: a for n, a in arrays.items() if not n.endswith((".scale", ".input_scale"))}
    for name, scale in arrays.items():
        if name.endswith(".scale"):
            weight = name.removesuffix(".scale") + ".weight"
            out[weight] = out[weight] * _per_slice(scale, out[weight])
    return out


def gguf_parts(path: str | Path) -> list[Path]:
    path = Path(path)
    match = SPLIT_NAME.match(path.name)
    if match is None:
        return [path]
    n = int(match["count"])
    return [path.with_name(f"{match['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]


def q1_0_by_definition(data: np.ndarray) -> np.ndarray:
    """ggml-quants.c dequantize_row_q1_0, written out (gguf-py 0.19 has no Q1_0 decode): per
    block of 18 bytes, d = the fp16 at bytes 0..1; for j in 0..127: bit = (qs[j / 8] >> (j % 8))
    & 1 with qs = bytes 2..17, and y[j] = bit ? d : -d."""
    blocks = data.reshape(-1, 18)
    d = blocks[:, 0:2].copy().view("<f2").astype(np.float32)[:, 0]
    out = np.empty((len(blocks), 128), np.float32)
    for j in range(128):
        bit = (blocks[:, 2 + j // 8] >> (j % 8)) & 1
        out[:, j] = np.where(bit == 1, d, -d)
    return out.reshape(*data.shape[:-1], data.shape[-1] // 18 * 128)


def dequantize(data: np.ndarray, type_name: str) -> np.ndarray:
    """gguf-py's dequantize, and ggml's definition for Q1_0 (which gguf-py 0.19 lacks)."""
    if type_name == "Q1_0":
        return q1_0_by_definition(np.asarray(data, np.uint8))
    return gguf.quants.dequantize(np.asarray(data), Q[type_name])


def dequantized_arrays(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """GGUF name -> float32 logical array (gguf-py dequantize; Q1_0 by ggml's definition), plus
    the first part's metadata."""
    arrays: dict[str, np.ndarray] = {}
    metadata: dict[str, Any] = {}
    for number, part in enumerate(gguf_parts(path)):
        reader = gguf.GGUFReader(part)
        if number == 0:
            metadata = {k: f.contents() for k, f in reader.fields.items()}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))
            values = dequantize(np.asarray(t.data), t.tensor_type.name)
            arrays[t.name] = np.asarray(values, dtype=np.float32).reshape(shape)
    return arrays, metadata


def dequantized_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """transformers NemotronHForCausalLM state dict (model. names) from a converter-layout GGUF."""
    arrays, metadata = dequantized_arrays(path)
    arrays = apply_sidecars(arrays)
    arch = metadata["general.architecture"]
    n_head = int(metadata[f"{arch}.attention.head_count"])
    # the MTP head's block (nextn_predict_layers, the last blocks) is not a decoder layer
    n_layer = int(metadata[f"{arch}.block_count"]) - int(
        metadata.get(f"{arch}.nextn_predict_layers", 0)
    )
    kv = metadata[f"{arch}.attention.head_count_kv"]
    out: dict[str, np.ndarray] = {
        "model.embeddings.weight": arrays["token_embd.weight"],
        "model.norm_f.weight": arrays["output_norm.weight"],
        "lm_head.weight": arrays.get("output.weight", arrays["token_embd.weight"]),
    }
    simple = {
        "attn_norm.weight": "norm.weight",
        "ssm_in.weight": "mixer.in_proj.weight",
        "ssm_conv1d.bias": "mixer.conv1d.bias",
        "ssm_dt.bias": "mixer.dt_bias",
        "ssm_out.weight": "mixer.out_proj.weight",
        "attn_v.weight": "mixer.v_proj.weight",
        "attn_output.weight": "mixer.o_proj.weight",
        "ffn_up.weight": "mixer.up_proj.weight",
        "ffn_down.weight": "mixer.down_proj.weight",
        "ffn_gate_inp.weight": "mixer.gate.weight",
        "exp_probs_b.bias": "mixer.gate.e_score_correction_bias",
        "ffn_up_exps.weight": "mixer.experts.up_proj",
        "ffn_down_exps.weight": "mixer.experts.down_proj",
        "ffn_latent_down.weight": "mixer.fc1_latent_proj.weight",
        "ffn_latent_up.weight": "mixer.fc2_latent_proj.weight",
        "ffn_up_shexp.weight": "mixer.shared_experts.up_proj.weight",
        "ffn_down_shexp.weight": "mixer.shared_experts.down_proj.weight",
    }
    for name, value in arrays.items():
        match = re.match(r"^blk\.(\d+)\.(.+)$", name)
        if match is None:
            continue
        layer, rest = int(match[1]), match[2]
        if layer >= n_layer:
            continue
        prefix = f"model.layers.{layer}."
        if rest in simple:
            out[prefix + simple[rest]] = value
        elif rest == "ssm_a":
            out[prefix + "mixer.A_log"] = np.log(-value.reshape(-1))
        elif rest == "ssm_d":
            out[prefix + "mixer.D"] = value.reshape(-1)
        elif rest == "ssm_norm.weight":
            out[prefix + "mixer.norm.weight"] = value.reshape(-1)
        elif rest == "ssm_conv1d.weight":
            out[prefix + "mixer.conv1d.weight"] = value[:, None, :]
        elif rest == "attn_q.weight":
            out[prefix + "mixer.q_proj.weight"] = _unpermute_rows(value, n_head)
        elif rest == "attn_k.weight":
            heads = int(kv[layer]) if isinstance(kv, list) else int(kv)
            out[prefix + "mixer.k_proj.weight"] = _unpermute_rows(value, heads)
        else:
            raise KeyError(f"unexpected GGUF tensor {name}")
    return {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in out.items()}


def build_bpe_tokenizer(corpus: list[str], vocab_size: int = 300) -> Any:
    """A small byte-level BPE with <pad>, <s>, </s> (ids 0, 1, 2) and a BOS template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", 1)]
    )
    return tokenizer
