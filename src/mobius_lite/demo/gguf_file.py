"""A demo text checkpoint written as one GGUF file, the way llama.cpp's convert_hf_to_gguf.py
writes a dense Nemotron-H (architecture `nemotron_h`) with `--outtype q8_0`, using gguf-py.

The converter's transforms, applied here to the released-name tensors:
- names: gguf's NEMOTRON_H tensor map (mixer.in_proj -> blk.N.ssm_in, ...);
- A_log -> ssm_a = -exp(A_log) as [H, 1]; D -> [H, 1]; conv1d [C, 1, K] -> [C, K];
  mixer.norm [inner] -> [n_groups, inner / n_groups]; q / k rows permuted per head
  (LlamaModel.permute: the converter treats the model as having RoPE, which it has not);
- 1-D tensors, norms, ssm_conv1d, ssm_a / ssm_d stay F32; other matrices Q8_0;
- metadata: per-layer head_count_kv / feed_forward_length arrays (0 where a layer has none),
  context_length 2**20 (no RoPE), key / value length = head_dim, ssm.* sizes, the tokenizer
  as a gpt2 BPE with pre-tokenizer "gpt-2".
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.demo.configs import SPELLED
from mobius_lite.demo.tensors import ATTENTION, MAMBA, MLP, Tensors

ARCH = "nemotron_h"
KINDS = {spelled: kind for kind, spelled in SPELLED.items()}
FORCED_F32 = re.compile(r"(_norm\.weight|ssm_conv1d\.weight|ssm_a|ssm_d)$")
MIXER_NAMES = {
    "in_proj.weight": "ssm_in.weight",
    "conv1d.bias": "ssm_conv1d.bias",
    "dt_bias": "ssm_dt.bias",
    "out_proj.weight": "ssm_out.weight",
    "v_proj.weight": "attn_v.weight",
    "o_proj.weight": "attn_output.weight",
    "up_proj.weight": "ffn_up.weight",
    "down_proj.weight": "ffn_down.weight",
}


def permute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """LlamaModel.permute: per head, rows [first half | second half] become interleaved."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def converter_tensors(config: dict[str, Any], tensors: Tensors) -> dict[str, np.ndarray]:
    """GGUF name -> float32 array, in the converter's layout."""
    out = {"token_embd.weight": tensors["backbone.embeddings.weight"]}
    for i, spelled in enumerate(config["layers_block_type"]):
        p, b = f"backbone.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = tensors[p + "norm.weight"]
        m = p + "mixer."
        if KINDS[spelled] == MAMBA:
            out[b + "ssm_conv1d.weight"] = tensors[m + "conv1d.weight"].squeeze(1)
            out[b + "ssm_a"] = (-np.exp(tensors[m + "A_log"])).reshape(-1, 1)
            out[b + "ssm_d"] = tensors[m + "D"].reshape(-1, 1)
            norm = tensors[m + "norm.weight"]
            out[b + "ssm_norm.weight"] = norm.reshape(config["n_groups"], -1)
        elif KINDS[spelled] == ATTENTION:
            q, k = tensors[m + "q_proj.weight"], tensors[m + "k_proj.weight"]
            out[b + "attn_q.weight"] = permute_rows(q, config["num_attention_heads"])
            out[b + "attn_k.weight"] = permute_rows(k, config["num_key_value_heads"])
        elif KINDS[spelled] != MLP:
            raise ValueError(f"a {ARCH} GGUF has no {spelled} layers")
        for name, gguf_name in MIXER_NAMES.items():
            if m + name in tensors:
                out[b + gguf_name] = tensors[m + name]
    out["output_norm.weight"] = tensors["backbone.norm_f.weight"]
    out["output.weight"] = tensors["lm_head.weight"]
    return out


def write_gguf(path: Path, config: dict[str, Any], tensors: Tensors, tokenizer: Any) -> None:
    """Write the model and its tokenizer as one GGUF file at `path`."""
    import gguf

    kinds = [KINDS[s] for s in config["layers_block_type"]]
    writer = gguf.GGUFWriter(path, ARCH)
    writer.add_name("mobius demo")
    writer.add_block_count(len(kinds))
    writer.add_context_length(2**20)
    writer.add_embedding_length(config["hidden_size"])
    writer.add_vocab_size(config["vocab_size"])
    writer.add_feed_forward_length([config["intermediate_size"] if k == MLP else 0 for k in kinds])
    writer.add_head_count(config["num_attention_heads"])
    kv = config["num_key_value_heads"]
    writer.add_head_count_kv([kv if k == ATTENTION else 0 for k in kinds])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    writer.add_layer_norm_rms_eps(config["layer_norm_epsilon"])
    writer.add_ssm_conv_kernel(config["conv_kernel"])
    writer.add_ssm_state_size(config["ssm_state_size"])
    writer.add_ssm_group_count(config["n_groups"])
    writer.add_ssm_inner_size(config["mamba_num_heads"] * config["mamba_head_dim"])
    writer.add_ssm_time_step_rank(config["mamba_num_heads"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    _add_tokenizer(writer, config, tokenizer)
    for name, data in converter_tensors(config, tensors).items():
        data = np.ascontiguousarray(data, dtype=np.float32)
        if data.ndim <= 1 or FORCED_F32.search(name):
            writer.add_tensor(name, data)
        else:
            q8 = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _add_tokenizer(writer: Any, config: dict[str, Any], tokenizer: Any) -> None:
    """tokenizer.ggml.*: what the converter's NemotronH set_vocab writes for a gpt2 BPE."""
    import gguf

    spec = json.loads(tokenizer.to_str())
    by_id = {i: t for t, i in spec["model"]["vocab"].items()}
    special = {t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    for t in spec.get("added_tokens", []):
        by_id[t["id"]] = t["content"]
    size = config["vocab_size"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(size)]
    normal, control, unused = gguf.TokenType.NORMAL, gguf.TokenType.CONTROL, gguf.TokenType.UNUSED
    types = [
        int(unused if i not in by_id else control if i in special else normal) for i in range(size)
    ]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_add_bos_token(False)
