"""GGUF tensor names of the Nemotron-H family (nemotron_h, nemotron_h_moe) -> checkpoint names.

llama.cpp's converter (convert_hf_to_gguf.py: NemotronHModel <- GraniteHybridModel <- Mamba2Model,
GraniteMoeModel <- GraniteModel <- LlamaModel) renames every tensor and changes a few of them.
Each change is recorded here as data, so the binding can carry it (graph-side) or undo it:

- ssm_a holds A = -exp(A_log) with shape [H, 1]; the graph computes with A directly, so the
  values are recorded as NEGATED_EXP (not undone) and the shape as a reshape to [H].
- ssm_d [H, 1] -> D [H]; ssm_conv1d [C, K] -> conv1d.weight [C, 1, K];
  ssm_norm [groups, d / groups] -> norm.weight [d]: row-major reshapes, bytes unchanged.
- attn_q / attn_k: GraniteHybridModel sets `undo_permute = True`, so LlamaModel.permute reorders
  the rows of each head although Nemotron-H has no RoPE. With D = head_dim, GGUF row
  h*D + 2*j + s holds checkpoint row h*D + s*D/2 + j (s in {0, 1}, j < D/2), for the n_head
  heads of q and the n_head_kv heads of k. Whole rows move, so packed rows stay byte-exact.
- ffn_up_exps / ffn_down_exps are the per-expert matrices stacked as [E, N, K], which is the
  checkpoint's stacked `...experts.up_proj` / `...experts.down_proj` layout as is.
- dt_bias and e_score_correction_bias are renamed to ssm_dt.bias / exp_probs_b.bias.

`GGUFNames` is the binding's NameMap built from these mappings: graph parameter -> GGUF
tensor, with SourceRef(reshape=True) for the reshapes and a RowPermutation layout (whole rows,
bytes unchanged) undoing the q/k permutation, so the exported K cache is transformers'. It
knows graph parameters and GGUF tensors only: the parameters a weight format re-lays a tensor
into are parts of its slot (formats/parts.py), which binding resolves through the slot's name.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mobius_lite.configs.gguf_metadata import ARCHITECTURES
from mobius_lite.errors import CheckpointError
from mobius_lite.formats.ggml.storage import RowPermutation
from mobius_lite.formats.storage import Conversion
from mobius_lite.formats.weight import OUTPUT_SCALE
from mobius_lite.listing import format_names
from mobius_lite.models.nemotron_h_gguf_scales import output_scales, sidecar_kind
from mobius_lite.models.nemotron_h_names import SourceLayout
from mobius_lite.sources.base import TensorInfo
from mobius_lite.sources.gguf_file import GGUFCheckpoint
from mobius_lite.sources.names import Candidate, SourceRef

CHECKPOINT_PREFIX = "backbone."


class ValueTransform(str, enum.Enum):
    """What the converter did to the values."""

    IDENTITY = "identity"
    NEGATED_EXP = "negated-exp"  # stored A = -exp(A_log); the graph uses A as stored


class LayoutTransform(str, enum.Enum):
    """How the stored layout differs from the checkpoint's."""

    IDENTITY = "identity"
    RESHAPE = "reshape"  # same row-major element order, checkpoint_shape differs
    HEAD_ROW_PERMUTE = "head-row-permute"  # rows reordered per head (see module docstring)


@dataclass(frozen=True)
class GGUFTensorMapping:
    """One GGUF tensor, the checkpoint tensor it is, and how to get from one to the other."""

    gguf_name: str
    checkpoint_name: str
    gguf_shape: tuple[int, ...]  # logical element shape as stored, numpy order
    checkpoint_shape: tuple[int, ...]
    values: ValueTransform = ValueTransform.IDENTITY
    layout: LayoutTransform = LayoutTransform.IDENTITY
    heads: int | None = None  # head count of a HEAD_ROW_PERMUTE tensor

    def row_order(self) -> np.ndarray:
        """Indices such that checkpoint_rows = gguf_rows[row_order()] (identity if unpermuted)."""
        rows = self.gguf_shape[0]
        if self.layout is not LayoutTransform.HEAD_ROW_PERMUTE:
            return np.arange(rows)
        assert self.heads is not None
        return head_row_order(rows, self.heads)


