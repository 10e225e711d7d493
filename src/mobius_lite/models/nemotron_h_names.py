"""Nemotron-H's checkpoint names: how safetensors checkpoints name the graph's parameters, and
which of their tensors the decoder deliberately does not use.

Parameter names are the released checkpoint names (`backbone.` prefix). The one rename table:
- prefix: a source may use `model.` instead of `backbone.` (transformers in memory, Puzzle);
- stacked experts: the graph's `...experts.up_proj` / `...experts.down_proj` ([E, out, in])
  come from a tensor of that name or from the released per-expert tensors
  `...experts.{e}.up_proj.weight`, stacked in expert order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mobius_lite.configs import NemotronHConfig
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import Candidate, NameMap, as_ref

GRAPH_PREFIX = "backbone."
SOURCE_PREFIXES = ("backbone.", "model.")
EMBEDDING_WEIGHT = "backbone.embeddings.weight"
LM_HEAD_WEIGHT = "lm_head.weight"
# A stacked expert parameter of the graph: <prefix>.experts.{up_proj,down_proj}, plus the
# companions a packed weight format adds beside it (e.g. up_proj_scale for NVFP4 scales).
STACKED_EXPERTS = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<proj>up_proj|down_proj)(?P<suffix>_[a-z0-9_]+)?$"
)
MTP_TENSORS = r"^mtp\."


def source_candidates(name: str) -> list[str]:
    """The names a source may give a `backbone.`-prefixed graph name (others: unchanged)."""
    if name.startswith(GRAPH_PREFIX):
        rest = name[len(GRAPH_PREFIX) :]
        return [p + rest for p in SOURCE_PREFIXES]
    return [name]


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


def unused_tensor_rules(config: NemotronHConfig) -> dict[str, str]:
    """Source tensors that are expected and deliberately not exported, with the reason.

    Only tensors the reference model does not compute with belong here (a tied config's
    lm_head.weight is used by transformers, so it is never "unused").
    """
    rules = {}
    if config.num_nextn_predict_layers > 0:
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

    def lm_head_present(self, source: TensorSource) -> bool:
        available = set(source.names())
        return any(
            all(n in available for n in as_ref(c).names)
            for c in self.names.alternatives(LM_HEAD_WEIGHT, ())
        )


def safetensors_source_layout(source: TensorSource) -> SourceLayout:
    """How safetensors checkpoints (and state dicts) name and store Nemotron-H's tensors."""
    return SourceLayout(SafetensorsNames())


def router_scope(layer: int) -> str:
    """The node-name prefix of layer `layer`'s MoE router in the decoder graph."""
    return f"backbone/layers.{layer}/mixer/gate/"
