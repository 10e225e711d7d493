"""Nemotron-H's checkpoint names: how safetensors checkpoints name the graph's parameters, and
which of their tensors the decoder deliberately does not use.

Parameter names are the released checkpoint names (`backbone.` prefix). The one rename table:
- prefix: a source may use `model.` instead of `backbone.` (transformers in memory, Puzzle,
  Nemotron 3.5 Lightning), and may hold the head's `mtp.` tensors under `model.mtp.`;
- stacked experts: the graph's `...experts.up_proj` / `...experts.down_proj` ([E, out, in])
  come from a tensor of that name or from the released per-expert tensors
  `...experts.{e}.up_proj.weight`, stacked in expert order.
- ModelOpt under `--dequantize` (`ModelOptDequantizedNames`): a weight slot's output scale
  (`<slot>_output_scale`, formats/weight.py) is its FP8 module's per-tensor `weight_scale`
  (per expert, stacked), the name its packed FP8 format binds as `<slot>_scale`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from mobius_lite.configs import NemotronHConfig
from mobius_lite.errors import ConfigError
from mobius_lite.formats.modelopt.weight import SCALE
from mobius_lite.formats.weight import OUTPUT_SCALE
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import Candidate, NameMap, SourceRef, as_ref

GRAPH_PREFIX = "backbone."
SOURCE_PREFIXES = ("backbone.", "model.")
EMBEDDING_WEIGHT = "backbone.embeddings.weight"
LM_HEAD_WEIGHT = "lm_head.weight"
# A stacked expert parameter of the graph: <prefix>.experts.{up_proj,down_proj}, plus the
# companions a packed weight format adds beside it (e.g. up_proj_scale for NVFP4 scales).
STACKED_EXPERTS = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<proj>up_proj|down_proj)(?P<suffix>_[a-z0-9_]+)?$"
)
MTP_PREFIX = "mtp."
MTP_TENSORS = r"^(model\.)?mtp\."
# The head's block index in a source name (mtp.layers.{i}. or model.mtp.layers.{i}.)
MTP_BLOCK = re.compile(r"^(?:model\.)?mtp\.layers\.(\d+)\.")
# The head's fusion projection: a source holds the MTP head when it holds this tensor.
MTP_FUSION_WEIGHT = "mtp.layers.0.eh_proj.weight"


def source_candidates(name: str) -> list[str]:
    """The names a source may give a `backbone.`- or `mtp.`-prefixed graph name (others:
    unchanged)."""
    if name.startswith(GRAPH_PREFIX):
        rest = name[len(GRAPH_PREFIX) :]
        return [p + rest for p in SOURCE_PREFIXES]
    if name.startswith(MTP_PREFIX):
        return [name, "model." + name]
    return [name]


def mtp_blocks_in(source: TensorSource) -> list[int]:
    """The head's block indices the source holds tensors of (mtp.layers.{i}), sorted."""
    return sorted({int(m[1]) for n in source.names() if (m := MTP_BLOCK.match(n))})


def expert_names(prefix: str, proj: str, experts: int, suffix: str = "") -> list[str]:
    """The released per-expert tensor names of one stacked projection (or of its companion
    `weight<suffix>`, e.g. weight_scale), in expert order."""
    return [f"{prefix}.{e}.{proj}.weight{suffix}" for e in range(experts)]


class SafetensorsNames:
    """The NameMap of transformers / released safetensors checkpoints."""

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        out: list[tuple[str, ...]] = [(c,) for c in source_candidates(target)]
        stacked = STACKED_EXPERTS.match(target)
        if stacked:
            for prefix in source_candidates(stacked["prefix"]):
                names = expert_names(prefix, stacked["proj"], shape[0], stacked["suffix"] or "")
                out.append(tuple(names))
        return out


class ModelOptDequantizedNames:
    """The NameMap of a ModelOpt checkpoint exported with `--dequantize`: SafetensorsNames,
    plus each weight slot's `<slot>_output_scale` -> its module's `weight_scale` (stored as []
    or [1]: bound as [1], or [E] for stacked experts). The FP8 weight is then written as its
    exact E4M3 values and the graph multiplies the slot's products by that scale
    (formats/weight.py OutputScaled). Only FP8 modules have such a per-tensor weight_scale
    under --dequantize: NVFP4 checkpoints are refused before (formats/modelopt/storage.py
    dequantize_refusal), and dense modules have none."""

    def __init__(self) -> None:
        self.inner = SafetensorsNames()

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        if not target.endswith(OUTPUT_SCALE):
            return self.inner.alternatives(target, shape)
        scale = target.removesuffix(OUTPUT_SCALE) + SCALE  # the packed FP8 format's weight_scale
        return [
            SourceRef(as_ref(c).names, reshape=True) for c in self.inner.alternatives(scale, shape)
        ]


