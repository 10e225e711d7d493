"""text-generation: the Nemotron-H decoder graph (input_ids -> logits + cache)."""

from __future__ import annotations

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphRole, Task
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.models.nemotron_h_names import (
    SourceLayout,
    logits_from_embeddings,
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

TEXT_GENERATION = Task.TEXT_GENERATION.value


def text_generation_graphs(
    config: NemotronHConfig,
    source: TensorSource,
    layout: SourceLayout,
    options: ExportOptions | None = None,
) -> tuple[list[GraphRecord], dict[str, list[str]]]:
    """The decoder, every parameter bound (lazily) to `source`, whose kind names and stores
    the tensors as `layout` says; no tensor is shared.

    Packed source tensors keep their format (their storage proposes it) and compute with
    it on the options' backend, unless the options say dequantize.
    """
    options = options or ExportOptions()
    decoder, _ = build_decoder(
        config,
        options.build_context(source, layout.names, layout.mamba_a),
        logits_from_embeddings=logits_from_embeddings(config, layout.lm_head_present(source)),
    )
    plan = plan_bindings(
        graph_parameters(decoder),
        source,
        layout.names,
        {**unused_tensor_rules(config), **options.unused_rules},
        hint=options.binding_hint,
    )
    check_source_dtypes(plan.bindings)
    bind_model(decoder, plan, source)
    return [GraphRecord(GraphRole.DECODER, decoder, plan)], {}
