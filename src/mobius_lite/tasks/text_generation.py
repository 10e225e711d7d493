"""text-generation: the Nemotron-H decoder graph (input_ids -> logits + cache)."""

from __future__ import annotations

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphRole, Precision
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.models.nemotron_h_names import (
    SafetensorsNames,
    logits_from_embeddings,
    unused_tensor_rules,
)
from mobius_lite.package import GraphRecord
from mobius_lite.routes import check_source_dtypes
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import bind_model, graph_parameters, plan_bindings

TEXT_GENERATION = "text-generation"


def text_generation_graphs(
    config: NemotronHConfig, source: TensorSource, kind: str, precision: Precision
) -> tuple[list[GraphRecord], dict[str, list[str]]]:
    """The decoder, every parameter bound (lazily) to `source`; no tensor is shared."""
    decoder, _ = build_decoder(
        config, precision, logits_from_embeddings=logits_from_embeddings(config, source.names())
    )
    plan = plan_bindings(
        graph_parameters(decoder), source, SafetensorsNames(), unused_tensor_rules(config)
    )
    check_source_dtypes((b.sources[0], b.source_dtype) for b in plan.bindings)
    bind_model(decoder, plan, source)
    return [GraphRecord(GraphRole.DECODER, decoder, plan)], {}
