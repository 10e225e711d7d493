"""RMS norms with the source's FP32 compute and cast points."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import FLOAT, cast_to, to_float32
from mobius_lite.components.context import BuildContext


class RMSNorm(nn.Module):
    """NemotronHRMSNorm: (weight.f32 * x.f32 / rms(x.f32)).to(input dtype)."""

    def __init__(self, hidden_size: int, eps: float, ctx: BuildContext) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter([hidden_size], dtype=ctx.dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        # Cast point: the product weight * normalized happens in FP32, then one cast back.
        y = op.RMSNormalization(
            to_float32(op, x), to_float32(op, self.weight), epsilon=self.eps, axis=-1, stash_type=1
        )
        return cast_to(op, y, x.dtype)


class GatedGroupRMSNorm(nn.Module):
    """NemotronHRMSNormGated: y * silu(gate), RMS-normalised per group of channels, times weight.

    Works in FP32 throughout (the reference's prefill path keeps the scan output in FP32 up to
    out_proj); the caller casts the result to the model dtype.
    """

    def __init__(self, hidden_size: int, n_groups: int, eps: float, ctx: BuildContext) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.group_size = hidden_size // n_groups
        self.n_groups = n_groups
        self.eps = eps
        self.weight = nn.Parameter([hidden_size], dtype=ctx.dtype)

    def forward(self, op: OpBuilder, y: ir.Value, gate: ir.Value) -> ir.Value:
        gate32 = to_float32(op, gate)
        gated = op.Mul(to_float32(op, y), op.Mul(gate32, op.Sigmoid(gate32)))
        grouped = op.Reshape(gated, op.Constant(value_ints=[-1, self.n_groups, self.group_size]))
        variance = op.ReduceMean(op.Mul(grouped, grouped), op.Constant(value_ints=[-1]), keepdims=1)
        eps = op.Constant(value=ir.tensor(self.eps, dtype=FLOAT))
        normed = op.Div(grouped, op.Sqrt(op.Add(variance, eps)))
        flat = op.Reshape(normed, op.Constant(value_ints=[-1, self.hidden_size]))
        return op.Mul(flat, to_float32(op, self.weight))
