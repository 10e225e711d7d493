"""Per-position Mamba states of a short call: what a speculative verifying call returns so
that the runtime can continue from any accepted prefix without a second decoder call.

A call of T positions with 2 <= T <= W (the build's window) also returns, per Mamba layer,
the conv state and the SSM state after each of its T positions, stacked on a leading axis:
conv [T, batch, conv_dim, kernel - 1] and SSM [T, batch, heads, state, head_dim] (slot j:
the state after position j; slot T - 1 equals the present). Any other call (a one-token
step, a prefill longer than W) returns windows with no slot, so plain decoding pays one If
node per layer and nothing else. The layout is onnxruntime's `state_window` one (window
axis first); docs/speculative.md gives the design.

The windows use standard ONNX ops only (any execution provider; onnxruntime 1.32's CPU
kernels refuse `state_window > 0`):
- conv: the state after position j is the last kernel - 1 inputs up to it, a sliding
  window over concat(past_conv, x), gathered;
- SSM: the gated recurrence S_j = exp(g_j) S_{j-1} + k_j v_j^T in closed form over the
  call, S_j = exp(sum_{l<=j} g_l) S_0 + sum_{i<=j} exp(sum_{i<l<=j} g_l) k_i v_i^T, with
  the segment sums taken by a masked CumSum (no difference of long cumulative sums). At
  most W positions: a [T, T] decay matrix and one batched MatMul per layer.

The kernel route (`kernel_past` / `kernel_presents`, CUDA only, opt-in) asks onnxruntime's
com.microsoft ops for the windows instead (their `state_window` attribute): the past state is
given W slots (only the last is read), the present is the last slot, and the window is the
last min(T, W) slots, which for T <= W are the call's T positions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT, cast_to

INT64 = ir.DataType.INT64
# The most positions a verifying call may cover and still get its windows: K drafts + 1.
# onnxruntime's state_window attribute allows at most 8.
DEFAULT_WINDOW = 8


def _ints(op: OpBuilder, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def conv_window(op: OpBuilder, past: ir.Value, x: ir.Value, kernel: int) -> ir.Value:
    """past [B, C, kernel-1], x [B, C, T] (FP32) -> [T, B, C, kernel-1]: the conv carry state
    after each position (the last kernel-1 inputs up to and including it)."""
    joined = op.Concat(past, x, axis=2)  # [B, C, kernel - 1 + T]
    one = op.Constant(value=ir.tensor(1, dtype=INT64))
    length = op.Squeeze(op.Shape(x, start=2, end=3), _ints(op, 0))
    slots = op.Range(one, op.Add(length, one), one)
    taps = op.Constant(value=ir.tensor(np.arange(kernel - 1, dtype=np.int64)))
    # slot j reads joined[..., j + 1 + m] for m < kernel - 1
    index = op.Add(op.Unsqueeze(slots, _ints(op, 1)), op.Unsqueeze(taps, _ints(op, 0)))
    gathered = op.Gather(joined, index, axis=2)  # [B, C, T, kernel - 1]
    return op.Transpose(gathered, perm=[2, 0, 1, 3])


def ssm_window(
    op: OpBuilder,
    past: ir.Value,
    key: ir.Value,
    value: ir.Value,
    decay: ir.Value,
    heads: int,
    state: int,
    head_dim: int,
) -> ir.Value:
    """past [B, H, N, P]; key [B, T, H*N] (dt * B), value [B, T, H*P] (x), decay [B, T, H]
    (dt * A), all FP32 -> [T, B, H, N, P]: the SSM state after each position."""
    k = op.Transpose(op.Reshape(key, _ints(op, 0, 0, heads, state)), perm=[0, 2, 1, 3])
    v = op.Transpose(op.Reshape(value, _ints(op, 0, 0, heads, head_dim)), perm=[0, 2, 1, 3])
    g = op.Transpose(decay, perm=[0, 2, 1])  # [B, H, T]
    length = op.Shape(decay, start=1, end=2)
    positions = op.Range(
        op.Constant(value=ir.tensor(0, dtype=INT64)),
        op.Squeeze(length, _ints(op, 0)),
        op.Constant(value=ir.tensor(1, dtype=INT64)),
    )
    rows = op.Unsqueeze(positions, _ints(op, 1))  # j (or l)
    cols = op.Unsqueeze(positions, _ints(op, 0))  # i
    after = op.Cast(op.Greater(rows, cols), to=FLOAT)  # l > i
    upto = op.Cast(op.GreaterOrEqual(rows, cols), to=FLOAT)  # i <= j
    # segment[j, i] = sum over i < l <= j of g_l: g_l masked to l > i, summed over l <= j
    terms = op.Mul(op.Unsqueeze(g, _ints(op, 3)), after)  # [B, H, T(l), T(i)]
    segment = op.CumSum(terms, op.Constant(value=ir.tensor(2, dtype=INT64)))
    weights = op.Mul(op.Exp(segment), upto)  # [B, H, T(j), T(i)]
    # sum_i weights[j, i] k_i v_i^T: [B, H, T(j), N, T(i)] @ [B, H, 1, T(i), P]
    weighted_keys = op.Mul(op.Unsqueeze(weights, _ints(op, 4)), op.Unsqueeze(k, _ints(op, 2)))
    updates = op.MatMul(
        op.Transpose(weighted_keys, perm=[0, 1, 2, 4, 3]), op.Unsqueeze(v, _ints(op, 2))
    )
    carried = op.Exp(op.CumSum(g, op.Constant(value=ir.tensor(2, dtype=INT64))))  # [B, H, T]
    start = op.Mul(
        op.Unsqueeze(carried, _ints(op, 3, 4)), op.Unsqueeze(past, _ints(op, 2))
    )  # [B, H, T, N, P]
    return op.Transpose(op.Add(start, updates), perm=[2, 0, 1, 3, 4])


def windowed(
    op: OpBuilder,
    sequence: ir.Value,
    window: int,
    then_outputs: list[tuple[str, ir.DataType, tuple[int, ...]]],
    compute,
) -> list[ir.Value]:
    """An If that runs `compute(op) -> values` when 2 <= sequence <= window and otherwise
    returns, for each (name, dtype, state shape without batch) of `then_outputs`, a tensor
    with no slot ([0, 1, *shape]). `sequence`: int64 [1], the call's positions."""
    two = op.Constant(value=ir.tensor(np.array([2], dtype=np.int64)))
    most = op.Constant(value=ir.tensor(np.array([window], dtype=np.int64)))
    short = op.Squeeze(
        op.And(op.GreaterOrEqual(sequence, two), op.LessOrEqual(sequence, most)), _ints(op, 0)
    )

    def out_values() -> list[ir.Value]:
        return [
            ir.Value(
                name=name, type=ir.TensorType(dtype), shape=ir.Shape(["window", "batch", *shape])
            )
            for name, dtype, shape in then_outputs
        ]

    def empty(op: OpBuilder) -> list[ir.Value]:
        return [
            op.Constant(value=ir.tensor(np.zeros((0, 1, *shape), dtype=dtype.numpy())))
            for _, dtype, shape in then_outputs
        ]

    def computed(op: OpBuilder) -> list[ir.Value]:
        return [
            cast_to(op, value, dtype)
            for value, (_, dtype, _) in zip(compute(op), then_outputs, strict=True)
        ]

    then_branch = op.builder.subgraph(computed, inputs=[], outputs=out_values(), name="window")
    else_branch = op.builder.subgraph(empty, inputs=[], outputs=out_values(), name="no_window")
    results = op.If(
        short, then_branch=then_branch, else_branch=else_branch, _outputs=len(then_outputs)
    )
    for value, (_, dtype, shape) in zip(results, then_outputs, strict=True):
        value.type = ir.TensorType(dtype)
        value.shape = ir.Shape(["window", "batch", *shape])
    return list(results)


def kernel_past(op: OpBuilder, past: ir.Value, window: int) -> ir.Value:
    """A state [B, ...] as the `state_window` ops' past [W, B, ...] (they read slot W - 1);
    `past` itself when window is 0."""
    if not window:
        return past
    rank = len(past.shape) if past.shape is not None else 4
    return op.Expand(op.Unsqueeze(past, _ints(op, 0)), _ints(op, window, *[1] * rank))


def kernel_presents(
    op: OpBuilder, states: ir.Value, sequence: ir.Value, window: int
) -> tuple[ir.Value, ir.Value | None]:
    """A `state_window` op's present [W, B, ...] -> (the state after the call [B, ...], the
    window: its last min(T, W) slots); (states, None) when window is 0."""
    if not window:
        return states, None
    last = op.Squeeze(
        op.Slice(states, _ints(op, window - 1), _ints(op, window), _ints(op, 0)), _ints(op, 0)
    )
    start = op.Sub(_ints(op, window), op.Min(sequence, _ints(op, window)))
    return last, op.Slice(states, start, _ints(op, window), _ints(op, 0))
