"""A row-wise subgraph run one row at a time in short calls, so that each row computes exactly
as it does in a one-row call.

onnxruntime's fused expert kernels (QMoE, MoE) sum a row's expert terms in an order that
depends on which experts the call's other rows selected: their CPU kernels spread the call's
active experts over the threads, each thread summing its experts into its own buffer. A
verifying call of K + 1 positions then differs from K + 1 one-position steps by rounding
(3e-8 measured), and int8-activation kernels downstream turn that into whole quantization
steps (1e-2 NRMSE in the logits: benchmarks/investigations/verify_vs_steps.py). The same holds
for the run-time-picked expert paths (one gathered matmul for a few rows, a Loop over experts
for more: different summation orders).

The fused kernels avoid it without a Loop (moe_fused.pairs_apart: every (row, expert) pair a
row of its own, cheaper on a verifying call); `row_by_row` serves the run-time-picked paths.
It wraps such a subgraph in a Loop whose iterations each take one row while the call
is short (at most the window's positions, whatever the batch: a plain step or a verifying
call), and one iteration over all rows otherwise (a prefill, unchanged). The weights stay
outer-scope values of one node, so onnxruntime prepacks them once.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import loop_body

INT64 = ir.DataType.INT64

# (op, *row-sliced inputs) -> the rows' outputs [rows, width]
RowsFn = Callable[..., ir.Value]


def row_by_row(
    op: OpBuilder,
    short: ir.Value,
    body: RowsFn,
    inputs: tuple[ir.Value, ...],
    dtype: ir.DataType,
    width: int,
    name: str,
) -> ir.Value:
    """body(op, *inputs) [rows, width], computed one row per Loop iteration when `short`
    (bool [1]) holds, else in one iteration (module doc). Every input's leading axis is the
    rows."""
    rows = op.Squeeze(op.Shape(inputs[0], start=0, end=1), op.Constant(value_ints=[0]))
    one = op.Constant(value=ir.tensor(1, dtype=INT64))
    short = op.Squeeze(short, op.Constant(value_ints=[0]))
    trips = op.Where(short, rows, one)
    chunk = op.Where(short, one, rows)
    axis = op.Constant(value_ints=[0])

    def iteration(op: OpBuilder, step: ir.Value, cond: ir.Value):
        start = op.Unsqueeze(op.Mul(step, chunk), axis)
        end = op.Add(start, op.Unsqueeze(chunk, axis))
        sliced = [op.Slice(value, start, end, axis) for value in inputs]
        return op.Identity(cond), body(op, *sliced)

    rows_out = ("rows_out", dtype, ir.Shape(["chunk", width]))
    body_graph = loop_body(op, iteration, carried=[], scanned=[rows_out], name=name)
    true = op.Constant(value=ir.tensor(True, dtype=ir.DataType.BOOL))
    stacked = op.Loop(trips, true, body=body_graph)  # [trips, chunk, width]
    out = op.Reshape(stacked, op.Constant(value_ints=[-1, width]))
    out.type = ir.TensorType(dtype)
    out.shape = ir.Shape(["rows", width])
    return out
