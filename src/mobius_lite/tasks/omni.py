"""image-text-to-text: the Nemotron-H Omni package, separate graphs a runtime chains.

vision_encoder (images -> image_features), video_encoder (tubelets -> video_features + the EVS
retention mask), audio_encoder when the checkpoint has an audio tower (log-mel features ->
audio_features), embedding (input_ids + media features -> inputs_embeds) and the decoder
(inputs_embeds -> logits + cache; Puzzle when the text config is Puzzle), and the MTP draft
head (mtp.onnx) when the language model holds one. One checkpoint feeds
them all: each source tensor is bound in the graphs that compute with it; the tensors two
graphs use (the towers of the image and video graphs; the embedding table when the decoder's
logits are tied to it) are declared shared and written once.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from mobius_lite.components.context import BuildContext
from mobius_lite.configs.omni import OmniConfig
from mobius_lite.enums import GraphId, GraphRole, Task
from mobius_lite.formats.parts import parameter_parts
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.graphs.embedding import build_embedding_graph
from mobius_lite.graphs.mtp import build_head_graphs
from mobius_lite.graphs.omni import build_audio_graph, build_video_graph, build_vision_graph
from mobius_lite.io_contract import AUDIO_FEATURES, IMAGE_FEATURES
from mobius_lite.models.nemotron_h_names import (
    SourceLayout,
    logits_from_embeddings,
    unused_tensor_rules,
)
from mobius_lite.models.omni_names import (
    OMNI_UNUSED,
    OmniTowerNames,
    language_model_layout,
    language_model_rules,
)
from mobius_lite.package import GraphRecord
from mobius_lite.routes import check_source_dtypes
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import NameMap
from mobius_lite.tasks.options import ExportOptions, TaskGraphs
from mobius_lite.tasks.text_generation import shared_sources
from mobius_lite.weights.binding import (
    bind_model,
    graph_parameters,
    plan_bindings,
)

IMAGE_TEXT_TO_TEXT = Task.IMAGE_TEXT_TO_TEXT.value


def _bind(
    graph: GraphRole | GraphId,
    model: ir.Model,
    source: TensorSource,
    names: NameMap,
    rules: dict[str, str],
    hint: str,
) -> GraphRecord:
    parts = parameter_parts(model)
    plan = plan_bindings(
        graph_parameters(model), source, names, rules, parts=parts, account_for_all=False, hint=hint
    )
    check_source_dtypes(plan.bindings)
    bind_model(model, plan, source)
    graph_id = graph if isinstance(graph, GraphId) else GraphId(graph)
    return GraphRecord(graph_id.role, model, plan, graph_id.depth)


def omni_graphs(
    config: OmniConfig,
    source: TensorSource,
    layout: SourceLayout,
    options: ExportOptions | None = None,
) -> TaskGraphs:
    """Every graph of the Omni package, bound (lazily) to `source`: a safetensors checkpoint in
    the released or the transformers layout, dense or ModelOpt (tested). The language model's
    tensors are named and stored as `layout` (the source kind's layout of a Nemotron-H
    checkpoint) says, under `language_model.`: packed weights stay packed and compute on the
    decoder's routes as in a text package. The towers and projectors are named by the Omni
    name maps (models/omni_names.py) and bound as stored (the releases keep them dense, so
    they compute in the build's precision); the embedding table is always dense."""
    options = options or ExportOptions()
    text = config.text
    text_layout = language_model_layout(layout)
    names = text_layout.names_for(options.dequantize)
    head = text.has_mtp_head and text_layout.mtp_head_present(source)
    # the text model's own rules name its tensors without the language_model. prefix
    text_rules = language_model_rules(unused_tensor_rules(text, head_exported=head))
    rules = {**OMNI_UNUSED, **text_rules, **text_layout.unused, **options.unused_rules}
    available = set(source.names())

    text_ctx = options.build_context(source, names, text_layout.mamba_a)
    tied = logits_from_embeddings(text, text_layout.lm_head_present(source))
    decoder, _ = build_decoder(
        text,
        text_ctx,
        inputs_embeds=True,
        final_hidden_output=head,
        logits_from_embeddings=tied,
        speculation_window=options.speculation_window(head),
        window_kernel=options.state_window_kernel,
    )
    media = {IMAGE_FEATURES: config.image_token_id}
    if config.has_audio:
        media[AUDIO_FEATURES] = config.audio_token_id
    # the table stays dense in the build's precision (a lookup, no matmul)
    embedding = build_embedding_graph(text, BuildContext.dense(options.precision), media)

    vision = config.vision_tower
    # LayerScale exactly when the checkpoint holds it (see components/radio.py)
    if any(n.endswith(".layer_scale1.lambda1") for n in available):
        vision = dataclasses.replace(
            vision, radio=dataclasses.replace(vision.radio, layer_scale=True)
        )
    audio = config.audio_tower
    tower_names = OmniTowerNames()
    ctx = options.build_context(source, tower_names)
    towers = [
        (GraphRole.VISION_ENCODER, build_vision_graph(vision, ctx)),
        (GraphRole.VIDEO_ENCODER, build_video_graph(vision, ctx)),
    ]
    if audio is not None:
        towers.append((GraphRole.AUDIO_ENCODER, build_audio_graph(audio, ctx)))

    graphs = [
        _bind(GraphRole.DECODER, decoder, source, names, rules, options.binding_hint),
        _bind(GraphRole.EMBEDDING, embedding, source, names, rules, options.binding_hint),
        *(
            _bind(role, model, source, tower_names, rules, options.binding_hint)
            for role, model in towers
        ),
    ]
    if head:
        # the draft head embeds its own input ids with the text table (text tokens only)
        for graph_id, mtp in build_head_graphs(
            text, text_ctx, logits_from_embeddings=tied, draft_head=options.draft_head
        ):
            graphs.append(_bind(graph_id, mtp, source, names, rules, options.binding_hint))
    return TaskGraphs(text, graphs, shared_sources(graphs), config.raw)
