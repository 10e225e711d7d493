"""The embedding graph: input_ids -> inputs_embeds, over the decoder's own embedding table.

A runtime that feeds a decoder built with inputs_embeds=True chains this graph before it (the
Omni package scatters media features into these embeddings). The table is the same source
tensor as the decoder's: a package holding both declares it shared and writes it once.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common.naming import NameFixPass
from onnxscript import GraphBuilder, OpBuilder, nn

from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Embedding
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import Precision
from mobius_lite.graphs.cache import BATCH
from mobius_lite.graphs.decoder import IR_VERSION, OPSET, graph_value


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

    def forward(self, op: OpBuilder, input_ids: ir.Value) -> ir.Value:
        return self.backbone(op, input_ids)


def build_embedding_graph(
    config: NemotronHConfig, precision: Precision | str = Precision.F32
) -> ir.Model:
    """input_ids int64 [batch, sequence] -> inputs_embeds [batch, sequence, hidden]."""
    precision = Precision.parse(precision)
    module = _EmbeddingModel(config, BuildContext(precision.ir_dtype))
    ids = graph_value("input_ids", ir.DataType.INT64, (BATCH, "sequence"))
    graph = ir.Graph(
        inputs=[ids], outputs=[], nodes=[], opset_imports={"": OPSET}, name="embedding"
    )
    embeds = module(GraphBuilder(graph).op, ids)
    embeds.name = "inputs_embeds"
    embeds.type = ir.TensorType(precision.ir_dtype)
    embeds.shape = ir.Shape([BATCH, "sequence", config.hidden_size])
    graph.outputs.append(embeds)
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="mobius_lite")
    NameFixPass()(model)
    return model