def head_row_order(rows: int, heads: int) -> np.ndarray:
    """Undo LlamaModel.permute: checkpoint row h*D + s*D/2 + j is GGUF row h*D + 2*j + s."""
    if heads <= 0 or rows % heads or (rows // heads) % 2:
        raise CheckpointError(
            f"cannot undo the per-head row permutation of {rows} rows over {heads} heads: "
            "each head needs an even number of rows"
        )
    return np.arange(rows).reshape(heads, rows // heads // 2, 2).swapaxes(1, 2).reshape(-1)


Shape = tuple[int, ...]
_Rule = tuple[str, Callable[[Shape], Shape], ValueTransform, LayoutTransform]


def _same(shape: Shape) -> Shape:
    return shape


def _flatten(shape: Shape) -> Shape:
    return (int(np.prod(shape, dtype=np.int64)),)


def _conv(shape: Shape) -> Shape:
    channels, kernel = shape
    return (channels, 1, kernel)


_IDENT, _RESHAPE, _PERMUTE = (
    LayoutTransform.IDENTITY,
    LayoutTransform.RESHAPE,
    LayoutTransform.HEAD_ROW_PERMUTE,
)
_KEEP, _NEGEXP = ValueTransform.IDENTITY, ValueTransform.NEGATED_EXP

# GGUF name suffix of a block tensor -> (checkpoint suffix under layers.N.,
# checkpoint shape from gguf shape, value transform, layout transform).
BLOCK_RULES: dict[str, _Rule] = {
    "attn_norm.weight": ("norm.weight", _same, _KEEP, _IDENT),
    # Mamba2 mixer
    "ssm_in.weight": ("mixer.in_proj.weight", _same, _KEEP, _IDENT),
    "ssm_conv1d.weight": ("mixer.conv1d.weight", _conv, _KEEP, _RESHAPE),
    "ssm_conv1d.bias": ("mixer.conv1d.bias", _same, _KEEP, _IDENT),
    "ssm_dt.bias": ("mixer.dt_bias", _same, _KEEP, _IDENT),
    "ssm_a": ("mixer.A_log", _flatten, _NEGEXP, _RESHAPE),
    "ssm_d": ("mixer.D", _flatten, _KEEP, _RESHAPE),
    "ssm_norm.weight": ("mixer.norm.weight", _flatten, _KEEP, _RESHAPE),
    "ssm_out.weight": ("mixer.out_proj.weight", _same, _KEEP, _IDENT),
    # attention
    "attn_q.weight": ("mixer.q_proj.weight", _same, _KEEP, _PERMUTE),
    "attn_k.weight": ("mixer.k_proj.weight", _same, _KEEP, _PERMUTE),
    "attn_v.weight": ("mixer.v_proj.weight", _same, _KEEP, _IDENT),
    "attn_output.weight": ("mixer.o_proj.weight", _same, _KEEP, _IDENT),
    # dense MLP (relu2, no gate)
    "ffn_up.weight": ("mixer.up_proj.weight", _same, _KEEP, _IDENT),
    "ffn_down.weight": ("mixer.down_proj.weight", _same, _KEEP, _IDENT),
    # MoE: router, stacked experts, latent projections, shared expert
    "ffn_gate_inp.weight": ("mixer.gate.weight", _same, _KEEP, _IDENT),
    "exp_probs_b.bias": ("mixer.gate.e_score_correction_bias", _same, _KEEP, _IDENT),
    "ffn_up_exps.weight": ("mixer.experts.up_proj", _same, _KEEP, _IDENT),
    "ffn_down_exps.weight": ("mixer.experts.down_proj", _same, _KEEP, _IDENT),
    "ffn_latent_down.weight": ("mixer.fc1_latent_proj.weight", _same, _KEEP, _IDENT),
    "ffn_latent_up.weight": ("mixer.fc2_latent_proj.weight", _same, _KEEP, _IDENT),
    "ffn_up_shexp.weight": ("mixer.shared_experts.up_proj.weight", _same, _KEEP, _IDENT),
    "ffn_down_shexp.weight": ("mixer.shared_experts.down_proj.weight", _same, _KEEP, _IDENT),
}

GLOBAL_RULES: dict[str, str] = {
    "token_embd.weight": CHECKPOINT_PREFIX + "embeddings.weight",
    "output_norm.weight": CHECKPOINT_PREFIX + "norm_f.weight",
    "output.weight": "lm_head.weight",
}

BLOCK_NAME = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<rest>.+)$")

# The multi-token-prediction head, which the converter folds into block n_layer (the last,
# with {arch}.nextn_predict_layers = 1): its own tensors, its attention sub-layer's (the
# decoder's attention names) and its MoE sub-layer's (the decoder's MoE names), as llama.cpp's
# nemotron_h_moe MTP graph (src/models/nemotron-h-moe.cpp) reads them.
HEAD_TENSORS: dict[str, str] = {
    "nextn.eh_proj.weight": "mtp.layers.0.eh_proj.weight",
    "nextn.enorm.weight": "mtp.layers.0.enorm.weight",
    "nextn.hnorm.weight": "mtp.layers.0.hnorm.weight",
    "nextn.shared_head_norm.weight": "mtp.layers.1.final_layernorm.weight",
    "attn_norm.weight": "mtp.layers.0.norm.weight",
    "post_attention_norm.weight": "mtp.layers.1.norm.weight",
}
HEAD_ATTENTION = ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight")
HEAD_MOE = (
    "ffn_gate_inp.weight",
    "exp_probs_b.bias",
    "ffn_up_exps.weight",
    "ffn_down_exps.weight",
    "ffn_latent_down.weight",
    "ffn_latent_up.weight",
    "ffn_up_shexp.weight",
    "ffn_down_shexp.weight",
)
# Copies of token_embd / output the converter may write into the head's block. The head
# computes with the decoder's table and lm_head (vLLM's NemotronHMTP shares them), so these
# are accounted for as unused (HEAD_COPY_RULES) and mapped to no graph parameter.
HEAD_COPIES: dict[str, str] = {
    "nextn.embed_tokens.weight": "mtp.embed_tokens.weight",
    "nextn.shared_head_head.weight": "mtp.shared_head.head.weight",
}
HEAD_COPY_RULES = {
    r"^blk\.\d+\.nextn\.(embed_tokens|shared_head_head)\.weight$": (
        "the converter's copy of token_embd / output for the multi-token-prediction head, "
        "which computes with the decoder's own (as vLLM's NemotronHMTP does)"
    )
}


def head_block(metadata: dict[str, Any]) -> int | None:
    """The index of the block that holds the MTP head, or None when the file has none."""
    arch = metadata.get("general.architecture")
    nextn = int(metadata.get(f"{arch}.nextn_predict_layers", 0) or 0)
    if not nextn:
        return None
    return int(metadata[f"{arch}.block_count"]) - nextn


def head_checkpoint_name(rest: str) -> str | None:
    """The checkpoint name of tensor `blk.{head}.{rest}` of the head's block."""
    if rest in HEAD_TENSORS:
        return HEAD_TENSORS[rest]
    if rest in HEAD_COPIES:
        return HEAD_COPIES[rest]
    if rest in HEAD_ATTENTION:
        return "mtp.layers.0." + BLOCK_RULES[rest][0]
    if rest in HEAD_MOE:
        return "mtp.layers.1." + BLOCK_RULES[rest][0]
    return None


def _head_counts(metadata: dict[str, Any], arch: str, layer: int) -> tuple[int, int]:
    def at(key: str) -> int | None:
        value = metadata.get(f"{arch}.{key}")
        if isinstance(value, list):
            value = value[layer] if layer < len(value) else None
        return None if value is None else int(value)

    n_head, n_head_kv = at("attention.head_count"), at("attention.head_count_kv")
    if not n_head or not n_head_kv:
        raise CheckpointError(
            f"layer {layer} has attention tensors but {arch}.attention.head_count / "
            f"head_count_kv give {n_head} / {n_head_kv} heads there"
        )
    return n_head, n_head_kv


def map_tensor(
    gguf_name: str, gguf_shape: Shape, metadata: dict[str, Any]
) -> GGUFTensorMapping | None:
    """The mapping of one GGUF tensor, or None if the name is not a Nemotron-H tensor."""
    if gguf_name in GLOBAL_RULES:
        return GGUFTensorMapping(gguf_name, GLOBAL_RULES[gguf_name], gguf_shape, gguf_shape)
    match = BLOCK_NAME.match(gguf_name)
    rule = BLOCK_RULES.get(match["rest"]) if match else None
    if match is not None and int(match["layer"]) == head_block(metadata):
        return _map_head_tensor(gguf_name, gguf_shape, metadata, int(match["layer"]), match["rest"])
    if match is None or rule is None:
        return None
    layer = int(match["layer"])
    suffix, to_shape, values, layout = rule
    heads = None
    if layout is LayoutTransform.HEAD_ROW_PERMUTE:
        arch = str(metadata.get("general.architecture"))
        n_head, n_head_kv = _head_counts(metadata, arch, layer)
        heads = n_head if match["rest"].startswith("attn_q") else n_head_kv
    try:
        checkpoint_shape = to_shape(gguf_shape)
    except ValueError:
        raise CheckpointError(
            f"{gguf_name}: stored shape {list(gguf_shape)} is not the converter's layout"
        ) from None
    return GGUFTensorMapping(
        gguf_name,
        f"{CHECKPOINT_PREFIX}layers.{layer}.{suffix}",
        gguf_shape,
        checkpoint_shape,
        values,
        layout,
        heads,
    )


def _map_head_tensor(
    gguf_name: str, gguf_shape: Shape, metadata: dict[str, Any], layer: int, rest: str
) -> GGUFTensorMapping | None:
    """A tensor of the head's block: the decoder's layout rules under the head's names."""
    name = head_checkpoint_name(rest)
    if name is None:
        return None
    _, to_shape, values, layout = BLOCK_RULES.get(rest, ("", _same, _KEEP, _IDENT))
    heads = None
    if layout is LayoutTransform.HEAD_ROW_PERMUTE:
        n_head, n_head_kv = _head_counts(metadata, str(metadata["general.architecture"]), layer)
        heads = n_head if rest.startswith("attn_q") else n_head_kv
    return GGUFTensorMapping(
        gguf_name, name, gguf_shape, to_shape(gguf_shape), values, layout, heads
    )


def nemotron_h_gguf_mapping(checkpoint: GGUFCheckpoint) -> list[GGUFTensorMapping]:
    """Map every tensor of a GGUFCheckpoint but the `.scale` / `.input_scale` sidecars (see
    nemotron_h_gguf_scales); one CheckpointError lists all unknown tensors."""
    metadata = checkpoint.metadata
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"GGUF architecture {arch!r} is not a Nemotron-H architecture "
            f"({', '.join(ARCHITECTURES)})"
        )
    mappings: list[GGUFTensorMapping] = []
    unknown: list[str] = []
    for name in checkpoint.names():
        if sidecar_kind(name):
            continue
        mapping = map_tensor(name, tuple(checkpoint.logical_shape(name)), metadata)
        if mapping is None:
            unknown.append(name)
        else:
            mappings.append(mapping)
    if unknown:
        shown = format_names(unknown)
        raise CheckpointError(
            f"{len(unknown)} GGUF tensor(s) are not Nemotron-H tensors of {arch}: {shown}"
        )
    return mappings


