"""The embedding graph: input_ids (+ media features) -> inputs_embeds, over the decoder's own
embedding table.

A runtime that feeds a decoder built with inputs_embeds=True chains this graph before it. In
the Omni package each media input (image_features, audio_features: [n, hidden], 0 rows when
there is none) is scattered into the positions of its placeholder token, in row-major order,
as transformers' masked_scatter does. The host checks that a prompt's placeholder count equals
the feature rows before it runs the graph; a generated token equal to a placeholder id (fed
with no features) keeps its own table row, as in transformers' generation steps, which pass
no media after the prompt. The table is the decoder's source tensor too: a package
whose decoder also reads it (tied logits) declares it shared and writes it once.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import GraphBuilder, OpBuilder, nn

from mobius_lite.components.context import BuildContext, apply_weight_formats
from mobius_lite.components.linear import Embedding
from mobius_lite.configs import NemotronHConfig
from mobius_lite.graphs.builder import graph_value, name_output, new_graph, to_model
from mobius_lite.graphs.cache import BATCH
from mobius_lite.io_contract import INPUT_IDS, INPUTS_EMBEDS


class _Backbone(nn.Module):
    """Holds `embeddings` so the parameter is named backbone.embeddings.weight."""

    def __init__(self, config: NemotronHConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.embeddings = Embedding(config.vocab_size, config.hidden_size, ctx)

    def forward(self, op: OpBuilder, input_ids: ir.Value) -> ir.Value:
        return self.embeddings(op, input_ids)


class _EmbeddingModel(nn.Module):
    def __init__(self, config: NemotronHConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.backbone = _Backbone(config, ctx)

    def forward(
        self, op: OpBuilder, input_ids: ir.Value, media: list[tuple[ir.Value, int]]
    ) -> ir.Value:
        embeds = self.backbone(op, input_ids)
        if not media:
            return embeds
        hidden = op.Constant(value_ints=[-1, self.backbone.embeddings.weight.shape[1]])
        flat_ids = op.Reshape(input_ids, op.Constant(value_ints=[-1]))
        flat = op.Reshape(embeds, hidden)
        for features, token in media:
            token_id = op.Constant(value=ir.tensor(token, dtype=ir.DataType.INT64))
            positions = op.Transpose(op.NonZero(op.Equal(flat_ids, token_id)))  # [n, 1]
            # the first `rows` placeholders only: a generated token that equals a placeholder
            # id comes with no features and keeps its table row (the prompt's counts are
            # checked equal by the host)
            rows = op.Shape(features, start=0, end=1)
            positions = op.Slice(positions, op.Constant(value_ints=[0]), rows)
            flat = op.ScatterND(flat, positions, op.CastLike(features, flat))
        return op.Reshape(flat, op.Shape(embeds))


def build_embedding_graph(
    config: NemotronHConfig,
    ctx: BuildContext | None = None,
    media: dict[str, int] | None = None,
) -> ir.Model:
    """input_ids int64 [batch, sequence] (+ one [n, hidden] input per entry of `media`:
    input name -> placeholder token id) -> inputs_embeds [batch, sequence, hidden], in the
    context's precision (default: dense FP32)."""
    ctx = ctx or BuildContext.dense()
    module = _EmbeddingModel(config, ctx)
    apply_weight_formats(module, ctx)
    ids = graph_value(INPUT_IDS, ir.DataType.INT64, (BATCH, "sequence"))
    features = [
        (graph_value(name, ctx.dtype, (f"{name}_rows", config.hidden_size)), token)
        for name, token in (media or {}).items()
    ]
    graph = new_graph("embedding", [ids, *(f for f, _ in features)])
    embeds = module(GraphBuilder(graph).op, ids, features)
    shape = [BATCH, "sequence", config.hidden_size]
    graph.outputs.append(name_output(embeds, INPUTS_EMBEDS, ctx.dtype, shape))
    return to_model(graph)
