"""NemotronHMLP: up_proj -> relu^2 -> down_proj (also the MoE shared expert)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import relu_squared
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear


class ReLU2MLP(nn.Module):
    def __init__(
        self, hidden_size: int, intermediate_size: int, bias: bool, ctx: BuildContext
    ) -> None:
        super().__init__()
        self.up_proj = Linear(hidden_size, intermediate_size, bias, ctx)
        self.down_proj = Linear(intermediate_size, hidden_size, bias, ctx)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.down_proj(op, relu_squared(op, self.up_proj(op, x)))
