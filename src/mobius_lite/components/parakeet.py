"""The Parakeet FastConformer encoder (Nemotron-H Omni's sound tower) as onnxscript modules named
like transformers' ParakeetEncoder, so parameter paths are checkpoint names: subsampling.layers.N
(Conv2d stack, time-masked after every conv) + subsampling.linear, then layers.N conformer blocks
(half feed-forward, relative-position self-attention, convolution module, half feed-forward).

Activations of a padded batch of clips run as [batch, time, ...]; Linear layers see the
flattened rows [batch * time, hidden]. `lengths` are int64 [batch] valid frame counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import FLOAT, cast_to, to_float32
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.components.radio import LayerNorm, ints
from mobius_lite.configs.omni_audio import ParakeetSpec

INT64 = ir.DataType.INT64
BATCH_NORM_EPS = 1e-5  # torch.nn.BatchNorm1d's default; the reference never sets it
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default; the reference never sets it
_LOWEST = {
    ir.DataType.FLOAT: float(np.finfo(np.float32).min),
    ir.DataType.FLOAT16: float(np.finfo(np.float16).min),
    ir.DataType.BFLOAT16: float(ml_dtypes.finfo(ml_dtypes.bfloat16).min),
}


def subsampled_lengths(
    op: OpBuilder, lengths: ir.Value, spec: ParakeetSpec, stages: int | None = None
) -> ir.Value:
    """Frame counts int64 after `stages` (default: all) stride convs: L -> floor((L + 2p - k) /
    s) + 1 each, which in integers is exactly the reference's float formula."""
    k, s = spec.subsampling_kernel_size, spec.subsampling_stride
    shift = op.Constant(value=ir.tensor(2 * ((k - 1) // 2) - k, dtype=INT64))
    stride = op.Constant(value=ir.tensor(s, dtype=INT64))
    one = op.Constant(value=ir.tensor(1, dtype=INT64))
    for _ in range(spec.subsampling_layers if stages is None else stages):
        shifted = op.Add(lengths, shift)
        quotient = op.Div(shifted, stride)  # truncates: one too high for a negative remainder
        rounded_up = op.Cast(op.Greater(op.Mul(quotient, stride), shifted), to=INT64)
        lengths = op.Add(op.Sub(quotient, rounded_up), one)
    return lengths


def time_mask(op: OpBuilder, lengths: ir.Value, steps: ir.Value) -> ir.Value:
    """bool [batch, steps]: position < length. steps: int64 [1]."""
    zero = op.Constant(value=ir.tensor(0, dtype=INT64))
    one = op.Constant(value=ir.tensor(1, dtype=INT64))
    positions = op.Range(zero, op.Squeeze(steps, ints(op, 0)), one)
    return op.Less(op.Unsqueeze(positions, ints(op, 0)), op.Unsqueeze(lengths, ints(op, 1)))


def activation(op: OpBuilder, x: ir.Value, name: str) -> ir.Value:
    """transformers' ACT2FN[name] for the activations Parakeet configs use."""
    if name in ("silu", "swish"):
        return op.Mul(x, op.Sigmoid(x))
    if name == "relu":
        return op.Relu(x)
    return op.Gelu(x, approximate="tanh" if name == "gelu_pytorch_tanh" else "none")


class Conv(nn.Module):
    """torch.nn.Conv1d / Conv2d with symmetric zero padding; weight [out, in / groups, *kernel]."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: tuple[int, ...],
        dtype: ir.DataType,
        *,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.kernel = list(kernel)
        self.stride = stride
        self.padding = padding
        self.groups = groups
        self.weight = nn.Parameter([out_channels, in_channels // groups, *kernel], dtype=dtype)
        self.bias = nn.Parameter([out_channels], dtype=dtype) if bias else None

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        rank = len(self.kernel)
        inputs = [x, self.weight] + ([self.bias] if self.bias is not None else [])
        return op.Conv(
            *inputs,
            kernel_shape=self.kernel,
            strides=[self.stride] * rank,
            pads=[self.padding] * (2 * rank),
            group=self.groups,
        )


class ReLU(nn.Module):
    """The parameterless torch.nn.ReLU entries of subsampling.layers (keeps the indices)."""

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return op.Relu(x)


class ParakeetEncoderSubsamplingConv2D(nn.Module):
    """Conv2d(1 -> C, stride s) + ReLU, then (depthwise stride conv, pointwise conv, ReLU) per
    further stage; after every conv the time steps past each clip's length are zeroed."""

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        c, k, s = spec.subsampling_channels, spec.subsampling_kernel_size, spec.subsampling_stride
        pad = (k - 1) // 2
        dtype = ctx.dtype
        layers: list[nn.Module] = [Conv(1, c, (k, k), dtype, stride=s, padding=pad), ReLU()]
        for _ in range(spec.subsampling_layers - 1):
            layers.append(Conv(c, c, (k, k), dtype, stride=s, padding=pad, groups=c))
            layers.append(Conv(c, c, (1, 1), dtype))
            layers.append(ReLU())
        self.layers = nn.ModuleList(layers)
        self.linear = Linear(c * spec.subsampled_mel_bins, spec.hidden_size, True, ctx)

    def forward(
        self, op: OpBuilder, features: ir.Value, lengths: ir.Value
    ) -> tuple[ir.Value, ir.Value]:
        """features [B, T, mel] -> (rows [B * T', hidden], T' int64 [1])."""
        x = op.Unsqueeze(features, ints(op, 1))  # [B, 1, T, mel]
        steps = None
        for layer in self.layers:
            x = layer(op, x)
            if isinstance(layer, Conv):
                if layer.stride != 1:
                    lengths = subsampled_lengths(op, lengths, self.spec, stages=1)
                steps = op.Shape(x, start=2, end=3)
                keep = op.Unsqueeze(time_mask(op, lengths, steps), ints(op, 1, 3))
                x = op.Mul(x, op.CastLike(keep, x))
        assert steps is not None
        # [B, C, T', F'] -> [B, T', C, F'] -> rows of C * F' features
        rows = op.Reshape(
            op.Transpose(x, perm=[0, 2, 1, 3]),
            ints(op, -1, self.spec.subsampling_channels * self.spec.subsampled_mel_bins),
        )
        return self.linear(op, rows), steps


class ParakeetEncoderRelPositionalEncoding(nn.Module):
    """Sinusoids of the relative positions T-1 .. -(T-1), sin/cos interleaved -> [2T-1, hidden]
    (FP32 math, cast to the model dtype as the reference does)."""

    def __init__(self, spec: ParakeetSpec, dtype: ir.DataType) -> None:
        super().__init__()
        self.dtype = dtype
        exponents = np.arange(0, spec.hidden_size, 2, dtype=np.float32) / spec.hidden_size
        self.inv_freq = (1.0 / (10000.0 ** exponents.astype(np.float64))).astype(np.float32)

    def forward(self, op: OpBuilder, steps: ir.Value) -> ir.Value:
        one = op.Constant(value=ir.tensor(1, dtype=INT64))
        t = op.Squeeze(steps, ints(op, 0))
        positions = op.Range(op.Sub(t, one), op.Neg(t), op.Neg(one))
        freqs = op.Mul(
            op.Unsqueeze(op.Cast(positions, to=FLOAT), ints(op, 1)),
            op.Constant(value=ir.tensor(self.inv_freq)),
        )
        pairs = op.Concat(
            op.Unsqueeze(op.Sin(freqs), ints(op, 2)),
            op.Unsqueeze(op.Cos(freqs), ints(op, 2)),
            axis=2,
        )
        return cast_to(op, op.Reshape(pairs, ints(op, 0, -1)), self.dtype)


@dataclass(frozen=True)
class EncoderDims:
    """Runtime sizes after subsampling (int64 [1]) and the encoder's valid-token mask."""

    batch: ir.Value
    steps: ir.Value
    valid: ir.Value  # bool [B, T']

    def shape(self, op: OpBuilder, *tail: int) -> ir.Value:
        return op.Concat(self.batch, self.steps, ints(op, *tail), axis=0)


class ParakeetEncoderAttention(nn.Module):
    """Transformer-XL relative-position attention: scores = ((q + u) k^T + rel_shift((q + v)
    R^T)) / sqrt(d), the positional term filled with the dtype's lowest value where either the
    query or the key is padding, softmax in FP32."""

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        self.dtype = ctx.dtype
        d, b = spec.hidden_size, spec.attention_bias
        self.q_proj = Linear(d, d, b, ctx)
        self.k_proj = Linear(d, d, b, ctx)
        self.v_proj = Linear(d, d, b, ctx)
        self.o_proj = Linear(d, d, b, ctx)
        self.relative_k_proj = Linear(d, d, False, ctx)
        self.bias_u = nn.Parameter([spec.num_heads, spec.head_dim], dtype=ctx.dtype)
        self.bias_v = nn.Parameter([spec.num_heads, spec.head_dim], dtype=ctx.dtype)

    def _heads(self, op: OpBuilder, rows: ir.Value, dims: EncoderDims) -> ir.Value:
        """[B * T, d] -> [B, H, T, D]."""
        s = self.spec
        return op.Transpose(
            op.Reshape(rows, dims.shape(op, s.num_heads, s.head_dim)), perm=[0, 2, 1, 3]
        )

    def forward(
        self, op: OpBuilder, x: ir.Value, positions: ir.Value, dims: EncoderDims
    ) -> ir.Value:
        s = self.spec
        scale = op.Constant(value=ir.tensor(s.head_dim**-0.5, dtype=self.dtype))
        q = self._heads(op, self.q_proj(op, x), dims)
        k = self._heads(op, self.k_proj(op, x), dims)
        v = self._heads(op, self.v_proj(op, x), dims)
        per_head = ints(op, 1, s.num_heads, 1, s.head_dim)
        q_u = op.Add(q, op.Reshape(self.bias_u, per_head))
        q_v = op.Add(q, op.Reshape(self.bias_v, per_head))
        # relative keys [2T-1, d] -> [H, D, 2T-1]; one copy serves every clip
        rel = op.Transpose(
            op.Reshape(self.relative_k_proj(op, positions), ints(op, -1, s.num_heads, s.head_dim)),
            perm=[1, 2, 0],
        )
        bd = op.Mul(_rel_shift(op, op.MatMul(q_v, rel), dims.steps), scale)
        pair = op.And(
            op.Unsqueeze(dims.valid, ints(op, 1, 3)), op.Unsqueeze(dims.valid, ints(op, 1, 2))
        )
        lowest = op.Constant(value=ir.tensor(_LOWEST[self.dtype], dtype=self.dtype))
        bd = op.Where(pair, bd, lowest)
        scores = op.Add(op.Mul(op.MatMul(q_u, op.Transpose(k, perm=[0, 1, 3, 2])), scale), bd)
        weights = cast_to(op, op.Softmax(to_float32(op, scores), axis=-1), self.dtype)
        y = op.Transpose(op.MatMul(weights, v), perm=[0, 2, 1, 3])
        return self.o_proj(op, op.Reshape(y, ints(op, -1, s.hidden_size)))


def _rel_shift(op: OpBuilder, scores: ir.Value, steps: ir.Value) -> ir.Value:
    """[B, H, T, 2T-1] over positions T-1..-(T-1) -> [B, H, T, T] with [i, j] at position i - j
    (the reference's pad-left / view / drop-first-row shift, then the first T columns)."""
    padded = op.Pad(scores, ints(op, 0, 0, 0, 1, 0, 0, 0, 0))  # [B, H, T, 2T]
    rows = op.Reshape(padded, op.Concat(ints(op, 0, 0, -1), steps, axis=0))  # [B, H, 2T, T]
    dropped = op.Slice(rows, ints(op, 1), ints(op, 2**62), ints(op, 2))  # [B, H, 2T-1, T]
    back = op.Reshape(dropped, op.Concat(ints(op, 0, 0), steps, ints(op, -1), axis=0))
    return op.Slice(back, ints(op, 0), steps, ints(op, 3))


class BatchNorm1d(nn.Module):
    """torch.nn.BatchNorm1d in eval: running statistics, FP32 math, one cast back."""

    def __init__(self, channels: int, ctx: BuildContext) -> None:
        super().__init__()
        self.weight = nn.Parameter([channels], dtype=ctx.dtype)
        self.bias = nn.Parameter([channels], dtype=ctx.dtype)
        self.running_mean = nn.Parameter([channels], dtype=ctx.dtype)
        self.running_var = nn.Parameter([channels], dtype=ctx.dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        y = op.BatchNormalization(
            to_float32(op, x),
            to_float32(op, self.weight),
            to_float32(op, self.bias),
            to_float32(op, self.running_mean),
            to_float32(op, self.running_var),
            epsilon=BATCH_NORM_EPS,
            training_mode=0,
        )
        return cast_to(op, y, x.dtype)


class ParakeetEncoderConvolutionModule(nn.Module):
    """pointwise_conv1 -> GLU -> zero padded steps -> depthwise_conv -> norm (BatchNorm) ->
    activation -> pointwise_conv2, over [B, channels, T]."""

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        d, k, b = spec.hidden_size, spec.conv_kernel_size, spec.convolution_bias
        dtype = ctx.dtype
        self.pointwise_conv1 = Conv(d, 2 * d, (1,), dtype, bias=b)
        self.depthwise_conv = Conv(d, d, (k,), dtype, padding=(k - 1) // 2, groups=d, bias=b)
        self.norm = BatchNorm1d(d, ctx)
        self.pointwise_conv2 = Conv(d, d, (1,), dtype, bias=b)

    def forward(self, op: OpBuilder, x: ir.Value, dims: EncoderDims) -> ir.Value:
        d = self.spec.hidden_size
        channels = op.Transpose(op.Reshape(x, dims.shape(op, d)), perm=[0, 2, 1])
        value, gate = op.Split(
            self.pointwise_conv1(op, channels), num_outputs=2, axis=1, _outputs=2
        )
        glu = op.Mul(value, op.Sigmoid(gate))
        zero = op.CastLike(op.Constant(value=ir.tensor(0.0, dtype=FLOAT)), glu)
        glu = op.Where(op.Unsqueeze(dims.valid, ints(op, 1)), glu, zero)
        y = activation(op, self.norm(op, self.depthwise_conv(op, glu)), self.spec.hidden_act)
        y = self.pointwise_conv2(op, y)
        return op.Reshape(op.Transpose(y, perm=[0, 2, 1]), ints(op, -1, d))


class ParakeetEncoderFeedForward(nn.Module):
    """linear1 -> activation -> linear2."""

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.act = spec.hidden_act
        d, i, b = spec.hidden_size, spec.intermediate_size, spec.attention_bias
        self.linear1 = Linear(d, i, b, ctx)
        self.linear2 = Linear(i, d, b, ctx)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.linear2(op, activation(op, self.linear1(op, x), self.act))


class ParakeetEncoderBlock(nn.Module):
    """Macaron conformer block: x + ff1 / 2, + attention, + conv, + ff2 / 2, then norm_out (each
    branch on its own pre-norm)."""

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        d = spec.hidden_size
        self.feed_forward1 = ParakeetEncoderFeedForward(spec, ctx)
        self.self_attn = ParakeetEncoderAttention(spec, ctx)
        self.conv = ParakeetEncoderConvolutionModule(spec, ctx)
        self.feed_forward2 = ParakeetEncoderFeedForward(spec, ctx)
        self.norm_feed_forward1 = LayerNorm(d, LAYER_NORM_EPS, ctx)
        self.norm_self_att = LayerNorm(d, LAYER_NORM_EPS, ctx)
        self.norm_conv = LayerNorm(d, LAYER_NORM_EPS, ctx)
        self.norm_feed_forward2 = LayerNorm(d, LAYER_NORM_EPS, ctx)
        self.norm_out = LayerNorm(d, LAYER_NORM_EPS, ctx)

    def forward(
        self, op: OpBuilder, x: ir.Value, positions: ir.Value, dims: EncoderDims
    ) -> ir.Value:
        half = op.CastLike(op.Constant(value=ir.tensor(0.5, dtype=FLOAT)), x)
        x = op.Add(x, op.Mul(half, self.feed_forward1(op, self.norm_feed_forward1(op, x))))
        x = op.Add(x, self.self_attn(op, self.norm_self_att(op, x), positions, dims))
        x = op.Add(x, self.conv(op, self.norm_conv(op, x), dims))
        x = op.Add(x, op.Mul(half, self.feed_forward2(op, self.norm_feed_forward2(op, x))))
        return self.norm_out(op, x)


class ParakeetEncoder(nn.Module):
    """subsampling (x sqrt(hidden) when scale_input) + relative positions + conformer layers.

    forward: features [B, T, mel] in the model dtype, lengths int64 [B] (valid frames) ->
    (rows [B * T', hidden], dims); padded steps keep the values the reference computes.
    """

    def __init__(self, spec: ParakeetSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        self.subsampling = ParakeetEncoderSubsamplingConv2D(spec, ctx)
        self.encode_positions = ParakeetEncoderRelPositionalEncoding(spec, ctx.dtype)
        self.layers = nn.ModuleList(
            [ParakeetEncoderBlock(spec, ctx) for _ in range(spec.num_layers)]
        )

    def forward(
        self, op: OpBuilder, features: ir.Value, lengths: ir.Value
    ) -> tuple[ir.Value, EncoderDims]:
        x, steps = self.subsampling(op, features, lengths)
        if self.spec.scale_input:
            scale = math.sqrt(self.spec.hidden_size)
            x = op.Mul(x, op.CastLike(op.Constant(value=ir.tensor(scale, dtype=FLOAT)), x))
        positions = self.encode_positions(op, steps)
        valid = time_mask(op, subsampled_lengths(op, lengths, self.spec), steps)
        dims = EncoderDims(batch=op.Shape(features, start=0, end=1), steps=steps, valid=valid)
        for layer in self.layers:
            x = layer(op, x, positions, dims)
        return x, dims
