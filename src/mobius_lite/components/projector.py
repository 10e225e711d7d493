"""Omni's vision-to-text bridge: pixel shuffle (space-to-depth by 1/downsample_ratio) and the
multi-modal projector (RMSNorm -> Linear -> ReLU^2 -> Linear)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import relu_squared
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.components.norms import RMSNorm

INT64 = ir.DataType.INT64


def pixel_shuffle_order(op: OpBuilder, height: ir.Value, width: ir.Value, factor: int) -> ir.Value:
    """Row-major patch indices in the order the reference's pixel_shuffle reads them -> int64
    [height * width].

    Output token (i, j) of a (height/f, width/f) grid concatenates, channel block by block, the
    patches at (f*i + a, f*j + b) for a, then b, in 0..f-1; so gathering rows in this order and
    reshaping to [-1, f*f*hidden] is the shuffle. height, width: int64 [1], multiples of f.
    """
    zero = op.Constant(value=ir.tensor(0, dtype=INT64))
    one = op.Constant(value=ir.tensor(1, dtype=INT64))
    f = op.Constant(value_ints=[factor])

    def axis(count: ir.Value, position: int) -> ir.Value:
        shape = [1, 1, 1, 1]
        shape[position] = -1
        steps = op.Range(zero, op.Squeeze(count, op.Constant(value_ints=[0])), one)
        return op.Reshape(steps, op.Constant(value_ints=shape))

    rows = op.Mul(axis(op.Div(height, f), 0), op.Mul(f, width))
    cols = op.Mul(axis(op.Div(width, f), 1), f)
    sub_rows = op.Mul(axis(f, 2), width)
    sub_cols = axis(f, 3)
    order = op.Add(op.Add(rows, cols), op.Add(sub_rows, sub_cols))
    return op.Reshape(order, op.Constant(value_ints=[-1]))


def pixel_shuffle(op: OpBuilder, rows: ir.Value, order: ir.Value, factor: int) -> ir.Value:
    """Gather `rows` [n, hidden] in `order` and fold each f*f group -> [n / f^2, f^2 * hidden]."""
    hidden = op.Shape(rows, start=1, end=2)
    gathered = op.Gather(rows, order, axis=0)
    return op.Reshape(
        gathered,
        op.Concat(
            op.Constant(value_ints=[-1]),
            op.Mul(hidden, op.Constant(value_ints=[factor * factor])),
            axis=0,
        ),
    )


class MultiModalProjector(nn.Module):
    """NemotronH_Omni multi_modal_projector: layer_norm (RMSNorm), linear_1, relu^2, linear_2."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        output_size: int,
        ctx: BuildContext,
        *,
        bias: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.layer_norm = RMSNorm(input_size, eps, ctx)
        self.linear_1 = Linear(input_size, hidden_size, bias, ctx)
        self.linear_2 = Linear(hidden_size, output_size, bias, ctx)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.linear_2(op, relu_squared(op, self.linear_1(op, self.layer_norm(op, x))))
