"""C-RADIO vision tower (transformers' RadioModel) as onnxscript modules.

Attribute names follow transformers' RadioModel (embeddings.{patch_projection, position_embedding,
cls_register_token}, encoder.layer.N.{norm1, attention.{q,k,v,o}_proj, norm2, mlp.fc1/fc2}), so
parameter paths equal its state-dict names. Activations are rows [tokens, hidden]; two layouts
say which rows attend to each other: PackedGrids (images of different sizes concatenated, each
attending only to itself, one Loop iteration per image) and UniformGrid (a dense batch of
same-size frames, one batched Attention). The node count never depends on the number of images.

Not modelled: the input conditioner (Omni detaches it; the processor normalises pixels).
LayerScale (layer_scale{1,2}.lambda1) is applied exactly when the checkpoint holds it: released
C-RADIO checkpoints have none (transformers then fills lambda1 with layerscale_value), while
transformers' save_pretrained writes it; the task sets `layer_scale` from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import cast_to, to_float32
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.configs.omni_vision import GELU_APPROXIMATION, RadioSpec

INT64 = ir.DataType.INT64
BOOL = ir.DataType.BOOL


def ints(op: OpBuilder, *values: int) -> ir.Value:
    """A 1-D int64 constant."""
    return op.Constant(value_ints=list(values))


def scalar(op: OpBuilder, value: ir.Value) -> ir.Value:
    """[1] -> [] (Range and Loop take scalars)."""
    return op.Squeeze(value, ints(op, 0))


@dataclass(frozen=True)
class PackedGrids:
    """Images of different sizes packed along rows; all int64 [n] vectors except `count` ([])."""

    heights: ir.Value
    widths: ir.Value
    patch_starts: ir.Value  # first patch row of each image in pixel_values
    seq_starts: ir.Value  # first row of each image's (prefix + patches) sequence
    seq_lengths: ir.Value
    count: ir.Value

    @classmethod
    def from_grid_hw(cls, op: OpBuilder, image_grid_hw: ir.Value, num_prefix: int) -> PackedGrids:
        """image_grid_hw int64 [n, 2] (rows, cols per image) -> offsets for the packed layout."""
        heights = op.Squeeze(
            op.Slice(image_grid_hw, ints(op, 0), ints(op, 1), ints(op, 1)), ints(op, 1)
        )
        widths = op.Squeeze(
            op.Slice(image_grid_hw, ints(op, 1), ints(op, 2), ints(op, 1)), ints(op, 1)
        )
        patches = op.Mul(heights, widths)
        lengths = op.Add(patches, op.Constant(value=ir.tensor(num_prefix, dtype=INT64)))
        zero = op.Constant(value=ir.tensor(0, dtype=INT64))
        return cls(
            heights=heights,
            widths=widths,
            patch_starts=op.CumSum(patches, zero, exclusive=1),
            seq_starts=op.CumSum(lengths, zero, exclusive=1),
            seq_lengths=lengths,
            count=scalar(op, op.Shape(image_grid_hw, start=0, end=1)),
        )

    def loop(
        self,
        op: OpBuilder,
        step: Callable[[OpBuilder, ir.Value], list[ir.Value]],
        initial: list[ir.Value],
        name: str,
    ) -> list[ir.Value]:
        """Run step(op, at) once per image (at: int64 [1]) and concatenate its outputs along axis 0.

        `initial` gives one empty tensor per output (its dtype and trailing shape).
        """

        def body(op: OpBuilder, i: ir.Value, cond: ir.Value, *acc: ir.Value) -> list[ir.Value]:
            parts = step(op, op.Unsqueeze(i, ints(op, 0)))
            grown = [op.Concat(a, p, axis=0) for a, p in zip(acc, parts, strict=True)]
            return [op.Identity(cond), *grown]

        def carried(tag: str, v: ir.Value) -> ir.Value:
            return ir.Value(name=f"{name}_{tag}", type=ir.TensorType(v.dtype))

        graph = op.builder.subgraph(
            body,
            inputs=[
                ir.Value(name="i", type=ir.TensorType(INT64), shape=ir.Shape([])),
                ir.Value(name="cond_in", type=ir.TensorType(BOOL), shape=ir.Shape([])),
                *[carried(f"in{k}", v) for k, v in enumerate(initial)],
            ],
            outputs=[
                ir.Value(name="cond_out", type=ir.TensorType(BOOL), shape=ir.Shape([])),
                *[carried(f"out{k}", v) for k, v in enumerate(initial)],
            ],
            name=name,
        )
        true = op.Constant(value=ir.tensor(True, dtype=BOOL))
        out = op.Loop(self.count, true, *initial, body=graph, _outputs=len(initial))
        return [out] if isinstance(out, ir.Value) else list(out)


@dataclass(frozen=True)
class UniformGrid:
    """`count` frames of one size (video tubelets) as a dense batch; int64 [1] values."""

    count: ir.Value
    height: ir.Value
    width: ir.Value
    seq_length: ir.Value  # prefix + height * width


def empty_rows(op: OpBuilder, like: ir.Value) -> ir.Value:
    """A [0, ...] tensor with `like`'s dtype and trailing dims (a Loop's initial accumulator)."""
    return op.Slice(like, ints(op, 0), ints(op, 0), ints(op, 0))


def interpolate_position_embedding(
    op: OpBuilder, grid_table: ir.Value, height: ir.Value, width: ir.Value
) -> ir.Value:
    """The CPE table resized for one (height, width) grid -> FP32 [height * width, hidden].

    As the reference: bilinear (half-pixel, no antialias) to a max(h, w) square, then cropped to
    the top-left h x w. grid_table: FP32 [1, hidden, max_grid, max_grid].
    """
    side = op.Max(height, width)
    sizes = op.Concat(op.Shape(grid_table, start=0, end=2), side, side, axis=0)
    square = op.Resize(
        grid_table,
        None,
        None,
        sizes,
        mode="linear",
        coordinate_transformation_mode="half_pixel",
    )
    crop = op.Slice(square, ints(op, 0, 0), op.Concat(height, width, axis=0), ints(op, 2, 3))
    hidden = op.Shape(grid_table, start=1, end=2)
    flat = op.Reshape(crop, op.Concat(hidden, ints(op, -1), axis=0))
    return op.Transpose(flat, perm=[1, 0])


class RadioPatchEmbeddings(nn.Module):
    """CPE patch generator: patch projection + resized position table, cls/register prefix."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        d = spec.hidden_size
        self.patch_projection = Linear(spec.patch_dim, d, False, ctx)
        self.video_patch_projection = (
            Linear(spec.video_temporal_patch_size * spec.patch_dim, d, False, ctx)
            if spec.video_temporal_patch_size is not None
            else None
        )
        self.position_embedding = nn.Parameter([1, spec.max_grid**2, d], dtype=ctx.dtype)
        self.cls_register_token = nn.Parameter([spec.num_prefix_tokens, d], dtype=ctx.dtype)

    def forward(
        self, op: OpBuilder, patches: ir.Value, grids: PackedGrids | UniformGrid
    ) -> ir.Value:
        """patches [rows, patch_dim] (image) or [rows, T * patch_dim] (video, UniformGrid)
        -> token rows [sum(prefix + h * w), hidden], each image's prefix before its patches."""
        s = self.spec
        g = s.max_grid
        table = op.Transpose(
            op.Reshape(to_float32(op, self.position_embedding), ints(op, 1, g, g, s.hidden_size)),
            perm=[0, 3, 1, 2],
        )
        prefix = self.cls_register_token
        if isinstance(grids, UniformGrid):
            if self.video_patch_projection is None:
                raise ValueError("video input needs vision_config.video_temporal_patch_size")
            projected = self.video_patch_projection(op, patches)
            pos = interpolate_position_embedding(op, table, grids.height, grids.width)
            frames = op.Reshape(
                projected, op.Concat(grids.count, ints(op, -1, s.hidden_size), axis=0)
            )
            frames = op.Add(frames, cast_to(op, pos, projected.dtype))
            expanded = op.Expand(
                op.Unsqueeze(prefix, ints(op, 0)),
                op.Concat(grids.count, ints(op, s.num_prefix_tokens, s.hidden_size), axis=0),
            )
            tokens = op.Concat(expanded, frames, axis=1)
            return op.Reshape(tokens, ints(op, -1, s.hidden_size))

        projected = self.patch_projection(op, patches)

        def step(op: OpBuilder, at: ir.Value) -> list[ir.Value]:
            height = op.Gather(grids.heights, at)
            width = op.Gather(grids.widths, at)
            start = op.Gather(grids.patch_starts, at)
            own = op.Slice(projected, start, op.Add(start, op.Mul(height, width)), ints(op, 0))
            pos = interpolate_position_embedding(op, table, height, width)
            return [op.Concat(prefix, op.Add(own, cast_to(op, pos, own.dtype)), axis=0)]

        (tokens,) = grids.loop(op, step, [empty_rows(op, projected)], "embed_images")
        return tokens


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm with FP32 compute and one cast back (as torch does for half inputs)."""

    def __init__(self, hidden_size: int, eps: float, ctx: BuildContext) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter([hidden_size], dtype=ctx.dtype)
        self.bias = nn.Parameter([hidden_size], dtype=ctx.dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        y = op.LayerNormalization(
            to_float32(op, x),
            to_float32(op, self.weight),
            to_float32(op, self.bias),
            axis=-1,
            epsilon=self.eps,
            stash_type=1,
        )
        return cast_to(op, y, x.dtype)


class RadioAttention(nn.Module):
    """Bidirectional multi-head self-attention, kept within each image (or frame)."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        d = spec.hidden_size
        # One fused projection, as released C-RADIO checkpoints store it (attn.qkv: q, k, v
        # rows concatenated); transformers' q_proj / k_proj / v_proj are its three chunks.
        self.qkv = Linear(d, 3 * d, spec.qkv_bias, ctx)
        self.o_proj = Linear(d, d, True, ctx)

    def _attend(self, op: OpBuilder, q: ir.Value, k: ir.Value, v: ir.Value) -> ir.Value:
        """[batch, seq, heads * head_dim] each -> same shape (softmax in FP32)."""
        s = self.spec
        return op.Attention(
            q,
            k,
            v,
            q_num_heads=s.num_heads,
            kv_num_heads=s.num_heads,
            scale=float(s.head_dim**-0.5),
            softmax_precision=1,
        )

    def forward(self, op: OpBuilder, x: ir.Value, grids: PackedGrids | UniformGrid) -> ir.Value:
        d = self.spec.hidden_size
        q, k, v = op.Split(self.qkv(op, x), ints(op, d, d, d), axis=-1, _outputs=3)
        if isinstance(grids, UniformGrid):
            batched = op.Concat(grids.count, grids.seq_length, ints(op, d), axis=0)
            y = self._attend(op, *(op.Reshape(t, batched) for t in (q, k, v)))
            return self.o_proj(op, op.Reshape(y, ints(op, -1, d)))

        def step(op: OpBuilder, at: ir.Value) -> list[ir.Value]:
            start = op.Gather(grids.seq_starts, at)
            end = op.Add(start, op.Gather(grids.seq_lengths, at))
            own = [
                op.Unsqueeze(op.Slice(t, start, end, ints(op, 0)), ints(op, 0)) for t in (q, k, v)
            ]
            return [op.Squeeze(self._attend(op, *own), ints(op, 0))]

        (y,) = grids.loop(op, step, [empty_rows(op, q)], "attend_images")
        return self.o_proj(op, y)


