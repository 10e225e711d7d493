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
from collections.abc import Iterable

from mobius_lite.configs import NemotronHConfig

GRAPH_PREFIX = "backbone."
SOURCE_PREFIXES = ("backbone.", "model.")
EMBEDDING_WEIGHT = "backbone.embeddings.weight"
LM_HEAD_WEIGHT = "lm_head.weight"
# A stacked expert parameter of the graph: <prefix>.experts.{up_proj,down_proj}.
STACKED_EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>up_proj|down_proj)$")
MTP_TENSORS = r"^mtp\."


def source_candidates(name: str) -> list[str]:
    """The names a source may give a `backbone.`-prefixed graph name (others: unchanged)."""
    if name.startswith(GRAPH_PREFIX):
        rest = name[len(GRAPH_PREFIX) :]
        return [p + rest for p in SOURCE_PREFIXES]
    return [name]


def expert_names(prefix: str, proj: str, experts: int) -> list[str]:
    """The released per-expert tensor names of one stacked projection, in expert order."""
    return [f"{prefix}.{e}.{proj}.weight" for e in range(experts)]


class SafetensorsNames:
    """The NameMap of transformers / released safetensors checkpoints."""

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = [(c,) for c in source_candidates(target)]
        stacked = STACKED_EXPERTS.match(target)
        if stacked:
            for prefix in source_candidates(stacked["prefix"]):
                out.append(tuple(expert_names(prefix, stacked["proj"], shape[0])))
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


def logits_from_embeddings(config: NemotronHConfig, source_names: Iterable[str]) -> bool:
    """Whether the logits weight is the embedding table: only for a tied config whose source
    has no lm_head.weight (transformers computes logits with lm_head.weight whenever it is
    there, whatever tie_word_embeddings says)."""
    return config.tie_word_embeddings and LM_HEAD_WEIGHT not in set(source_names)


def router_scope(layer: int) -> str:
    """The node-name prefix of layer `layer`'s MoE router in the decoder graph."""
    return f"backbone/layers.{layer}/mixer/gate/"
