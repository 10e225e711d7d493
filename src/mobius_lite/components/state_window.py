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
- SSM: the state after each position from one-position calls of the recurrence kernel a
  plain step makes, in a Loop over the call's positions (ssm_window_by_steps), so that a
  slot equals the state plain decoding leaves bit for bit. A closed form over the call
  (S_j = exp(sum g) S_0 + sum_i exp(segment sums) k_i v_i^T, one batched MatMul) was the
  first design: 3-6e-11 from the steps' states on the mid int8 package, enough that an
  int8-activation decoder rewound to a prefix could in principle continue otherwise than
  plain decoding; the steps cost about 3% more on a 4-position verifying call there.

The kernel route (`kernel_past` / `kernel_presents`, CUDA only, opt-in) asks onnxruntime's
com.microsoft ops for the windows instead (their `state_window` attribute): the past state is
given W slots (only the last is read), the present is the last slot, and the window is the
last min(T, W) slots, which for T <= W are the call's T positions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT, cast_to, loop_body

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


# (op, query, key, value, decay: one position each [B, 1, ...], state [B, H, N, P]) -> the
# state after that position, as the call's own recurrence kernel computes it
RecurrenceStep = Callable[[OpBuilder, ir.Value, ir.Value, ir.Value, ir.Value, ir.Value], ir.Value]


def ssm_window_by_steps(
    op: OpBuilder,
    past: ir.Value,
    operands: tuple[ir.Value, ir.Value, ir.Value, ir.Value],
    step: RecurrenceStep,
    state_shape: tuple[int, int, int],
) -> ir.Value:
    """past [B, H, N, P] FP32; operands (query, key, value, decay) [B, T, ...] in the
    recurrence kernel's layout -> [T, B, H, N, P]: the SSM state after each position, each
    made by one one-position call of the kernel a plain step makes. So a slot equals the
    state a plain step leaves bit for bit, which the closed form (ssm_window) does not
    (3e-11 apart on the mid int8 package), and an int8-activation decoder continues from a
    rewound prefix exactly as plain decoding does."""
    length = op.Squeeze(op.Shape(operands[0], start=1, end=2), _ints(op, 0))
    axis = _ints(op, 1)

    def iteration(op: OpBuilder, position: ir.Value, cond: ir.Value, state: ir.Value):
        start = op.Unsqueeze(position, _ints(op, 0))
        end = op.Add(start, _ints(op, 1))
        one = [op.Slice(value, start, end, axis) for value in operands]
        after = step(op, *one, state)
        return op.Identity(cond), after, op.Identity(after)

    heads, state_size, head_dim = state_shape
    shape = ir.Shape(["batch", heads, state_size, head_dim])
    body = loop_body(
        op, iteration, [("state", FLOAT, shape)], [("state_slot", FLOAT, shape)], "ssm_steps"
    )
    true = op.Constant(value=ir.tensor(True, dtype=ir.DataType.BOOL))
    _, slots = op.Loop(length, true, past, body=body, _outputs=2)
    slots.type = ir.TensorType(FLOAT)
    slots.shape = ir.Shape(["window", "batch", heads, state_size, head_dim])
    return slots


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
