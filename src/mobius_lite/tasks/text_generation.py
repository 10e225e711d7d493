"""text-generation: the Nemotron-H decoder graph (input_ids -> logits + cache)."""

from __future__ import annotations

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphRole
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.models.nemotron_h_names import (
    logits_from_embeddings,
    source_layout,
    unused_tensor_rules,
)
from mobius_lite.package import GraphRecord
from mobius_lite.routes import check_source_dtypes
from mobius_lite.sources.base import TensorSource
from mobius_lite.tasks.options import ExportOptions
from mobius_lite.weights.binding import (
    bind_model,
    graph_parameters,
    plan_bindings,
)

TEXT_GENERATION = "text-generation"


def text_generation_graphs(
    config: NemotronHConfig,
    source: TensorSource,
    kind: str,
    options: ExportOptions | None = None,
) -> tuple[list[GraphRecord], dict[str, list[str]]]:
    """The decoder, every parameter bound (lazily) to `source`; no tensor is shared.

    Packed source tensors keep their format (their storage proposes it) and compute with
    it on the options' backend, unless the options say dequantize.
    """
    options = options or ExportOptions()
    layout = source_layout(kind, source)
    decoder, _ = build_decoder(
        config,
        options.precision,
        logits_from_embeddings=logits_from_embeddings(config, layout.lm_head_present(source)),
        weight_formats=options.weight_formats(source, layout.names),
        backend=options.backend,
        mamba_a=layout.mamba_a,
        activations=options.activations,
    )
    plan = plan_bindings(
        graph_parameters(decoder),
        source,
        layout.names,
        {**unused_tensor_rules(config), **options.unused_rules},
    )
    check_source_dtypes(plan.bindings)
    bind_model(decoder, plan, source)
    return [GraphRecord(GraphRole.DECODER, decoder, plan)], {}
