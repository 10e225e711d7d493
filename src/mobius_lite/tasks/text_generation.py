"""text-generation: the Nemotron-H decoder graph (input_ids -> logits + cache)."""

from __future__ import annotations

from mobius_lite.components.context import Backend
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphRole, Precision
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.models.nemotron_h_names import (
    logits_from_embeddings,
    source_layout,
    unused_tensor_rules,
)
from mobius_lite.package import GraphRecord
from mobius_lite.routes import check_source_dtypes
from mobius_lite.sources.base import TensorSource
from mobius_lite.weights.binding import (
    bind_model,
    graph_parameters,
    plan_bindings,
    source_weight_formats,
)

TEXT_GENERATION = "text-generation"


def text_generation_graphs(
    config: NemotronHConfig,
    source: TensorSource,
    kind: str,
    precision: Precision,
    backend: Backend = Backend.STANDARD,
    dequantize: bool = False,
    unused_rules: dict[str, str] | None = None,
) -> tuple[list[GraphRecord], dict[str, list[str]]]:
    """The decoder, every parameter bound (lazily) to `source`; no tensor is shared.

    Packed source tensors keep their format (their storage proposes it) and compute with
    it on `backend`; `dequantize` makes every weight dense in `precision` instead.
    `unused_rules` adds the source kind's deliberately unused tensors (name regex -> reason).
    """
    layout = source_layout(kind, source)
    formats = (
        None
        if dequantize
        else source_weight_formats(source, layout.names, precision.ir_dtype, backend)
    )
    decoder, _ = build_decoder(
        config,
        precision,
        logits_from_embeddings=logits_from_embeddings(config, layout.lm_head_present(source)),
        weight_formats=formats,
        backend=backend,
        mamba_a=layout.mamba_a,
    )
    plan = plan_bindings(
        graph_parameters(decoder),
        source,
        layout.names,
        {**unused_tensor_rules(config), **(unused_rules or {})},
    )
    check_source_dtypes(plan.bindings)
    bind_model(decoder, plan, source)
    return [GraphRecord(GraphRole.DECODER, decoder, plan)], {}
