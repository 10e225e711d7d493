"""What a speculative verifying call returns so that the runtime can continue from any
accepted prefix of it without a second decoder call.

A call of T positions with 2 <= T <= W (the build's window) also returns, per Mamba layer,
the recurrence's inputs at each position, window axis first: the conv's input channels
[T, batch, conv_dim] (in the conv cache's dtype) and the SSD recurrence's key, value and
decay [T, batch, width] (FP32), as window_input.{layer}.{input} (enums.RecurrenceInput). Any
other call (a one-token step, a prefill longer than W) returns them with no slot, so plain
decoding pays one If node per layer and nothing else.

From them the runtime re-derives the states after the accepted n + 1 positions
(run/state_rewind.py), and only when a draft was rejected: the conv state is the last
kernel - 1 inputs up to position n (a copy), the SSM state one call of the decoder's own
recurrence kernel over those positions from the call's past state (graphs/state_rewind.py).
onnxruntime's CPU kernel runs that recurrence one position at a time, so the state it leaves
equals the one n + 1 one-position steps leave bit for bit. Two designs came first and were
dropped: every state after every position computed in the graph, by a closed form (3-6e-11
from the steps' states) and then by a Loop of one-position kernel calls (exact): either
wrote T copies of every Mamba state a call, which cost a 4-position verifying call on the
mid f32 model about 6 ms of 33 (docs/speculative.md).

The kernel route (`kernel_past` / `kernel_presents`, CUDA only, opt-in) asks onnxruntime's
com.microsoft ops for each state after each position instead (their `state_window`
attribute), returned as present_window.{layer}.{role}: the past state is given W slots (only
the last is read), the present is the last slot, and the window is the last min(T, W) slots,
which for T <= W are the call's T positions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT, cast_to
from mobius_lite.configs.layers import MambaSpec
from mobius_lite.enums import RecurrenceInput

INT64 = ir.DataType.INT64
# The most positions a verifying call may cover and still get its windows: K drafts + 1.
# onnxruntime's state_window attribute allows at most 8.
DEFAULT_WINDOW = 8


def _ints(op: OpBuilder, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


# The SSD recurrence's window inputs, in the order the runtime's rewind feeds them (the conv
# input is rewound apart, run/state_rewind.py).
SSD_INPUTS = (RecurrenceInput.KEY, RecurrenceInput.VALUE, RecurrenceInput.DECAY)


def ssd_input_widths(heads: int, state_size: int, head_dim: int) -> dict[RecurrenceInput, int]:
    """The width of each SSD window input (FP32), in SSD_INPUTS order: key heads x state,
    value heads x head_dim, decay one per head."""
    widths = (heads * state_size, heads * head_dim, heads)
    return dict(zip(SSD_INPUTS, widths, strict=True))


def recurrence_input_widths(
    spec: MambaSpec, conv_dtype: ir.DataType
) -> dict[RecurrenceInput, tuple[ir.DataType, int]]:
    """Each window input's (dtype, width) for a Mamba layer of `spec`: the conv input in the
    conv cache's dtype, the SSD recurrence's key, value and decay in FP32."""
    ssd = ssd_input_widths(spec.num_heads, spec.ssm_state_size, spec.head_dim)
    return {
        RecurrenceInput.CONV_INPUT: (conv_dtype, spec.conv_dim),
        **{which: (FLOAT, width) for which, width in ssd.items()},
    }


def positions_first(op: OpBuilder, value: ir.Value) -> ir.Value:
    """[batch, T, width] -> [T, batch, width]: a per-position value, window axis first."""
    return op.Transpose(value, perm=[1, 0, 2])


def windowed(
    op: OpBuilder,
    sequence: ir.Value,
    window: int,
    then_outputs: list[tuple[str, ir.DataType, tuple[int, ...]]],
    compute,
) -> list[ir.Value]:
    """An If that runs `compute(op) -> values` when 2 <= sequence <= window and otherwise
    returns, for each (name, dtype, shape without window and batch) of `then_outputs`, a tensor
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