# --------------------------------------------------------------------------- name map
Layout = Callable[[Conversion, TensorInfo], Conversion]


def graph_parameter(mapping: GGUFTensorMapping) -> str:
    """The decoder parameter a GGUF tensor feeds: its checkpoint name, except that stored
    A = -exp(A_log) feeds the graph's `mixer.A` (the mixer computes with A as stored)."""
    if mapping.values is ValueTransform.NEGATED_EXP:
        return mapping.checkpoint_name.removesuffix("A_log") + "A"
    return mapping.checkpoint_name


def row_permutation(heads: int) -> Layout:
    """The layout that undoes LlamaModel.permute: rows reordered inside each head."""

    def layout(conversion: Conversion, info: TensorInfo) -> Conversion:
        rows = info.shape[0]
        order = head_row_order(rows, heads)[: rows // heads]  # the same order in every head
        return RowPermutation(conversion, info.nbytes // rows, tuple(int(i) for i in order))

    return layout


class GGUFNames:
    """The NameMap of a Nemotron-H GGUF: graph parameter -> its GGUF tensor (see module doc);
    a weight's `<parameter>_output_scale` -> its `.scale` tensor (`scales`: weight GGUF name
    -> scale GGUF name)."""

    def __init__(
        self, mappings: list[GGUFTensorMapping], scales: dict[str, str] | None = None
    ) -> None:
        self._by_parameter = {graph_parameter(m): m for m in mappings}
        self._scales = scales or {}

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        if target.endswith(OUTPUT_SCALE):
            weight = self._by_parameter.get(target.removesuffix(OUTPUT_SCALE))
            scale = self._scales.get(weight.gguf_name) if weight is not None else None
            return [] if scale is None else [(scale,)]
        mapping = self._by_parameter.get(target)
        if mapping is None:
            return []
        layout = None
        if mapping.layout is LayoutTransform.HEAD_ROW_PERMUTE:
            assert mapping.heads is not None
            layout = row_permutation(mapping.heads)
        reshape = mapping.layout is LayoutTransform.RESHAPE
        return [SourceRef((mapping.gguf_name,), reshape=reshape, layout=layout)]


def gguf_source_layout(source: GGUFCheckpoint) -> SourceLayout:
    """How a GGUFCheckpoint names and stores Nemotron-H's tensors: its name map (with the
    weights' output scales), A stored as A = -exp(A_log), and the converter's copies of the
    head's shared tables, unused."""
    names = GGUFNames(nemotron_h_gguf_mapping(source), output_scales(source))
    return SourceLayout(names=names, mamba_a="A", unused=HEAD_COPY_RULES)
