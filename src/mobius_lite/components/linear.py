"""Linear and Embedding layers whose weights keep the checkpoint layout ([out, in])."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn


class Linear(nn.Module):
    """y = x W^T (+ b) on 2-D activations; Gemm(transB=1) reads W in its stored [out, in] layout."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: ir.DataType) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter([out_features, in_features], dtype=dtype)
        self.bias = nn.Parameter([out_features], dtype=dtype) if bias else None

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        if self.bias is not None:
            return op.Gemm(x, self.weight, self.bias, transB=1)
        return op.Gemm(x, self.weight, transB=1)


class Embedding(nn.Module):
    """Token embedding table [vocab, hidden]; also the tied lm_head weight."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: ir.DataType) -> None:
        super().__init__()
        self.weight = nn.Parameter([num_embeddings, embedding_dim], dtype=dtype)

    def forward(self, op: OpBuilder, ids: ir.Value) -> ir.Value:
        return op.Gather(self.weight, ids, axis=0)