class RadioMLP(nn.Module):
    """fc1 -> GELU (exact or tanh, per hidden_act) -> fc2."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.approximate = GELU_APPROXIMATION[spec.hidden_act]
        self.fc1 = Linear(spec.hidden_size, spec.intermediate_size, True, ctx)
        self.fc2 = Linear(spec.intermediate_size, spec.hidden_size, True, ctx)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.fc2(op, op.Gelu(self.fc1(op, x), approximate=self.approximate))


class RadioSwiGLUFFN(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        d, i = spec.hidden_size, spec.intermediate_size
        self.gate_proj = Linear(d, i, True, ctx)
        self.up_proj = Linear(d, i, True, ctx)
        self.down_proj = Linear(i, d, True, ctx)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        gate = self.gate_proj(op, x)
        return self.down_proj(op, op.Mul(op.Mul(gate, op.Sigmoid(gate)), self.up_proj(op, x)))


class RadioLayerScale(nn.Module):
    """x * lambda1, per channel."""

    def __init__(self, hidden_size: int, dtype: ir.DataType) -> None:
        super().__init__()
        self.lambda1 = nn.Parameter([hidden_size], dtype=dtype)

    def forward(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return op.Mul(x, self.lambda1)


class RadioLayer(nn.Module):
    """Pre-norm ViT block: x + ls1(attn(norm1(x))), then + ls2(mlp(norm2(x)))."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.norm1 = LayerNorm(spec.hidden_size, spec.layer_norm_eps, ctx)
        self.attention = RadioAttention(spec, ctx)
        self.norm2 = LayerNorm(spec.hidden_size, spec.layer_norm_eps, ctx)
        self.mlp = RadioSwiGLUFFN(spec, ctx) if spec.use_swiglu_ffn else RadioMLP(spec, ctx)
        scale = spec.layer_scale
        self.layer_scale1 = RadioLayerScale(spec.hidden_size, ctx.dtype) if scale else None
        self.layer_scale2 = RadioLayerScale(spec.hidden_size, ctx.dtype) if scale else None

    def forward(self, op: OpBuilder, x: ir.Value, grids: PackedGrids | UniformGrid) -> ir.Value:
        attended = self.attention(op, self.norm1(op, x), grids)
        if self.layer_scale1 is not None:
            attended = self.layer_scale1(op, attended)
        x = op.Add(x, attended)
        mixed = self.mlp(op, self.norm2(op, x))
        if self.layer_scale2 is not None:
            mixed = self.layer_scale2(op, mixed)
        return op.Add(x, mixed)


class RadioEncoder(nn.Module):
    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.layer = nn.ModuleList([RadioLayer(spec, ctx) for _ in range(spec.num_layers)])

    def forward(self, op: OpBuilder, x: ir.Value, grids: PackedGrids | UniformGrid) -> ir.Value:
        for layer in self.layer:
            x = layer(op, x, grids)
        return x


class RadioModel(nn.Module):
    """embeddings + encoder -> last hidden rows [sum(prefix + h * w), hidden] in `grids` order."""

    def __init__(self, spec: RadioSpec, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        self.embeddings = RadioPatchEmbeddings(spec, ctx)
        self.encoder = RadioEncoder(spec, ctx)

    def forward(
        self, op: OpBuilder, patches: ir.Value, grids: PackedGrids | UniformGrid
    ) -> ir.Value:
        return self.encoder(op, self.embeddings(op, patches, grids), grids)
