"""GGUF files with NVFP4 weights and their `.scale` / `.input_scale` sidecars, written as
llama.cpp's converter writes them (convert_hf_to_gguf.py: `_nvfp4_pack`, `_repack_nvfp4`,
`_generate_nvfp4_tensors`, `_write_scale_tensor`), from ModelOpt NVFP4 bytes:

- the E4M3 block-scale bytes are kept with the sign bit cleared (UE4M3);
- ModelOpt packs each 16-element group's element 2i in the low and 2i + 1 in the high nibble
  of byte i; ggml's group holds elements 0-7 in the low nibbles of its 8 bytes and 8-15 in
  the high nibbles;
- 4 groups (64 elements) make one 36-byte superblock: 4 scale bytes, then 32 code bytes;
- per-tensor `weight_scale_2` becomes `<name>.scale` (F32 [1]) and `input_scale`
  `<name>.input_scale`, each only when it is not 1 within 1e-6; routed experts are stacked
  [E, N, row_bytes] with [E] sidecars (written unless all are 1 within 1e-6);
- q / k rows (weight and scales) are permuted per head (LlamaModel.permute, undo_permute);
- every other tensor takes the converter's usual path; FP8 weights are dequantized first
  (here at --outtype f32, so e4m3 x scale is written exactly).

Written from those rules with numpy; no mobius_lite code is used.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

import modelopt_fixtures as mf
from gguf_fixtures import _permute_rows, write_gguf

TRIVIAL = 1e-6

# ModelOpt module (after backbone.layers.N.mixer.) -> GGUF name (after blk.N.)
MODULE_NAMES = {
    "in_proj": "ssm_in",
    "out_proj": "ssm_out",
    "q_proj": "attn_q",
    "k_proj": "attn_k",
    "v_proj": "attn_v",
    "o_proj": "attn_output",
    "up_proj": "ffn_up",
    "down_proj": "ffn_down",
    "shared_experts.up_proj": "ffn_up_shexp",
    "shared_experts.down_proj": "ffn_down_shexp",
    "fc1_latent_proj": "ffn_latent_down",
    "fc2_latent_proj": "ffn_latent_up",
}
LAYER_MODULE = re.compile(r"^backbone\.layers\.(?P<layer>\d+)\.mixer\.(?P<rest>.+)$")
EXPERT = re.compile(r"^experts\.(?P<e>\d+)\.(?P<proj>up_proj|down_proj)$")


def nvfp4_blocks(packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """ModelOpt codes uint8 [N, K/2] + E4M3 scales [N, K/16] -> ggml NVFP4 rows [N, K/64 * 36]."""
    n, half = packed.shape
    k = half * 2
    if k % 64:
        raise ValueError(f"NVFP4 rows hold whole 64-element superblocks; K = {k}")
    codes = np.empty((n, k), dtype=np.uint8)
    codes[:, 0::2] = packed & 0x0F  # ModelOpt: element 2i low, 2i + 1 high
    codes[:, 1::2] = packed >> 4
    groups = codes.reshape(n, k // 16, 16)
    qs = groups[..., :8] | (groups[..., 8:] << 4)  # ggml: elements j and j + 8 share byte j
    ue4m3 = np.asarray(scale).view(np.uint8).reshape(n, k // 16) & 0x7F
    superblocks = k // 64
    rows = np.concatenate(
        [ue4m3.reshape(n, superblocks, 4), qs.reshape(n, superblocks, 32)], axis=-1
    )
    return rows.reshape(n, superblocks * 36).astype(np.uint8)


def _trivial(values: np.ndarray) -> bool:
    return bool(np.allclose(np.asarray(values, np.float32), 1.0, atol=TRIVIAL))


def _gguf_name(module: str) -> tuple[str, int | None]:
    """(GGUF weight name, expert index or None) of a ModelOpt linear module."""
    if module == "lm_head":
        return "output.weight", None
    match = LAYER_MODULE.match(module)
    if match is None:
        raise KeyError(module)
    layer, rest = match["layer"], match["rest"]
    expert = EXPERT.match(rest)
    if expert is not None:
        return f"blk.{layer}.ffn_{expert['proj'].split('_')[0]}_exps.weight", int(expert["e"])
    return f"blk.{layer}.{MODULE_NAMES[rest]}.weight", None


def nvfp4_tensors(
    tensors: dict[str, np.ndarray], heads: dict[str, int]
) -> tuple[dict[str, tuple[np.ndarray, str]], dict[str, np.ndarray]]:
    """(packed NVFP4 weights, sidecars) from a ModelOpt checkpoint's tensors.

    heads: GGUF suffix ("attn_q" / "attn_k") -> the head count its rows are permuted over.
    """
    packed: dict[str, tuple[np.ndarray, str]] = {}
    sidecars: dict[str, np.ndarray] = {}
    experts: dict[str, dict[int, tuple[np.ndarray, float, float]]] = {}
    for name in sorted(tensors):
        if not name.endswith(".weight_scale") or tensors[name].ndim < 2:
            continue  # FP8's scale is a scalar: dequantized by the converter, not repacked
        module = name.removesuffix(".weight_scale")
        blocks = nvfp4_blocks(tensors[f"{module}.weight"], tensors[name])
        # the converter reads each as `float(t.float().sum())` (stored as [] or [1])
        scale_2 = float(np.sum(tensors.get(f"{module}.weight_scale_2", 1.0), dtype=np.float32))
        input_scale = float(np.sum(tensors.get(f"{module}.input_scale", 1.0), dtype=np.float32))
        gguf_name, expert = _gguf_name(module)
        if expert is not None:
            experts.setdefault(gguf_name, {})[expert] = (blocks, scale_2, input_scale)
            continue
        kind = gguf_name.split(".")[-2]
        if kind in heads:
            blocks = _permute_rows(blocks, heads[kind])
        packed[gguf_name] = (blocks, "NVFP4")
        stem = gguf_name.removesuffix(".weight")
        for suffix, value in ((".scale", scale_2), (".input_scale", input_scale)):
            if not _trivial(np.array([value])):
                sidecars[stem + suffix] = np.array([value], dtype=np.float32)
    for gguf_name, by_expert in experts.items():
        order = sorted(by_expert)
        packed[gguf_name] = (np.stack([by_expert[e][0] for e in order]), "NVFP4")
        stem = gguf_name.removesuffix(".weight")
        for suffix, index in ((".scale", 1), (".input_scale", 2)):
            values = np.array([by_expert[e][index] for e in order], dtype=np.float32)
            if not _trivial(values):
                sidecars[stem + suffix] = values
    return packed, sidecars


def _q_k_heads(config: Any) -> dict[str, int]:
    return {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}


def write_modelopt_gguf(
    checkpoint: Path, path: Path, work: Path, **write: Any
) -> tuple[list[Path], Any]:
    """The GGUF llama.cpp's converter writes from a ModelOpt checkpoint directory (--outtype
    f32), and the transformers model holding its dequantized weights (used for the converter's
    float tensors and the metadata). `write`: more write_gguf arguments (a tokenizer)."""
    model = mf.dense_reference(checkpoint, work / "dense")
    packed, sidecars = nvfp4_tensors(mf.read_tensors(checkpoint), _q_k_heads(model.config))
    files = write_gguf(
        path, model, "nemotron_h_moe", {}, packed=packed, extra_tensors=sidecars, **write
    )
    return files, model


def quantized_nvfp4(weight: np.ndarray, unit_scale: bool = False) -> tuple[np.ndarray, np.float32]:
    """A float weight [N, K] as ModelOpt quantizes it, repacked: (ggml rows, weight_scale_2).

    unit_scale: block scales alone (weight_scale_2 = 1), as llama-quantize writes NVFP4."""
    weight = np.asarray(weight, np.float32)
    if unit_scale:
        # quantize_nvfp4 sets scale_2 = amax / (6 * 448): one extra row of amax 6 * 448 makes
        # it exactly 1 without changing the other rows' blocks; the row is dropped again
        top = np.full((1, weight.shape[1]), mf.FP4_MAX * mf.E4M3_MAX, np.float32)
        parts = mf.quantize_nvfp4(np.concatenate([weight, top]))
        assert float(parts["weight_scale_2"]) == 1.0
        return nvfp4_blocks(parts["weight"][:-1], parts["weight_scale"][:-1]), np.float32(1.0)
    parts = mf.quantize_nvfp4(weight)
    return nvfp4_blocks(parts["weight"], parts["weight_scale"]), np.float32(parts["weight_scale_2"])


# The mix: IQ2_XXS routed experts, Q8_0 Mamba and attention projections, NVFP4 shared
# experts and latent projections (and the output matrix) with their `.scale`, F16 embeddings,
# F32 norms (forced for every norm and 1-D tensor).
MIXED_TYPES = {
    r"ffn_(up|down)_exps\.": "IQ2_XXS",
    r"ssm_(in|out)\.": "Q8_0",
    r"attn_(q|k|v|output)\.": "Q8_0",
    r"^token_embd\.": "F16",
}
MIXED_NVFP4 = re.compile(r"(ffn_(up|down)_shexp|ffn_latent_(up|down))\.weight$|^output\.weight$")


def write_mixed_gguf(
    path: Path, model: Any, *, latent_scales: bool = True, **write: Any
) -> list[Path]:
    """`model` as the mixed file: MIXED_TYPES, and NVFP4 (ModelOpt-quantized, scale sidecars
    far from 1) wherever MIXED_NVFP4 matches. latent_scales=False quantizes the latent
    projections without one (llama.cpp's loader refuses latent scales). `write`: more
    write_gguf arguments (a tokenizer)."""
    from gguf_fixtures import converter_tensors

    arch = "nemotron_h_moe"
    packed, sidecars = {}, {}
    for name, values in converter_tensors(model, arch).items():
        if MIXED_NVFP4.search(name):
            unit = not latent_scales and "ffn_latent_" in name
            rows, scale_2 = quantized_nvfp4(values, unit_scale=unit)
            packed[name] = (rows, "NVFP4")
            if not unit:
                stem = name.removesuffix(".weight")
                sidecars[stem + ".scale"] = np.array([scale_2], np.float32)
    return write_gguf(
        path, model, arch, MIXED_TYPES, packed=packed, extra_tensors=sidecars, **write
    )
