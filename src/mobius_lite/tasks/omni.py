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
import re

import onnx_ir as ir

from mobius_lite.components.context import BuildContext
from mobius_lite.configs.omni import OmniConfig
from mobius_lite.enums import GraphRole, Task
from mobius_lite.formats.parts import parameter_parts
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.graphs.embedding import build_embedding_graph
from mobius_lite.graphs.mtp import apply_draft_head, build_mtp
from mobius_lite.graphs.omni import build_audio_graph, build_video_graph, build_vision_graph
from mobius_lite.io_contract import AUDIO_FEATURES, IMAGE_FEATURES
from mobius_lite.models.nemotron_h_names import (
    SourceLayout,
    logits_from_embeddings,
    unused_tensor_rules,
)
from mobius_lite.models.omni_names import (
    LANGUAGE_MODEL,
    OMNI_UNUSED,
    LanguageModelNames,
    OmniTowerNames,
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
    role: GraphRole,
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
    return GraphRecord(role, model, plan)


def omni_graphs(
    config: OmniConfig,
    source: TensorSource,
    options: ExportOptions | None = None,
) -> TaskGraphs:
    """Every graph of the Omni package, bound (lazily) to `source`: a safetensors checkpoint in
    the released or the transformers layout (tested with dense weights). Omni names its
    tensors with its own name maps (models/omni_names.py) whatever the source kind."""
    options = options or ExportOptions()
    text = config.text
    layout = SourceLayout(LanguageModelNames())
    names = layout.names
    head = text.has_mtp_head and layout.mtp_head_present(source)
    # the text model's own rules name its tensors without the language_model. prefix
    text_rules = {
        "^" + re.escape(LANGUAGE_MODEL) + pattern.removeprefix("^"): reason
        for pattern, reason in unused_tensor_rules(text, head_exported=head).items()
    }
    rules = {**OMNI_UNUSED, **text_rules, **options.unused_rules}
    available = set(source.names())

    text_ctx = options.build_context(source, names)
    tied = logits_from_embeddings(text, layout.lm_head_present(source))
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
        mtp, _ = build_mtp(text, text_ctx, logits_from_embeddings=tied)
        apply_draft_head(mtp, options.draft_head)
        graphs.append(_bind(GraphRole.MTP, mtp, source, names, rules, options.binding_hint))
    return TaskGraphs(text, graphs, shared_sources(graphs), config.raw)
