"""text-generation: the Nemotron-H decoder graph (input_ids -> logits + cache), and the
multi-token-prediction head's graph (mtp.onnx) when the checkpoint holds the head."""

from __future__ import annotations

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphId, GraphRole, Task
from mobius_lite.formats.parts import parameter_parts
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.graphs.mtp import build_head_graphs
from mobius_lite.models.nemotron_h_names import (
    SourceLayout,
    check_head_depths,
    logits_from_embeddings,
    unused_tensor_rules,
)
from mobius_lite.package import GraphRecord
from mobius_lite.routes import check_source_dtypes
from mobius_lite.sources.base import TensorSource
from mobius_lite.tasks.options import ExportOptions
from mobius_lite.weights.binding import (
    bind_model,
    check_accounted,
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
    the tensors as `layout` says; with the MTP head (a config that declares it and a source
    that holds it) also mtp.onnx (and one graph per further depth of a head of distinct
    depths), which shares the decoder's embedding table and lm_head (declared shared, stored
    once).

    Packed source tensors keep their format (their storage proposes it) and compute with
    it on the options' backend, unless the options say dequantize.
    """
    options = options or ExportOptions()
    head = config.has_mtp_head and layout.mtp_head_present(source)
    if head:
        check_head_depths(config, source)
    tied = logits_from_embeddings(config, layout.lm_head_present(source))
    names = layout.names_for(options.dequantize)
    ctx = options.build_context(source, names, layout.mamba_a)
    rules = {
        **unused_tensor_rules(config, head_exported=head),
        **layout.unused,
        **options.unused_rules,
    }
    decoder, _ = build_decoder(
        config,
        ctx,
        final_hidden_output=head,
        logits_from_embeddings=tied,
        speculation_window=options.speculation_window(head),
        window_kernel=options.state_window_kernel,
    )
    models = [(GraphId(GraphRole.DECODER), decoder)]
    if head:
        models += build_head_graphs(
            config, ctx, logits_from_embeddings=tied, draft_head=options.draft_head
        )
    plans = [
        plan_bindings(
            graph_parameters(model),
            source,
            names,
            rules,
            parts=parameter_parts(model),
            account_for_all=not head,
            hint=options.binding_hint,
        )
        for _, model in models
    ]
    if head:
        check_accounted(plans, source, options.binding_hint)
    records = []
    for (graph_id, model), plan in zip(models, plans, strict=True):
        check_source_dtypes(plan.bindings)
        bind_model(model, plan, source)
        records.append(GraphRecord(graph_id.role, model, plan, graph_id.depth))
    return records, shared_sources(records)


def shared_sources(graphs: list[GraphRecord]) -> dict[str, list[str]]:
    """The source tensors bound in several graphs, with those graphs' manifest keys (the
    declaration the manifest requires for a tensor written once and used twice)."""
    users: dict[str, list[str]] = {}
    for record in graphs:
        for name in sorted(record.plan.bound_sources):
            users.setdefault(name, []).append(record.key)
    return {name: roles for name, roles in users.items() if len(roles) > 1}
