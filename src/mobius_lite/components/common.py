"""Small graph-building helpers shared by the components."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder

FLOAT = ir.DataType.FLOAT


@dataclass(frozen=True)
class Dims:
    """Runtime sizes of the current call as 1-element int64 tensors, computed once per graph.

    Blocks work on flattened activations [batch * sequence, hidden]; mixers that need the
    time axis (Mamba2, attention) reshape with these.
    """

    batch: ir.Value
    sequence: ir.Value

    def shape(self, op: OpBuilder, *tail: int | ir.Value) -> ir.Value:
        """[batch, sequence, *tail] as a shape tensor."""
        parts = [self.batch, self.sequence]
        parts += [t if isinstance(t, ir.Value) else op.Constant(value_ints=[t]) for t in tail]
        return op.Concat(*parts, axis=0)


def to_float32(op: OpBuilder, value: ir.Value) -> ir.Value:
    """Cast to FP32 unless already FP32 (the source's upcast points)."""
    if value.dtype == FLOAT:
        return value
    return op.Cast(value, to=FLOAT)


def cast_to(op: OpBuilder, value: ir.Value, dtype: ir.DataType) -> ir.Value:
    """Cast unless `value` already has `dtype`."""
    if value.dtype == dtype:
        return value
    return op.Cast(value, to=dtype)


def relu_squared(op: OpBuilder, value: ir.Value) -> ir.Value:
    """Nemotron-H's relu2 activation: relu(x) ** 2."""
    r = op.Relu(value)
    return op.Mul(r, r)


# (name, element type, shape) of one value a Loop body carries or scans out
LoopValue = tuple[str, ir.DataType, ir.Shape]


def loop_body(
    op: OpBuilder,
    body: Callable[..., tuple[ir.Value, ...]],
    carried: Sequence[LoopValue],
    scanned: Sequence[LoopValue],
    name: str,
) -> ir.Graph:
    """An ONNX Loop body: body(op, iteration, cond, *carried) returns (cond, *carried,
    *scanned); the iteration number and condition are declared here, the values as given."""
    scalar = ir.Shape([])
    boolean = ir.TensorType(ir.DataType.BOOL)

    def value(name: str, dtype: ir.DataType, shape: ir.Shape) -> ir.Value:
        return ir.Value(name=name, type=ir.TensorType(dtype), shape=shape)

    inputs = [value("iteration", ir.DataType.INT64, scalar)]
    inputs += [ir.Value(name="cond_in", type=boolean, shape=scalar)]
    inputs += [value(f"{n}_in", t, shape) for n, t, shape in carried]
    outputs = [ir.Value(name="cond_out", type=boolean, shape=scalar)]
    outputs += [value(f"{n}_out", t, shape) for n, t, shape in carried]
    outputs += [value(n, t, shape) for n, t, shape in scanned]
    return op.builder.subgraph(body, inputs=inputs, outputs=outputs, name=name)