def check_head_depths(config: NemotronHConfig, source: TensorSource) -> None:
    """The head's weights hold the blocks the config resolves (one depth repeated by every
    chained draft, or num_nextn_predict_layers distinct depths): one ConfigError naming both
    otherwise, from the tensor names alone. A source naming the head otherwise (GGUF's
    nextn block) is left to its name map."""
    held = mtp_blocks_in(source)
    expected = list(range(len(config.mtp_layers)))
    if not held or held == expected:
        return
    per_depth = len(config.mtp_layers_block_type)
    pattern = "".join(k.pattern_char for k in config.mtp_layers_block_type)
    depths, rest = divmod(len(held), per_depth)
    found = f"blocks mtp.layers.{held[0]}-{held[-1]}"
    if not rest and held == list(range(len(held))) and depths > 1:
        found += f": {depths} distinct depths of '{pattern}'"
    raise ConfigError(
        f"the checkpoint's multi-token-prediction head holds {found}, but its config "
        f"(num_nextn_predict_layers={config.num_nextn_predict_layers}, "
        f"mtp_use_repeated_layer={config.mtp_use_repeated_layer}) describes "
        f"{config.mtp_depths} depth(s) of '{pattern}' ({len(expected)} blocks): the weights "
        "and the config must agree (mtp_use_repeated_layer false: num_nextn_predict_layers "
        "distinct depths; otherwise one depth that every chained draft repeats)"
    )


def unused_tensor_rules(config: NemotronHConfig, head_exported: bool = False) -> dict[str, str]:
    """Source tensors that are expected and deliberately not exported, with the reason.

    Only tensors the reference model does not compute with belong here (a tied config's
    lm_head.weight is used by transformers, so it is never "unused"). The MTP head's
    tensors are unused only when the package does not export the head (`head_exported`).
    """
    rules = {}
    if config.num_nextn_predict_layers > 0 and not head_exported:
        rules[MTP_TENSORS] = "multi-token-prediction head: not part of the decoder graph"
    return rules


def logits_from_embeddings(config: NemotronHConfig, lm_head_present: bool) -> bool:
    """Whether the logits weight is the embedding table: only for a tied config whose source
    has no lm_head (transformers computes logits with lm_head.weight whenever it is there,
    whatever tie_word_embeddings says)."""
    return config.tie_word_embeddings and not lm_head_present


@dataclass(frozen=True)
class SourceLayout:
    """How one kind of source names and stores this model's tensors."""

    names: NameMap
    mamba_a: str = "A_log"  # "A" when the source stores A = -exp(A_log) (GGUF)
    # Source tensors this kind of source holds that no graph computes with (name regex ->
    # reason), e.g. a GGUF's copies of the embedding table for the MTP head.
    unused: Mapping[str, str] = field(default_factory=dict)
    # the name map of an export with --dequantize, when it differs (ModelOpt: output scales)
    dequantized_names: NameMap | None = None

    def names_for(self, dequantize: bool) -> NameMap:
        """The name map of an export that keeps packed weights packed, or dequantizes them."""
        if dequantize and self.dequantized_names is not None:
            return self.dequantized_names
        return self.names

    def lm_head_present(self, source: TensorSource) -> bool:
        return self.present(LM_HEAD_WEIGHT, source)

    def mtp_head_present(self, source: TensorSource) -> bool:
        """Whether the source holds the multi-token-prediction head's tensors."""
        return self.present(MTP_FUSION_WEIGHT, source)

    def present(self, target: str, source: TensorSource) -> bool:
        """Whether the source holds graph parameter `target` under one of its names."""
        available = set(source.names())
        return any(
            all(n in available for n in as_ref(c).names)
            for c in self.names.alternatives(target, ())
        )


def safetensors_source_layout(source: TensorSource) -> SourceLayout:
    """How safetensors checkpoints (and state dicts) name and store Nemotron-H's tensors."""
    return SourceLayout(SafetensorsNames())


def modelopt_source_layout(source: TensorSource) -> SourceLayout:
    """How ModelOpt checkpoints name Nemotron-H's tensors: as safetensors checkpoints, with
    the FP8 weight scales as output scales under --dequantize (ModelOptDequantizedNames)."""
    return SourceLayout(SafetensorsNames(), dequantized_names=ModelOptDequantizedNames())


def router_scope(layer: int) -> str:
    """The node-name prefix of layer `layer`'s MoE router in the decoder graph."""
    return f"backbone/layers.{layer}/mixer/gate/"
