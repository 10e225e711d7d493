"""NemotronHMamba2Mixer on opset-27 CausalConvWithState + LinearAttention("gated").

With the ort backend both come from onnxruntime's com.microsoft domain instead: the same
operators with the same inputs and attributes, which onnxruntime 1.32's CPU provider runs as
native kernels (the opset-27 ones run as their function bodies, a Scan over time).

The SSD recurrence h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T, y_t = C_t h_t + D x_t maps onto
LinearAttention's gated rule S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = q_t S_t with
q = C, k = dt * B, v = x, g = dt * A (per head), scale 1. The state layout is therefore
[batch, heads, ssm_state_size, head_dim].
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import FLOAT, Dims, cast_to, to_float32
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.components.norms import GatedGroupRMSNorm
from mobius_lite.components.state_window import (
    kernel_past,
    kernel_presents,
    positions_first,
    recurrence_input_widths,
    windowed,
)
from mobius_lite.configs.layers import MambaSpec
from mobius_lite.enums import Backend, RecurrenceInput, StateRole
from mobius_lite.errors import ConfigError
from mobius_lite.formats.contrib import contrib_op, typed


class Conv1d(nn.Module):
    """Depthwise causal conv weights as stored: weight [conv_dim, 1, kernel], bias [conv_dim]."""

    def __init__(
        self, channels: int, kernel: int, bias: bool, dtype: ir.DataType, contrib: bool
    ) -> None:
        super().__init__()
        self.contrib = contrib
        self.weight = nn.Parameter([channels, 1, kernel], dtype=dtype)
        self.bias = nn.Parameter([channels], dtype=dtype) if bias else None

    def forward(
        self, op: OpBuilder, x: ir.Value, past_state: ir.Value, state_window: int = 0
    ) -> tuple[ir.Value, ir.Value]:
        """x: [batch, channels, time] FP32 -> (silu(conv(x)), last kernel-1 inputs); all FP32.
        state_window > 0 (contrib op only): the states carry a leading window axis."""
        bias = to_float32(op, self.bias) if self.bias is not None else None
        domain = contrib_op(op) if self.contrib else {}
        if state_window:
            domain = {**domain, "state_window": state_window}
        out, state = op.CausalConvWithState(
            x,
            to_float32(op, self.weight),
            bias,
            past_state,
            activation="silu",
            _outputs=2,
            **domain,
        )
        return typed(out, FLOAT), typed(state, FLOAT)


class Mamba2Mixer(nn.Module):
    def __init__(self, spec: MambaSpec, hidden_size: int, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        self.dtype = dtype = ctx.dtype
        s = spec
        # The ort backend takes the contrib twins of the conv and the SSD recurrence.
        self.contrib = ctx.backend is Backend.ORT
        self.in_proj = Linear(hidden_size, s.in_proj_size, s.use_bias, ctx)
        self.conv1d = Conv1d(s.conv_dim, s.conv_kernel, s.use_conv_bias, dtype, self.contrib)
        self.dt_bias = nn.Parameter([s.num_heads], dtype=dtype)
        # transformers stores A_log; GGUF stores A = -exp(A_log), used as stored (no log/exp
        # round trip). The parameter keeps the source's meaning under its own name.
        self.a_stored = ctx.mamba_a == "A"
        if self.a_stored:
            self.A = nn.Parameter([s.num_heads], dtype=dtype)
        else:
            self.A_log = nn.Parameter([s.num_heads], dtype=dtype)
        self.D = nn.Parameter([s.num_heads], dtype=dtype)
        self.norm = GatedGroupRMSNorm(s.intermediate_size, s.n_groups, s.norm_epsilon, ctx)
        self.out_proj = Linear(s.intermediate_size, hidden_size, s.use_bias, ctx)
        # > 0: also return the per-position states of calls of 2..window positions
        self.window = ctx.speculation_window
        # the windows from onnxruntime's state_window attribute (CUDA; components/state_window)
        self.kernel = ctx.speculation_window if ctx.window_kernel else 0
        if self.kernel and not self.contrib:
            raise ConfigError(
                "the state_window kernels are onnxruntime's: they need the ort backend"
            )

    @property
    def ssm_cache_dtype(self) -> ir.DataType:
        return self.spec.ssm_cache_ir_dtype

    def _per_head(self, op: OpBuilder, grouped: ir.Value) -> ir.Value:
        """[rows, groups * state] -> [rows, groups, heads / groups, state]: head h reads group
        h // (H / G), the reference's repeat_interleave."""
        s = self.spec
        g = op.Reshape(grouped, op.Constant(value_ints=[-1, s.n_groups, 1, s.ssm_state_size]))
        rows = op.Shape(grouped, start=0, end=1)
        target = op.Concat(
            rows,
            op.Constant(value_ints=[s.n_groups, s.num_heads // s.n_groups, s.ssm_state_size]),
            axis=0,
        )
        return op.Expand(g, target)

    def forward(
        self,
        op: OpBuilder,
        x: ir.Value,
        dims: Dims,
        token_mask: ir.Value,
        past_conv: ir.Value,
        past_ssm: ir.Value,
    ) -> tuple[ir.Value, ...]:
        """x: [rows, hidden]; token_mask: [rows, 1] (1 real token, 0 padding) in FP32.

        Returns (output [rows, hidden], present conv_state, present recurrent_state, windows):
        with a speculation window, `windows` holds the outputs of a short call that let the
        runtime continue from any prefix of it (components/state_window.py): the recurrence
        inputs at each position by RecurrenceInput, or, from the state_window kernels, each
        state after each position by StateRole; empty without a window.
        """
        s = self.spec
        group_width = s.n_groups * s.ssm_state_size

        # Padding is zeroed before in_proj and after the conv, as the reference does.
        projected = self.in_proj(op, op.Mul(x, cast_to(op, token_mask, x.dtype)))
        gate, xbc, dt = op.Split(
            projected,
            op.Constant(value_ints=[s.intermediate_size, s.conv_dim, s.num_heads]),
            axis=1,
            _outputs=3,
        )

        # Causal depthwise conv with SiLU, in FP32 (bias add and SiLU stay FP32 in the source).
        xbc_channels_first = op.Transpose(
            op.Reshape(to_float32(op, xbc), dims.shape(op, s.conv_dim)), perm=[0, 2, 1]
        )
        conv_out, present_conv, conv_slots = self._conv(op, dims, xbc_channels_first, past_conv)
        conv_rows = op.Reshape(
            op.Transpose(conv_out, perm=[0, 2, 1]), op.Constant(value_ints=[-1, s.conv_dim])
        )
        conv_rows = op.Mul(conv_rows, token_mask)
        hidden, b, c = op.Split(
            conv_rows,
            op.Constant(value_ints=[s.intermediate_size, group_width, group_width]),
            axis=1,
            _outputs=3,
        )

        dt = self._time_step(op, dt)
        a = to_float32(op, self.A) if self.a_stored else op.Neg(op.Exp(to_float32(op, self.A_log)))
        query, key, value, decay = self._ssd_operands(op, dims, hidden, b, c, dt, a)
        y, present_ssm, ssm_slots = self._recurrence(op, dims, query, key, value, decay, past_ssm)
        y = self._skip(op, y, hidden)

        normed = self.norm(op, y, gate)
        out = self.out_proj(op, cast_to(op, normed, self.dtype))
        if not self.window:
            return out, present_conv, present_ssm, {}
        if self.kernel:
            windows = {
                StateRole.CONV: cast_to(op, conv_slots, past_conv.dtype),
                StateRole.RECURRENT: cast_to(op, ssm_slots, past_ssm.dtype),
            }
            return out, present_conv, present_ssm, windows
        inputs = self._window_inputs(
            op, dims, past_conv.dtype, xbc_channels_first, (key, value, decay)
        )
        return out, present_conv, present_ssm, inputs

    def _time_step(self, op: OpBuilder, dt: ir.Value) -> ir.Value:
        """dt = clamp(softplus(dt + dt_bias), time_step_limit), FP32, [rows, heads]."""
        dt = op.Softplus(op.Add(to_float32(op, dt), to_float32(op, self.dt_bias)))
        low, high = self.spec.time_step_limit
        if low > 0.0 or not math.isinf(high):
            dt = op.Clip(
                dt,
                op.Constant(value=ir.tensor(low, dtype=FLOAT)),
                op.Constant(value=ir.tensor(min(high, 3.0e38), dtype=FLOAT)),
            )
        return dt

    def _ssd_operands(
        self,
        op: OpBuilder,
        dims: Dims,
        hidden: ir.Value,
        b: ir.Value,
        c: ir.Value,
        dt: ir.Value,
        a: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
        """The SSD recurrence's (query, key, value, decay) in LinearAttention's layout: C per
        head, B * dt per head, x per head, dt * A."""
        s = self.spec
        heads, state, head_dim = s.num_heads, s.ssm_state_size, s.head_dim
        b_heads = self._per_head(op, b)  # [rows, G, H/G, N]
        c_heads = self._per_head(op, c)
        dt_heads = op.Reshape(dt, op.Constant(value_ints=[-1, s.n_groups, heads // s.n_groups, 1]))
        key = op.Reshape(op.Mul(b_heads, dt_heads), dims.shape(op, heads * state))
        query = op.Reshape(c_heads, dims.shape(op, heads * state))
        value = op.Reshape(hidden, dims.shape(op, heads * head_dim))
        decay = op.Reshape(op.Mul(dt, a), dims.shape(op, heads))
        return query, key, value, decay

    def _skip(self, op: OpBuilder, y: ir.Value, hidden: ir.Value) -> ir.Value:
        """y + D * x, per head, in FP32: [rows, intermediate]."""
        s = self.spec
        heads, head_dim = s.num_heads, s.head_dim
        y = op.Reshape(y, op.Constant(value_ints=[-1, heads, head_dim]))
        skip = op.Mul(
            op.Reshape(hidden, op.Constant(value_ints=[-1, heads, head_dim])),
            op.Unsqueeze(to_float32(op, self.D), op.Constant(value_ints=[1])),
        )
        return op.Reshape(op.Add(y, skip), op.Constant(value_ints=[-1, s.intermediate_size]))

    def _conv(
        self, op: OpBuilder, dims: Dims, x: ir.Value, past_conv: ir.Value
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """The causal conv of x [B, conv_dim, T] FP32: (its output FP32, the present conv
        state in the cache dtype, its window from the state_window kernel or None)."""
        past = kernel_past(op, to_float32(op, past_conv), self.kernel)
        out, state = self.conv1d(op, x, past, self.kernel)
        state, slots = kernel_presents(op, state, dims.sequence, self.kernel)
        return out, cast_to(op, state, past_conv.dtype), slots

    def _recurrence(
        self,
        op: OpBuilder,
        dims: Dims,
        query: ir.Value,
        key: ir.Value,
        value: ir.Value,
        decay: ir.Value,
        past_ssm: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """The SSD recurrence on LinearAttention ("gated"): (y FP32, present SSM state in the
        cache dtype, its window from the state_window kernel or None)."""
        past = kernel_past(op, to_float32(op, past_ssm), self.kernel)
        operands = (query, key, value, decay, past)
        heads = self.spec.num_heads
        y, present_ssm = gated_recurrence(op, *operands, heads, self.contrib, self.kernel)
        present_ssm, slots = kernel_presents(op, present_ssm, dims.sequence, self.kernel)
        return y, cast_to(op, present_ssm, past_ssm.dtype), slots

    def _window_inputs(
        self,
        op: OpBuilder,
        dims: Dims,
        conv_dtype: ir.DataType,
        conv_input: ir.Value,
        operands: tuple[ir.Value, ir.Value, ir.Value],
    ) -> dict[RecurrenceInput, ir.Value]:
        """A short call's recurrence inputs at each position, window axis first
        (components/state_window.py): conv_input [B, conv_dim, T] FP32 (kept in the conv
        cache's dtype, as its state keeps it) and the SSD recurrence's (key, value, decay)
        [B, T, width] FP32."""
        widths = recurrence_input_widths(self.spec, conv_dtype)

        def compute(op: OpBuilder) -> list[ir.Value]:
            conv = op.Transpose(conv_input, perm=[2, 0, 1])  # [T, B, conv_dim]
            return [conv, *(positions_first(op, value) for value in operands)]

        outputs = [(name.value, dtype, (width,)) for name, (dtype, width) in widths.items()]
        values = windowed(op, dims.sequence, self.window, outputs, compute)
        return dict(zip(widths, values, strict=True))


def gated_recurrence(
    op: OpBuilder,
    query: ir.Value,
    key: ir.Value,
    value: ir.Value,
    decay: ir.Value,
    past: ir.Value,
    heads: int,
    contrib: bool,
    state_window: int = 0,
) -> tuple[ir.Value, ir.Value]:
    """The SSD recurrence as one LinearAttention ("gated") call, scale 1: (y, present) FP32.
    query / key [B, T, heads * state], value [B, T, heads * head_dim], decay [B, T, heads],
    past [B, heads, state, head_dim] FP32. `contrib`: onnxruntime's com.microsoft twin. The
    mixer and the runtime's state rewind (graphs/state_rewind.py) both call it, so the two
    run the same kernel."""
    y, present = op.LinearAttention(
        query,
        key,
        value,
        past,
        decay,
        update_rule="gated",
        q_num_heads=heads,
        kv_num_heads=heads,
        scale=1.0,
        _outputs=2,
        **(contrib_op(op) if contrib else {}),
        **({"state_window": state_window} if state_window else {}),
    )
    return typed(y, FLOAT), typed(present, FLOAT)
