"""Linear and Embedding layers whose weights keep the checkpoint layout ([out, in]); the
weight's format (dense by default) emits the math."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.context import BuildContext, WeightedModule, matmul_kernel_format
from mobius_lite.formats.weight import WeightFormat


class Linear(WeightedModule):
    """y = x W^T (+ b) on 2-D activations."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ctx: BuildContext) -> None:
        super().__init__(ctx)
        self.in_features = in_features
        self.out_features = out_features
        self.weight_slot("weight", (out_features, in_features))
        self.bias = nn.Parameter([out_features], dtype=ctx.dtype) if bias else None

    def kernel_format(self, attr: str, fmt: WeightFormat) -> WeightFormat:
        return matmul_kernel_format(self.ctx, fmt)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.matmul(op, "weight", x, self.bias)


class Embedding(WeightedModule):
    """Token embedding table [vocab, hidden]; also the logits weight of a tied model."""

    def __init__(self, num_embeddings: int, embedding_dim: int, ctx: BuildContext) -> None:
        super().__init__(ctx)
        self.weight_slot("weight", (num_embeddings, embedding_dim))

    def forward(self, op: OpBuilder, ids: ir.Value) -> ir.Value:
        return self.select(op, "weight", ids)

    def logits(self, op: OpBuilder, hidden: ir.Value) -> ir.Value:
        """hidden [rows, embedding_dim] @ table^T: the tied lm_head (also when the table is
        not otherwise used, as in a decoder that takes inputs_embeds)."""
        for parameter in self._parameters.values():
            parameter._realize(op.builder)  # idempotent; __call__ is not what reaches here
        return self.matmul(op, "weight", hidden)
