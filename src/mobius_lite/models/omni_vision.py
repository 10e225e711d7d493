"""Nemotron-H Omni's vision side: C-RADIO tower + optional final LayerNorm + pixel shuffle +
projector, as onnxscript modules named like transformers' NemotronH_Omni_Reasoning_V3
(vision_model.*, vision_final_layernorm.*, multi_modal_projector.*); its config:
configs/omni_vision.py.

Image graph: pixel_values FP32 [total_patches, 3 * p * p] (normalised, channel-major patches, as
the image processor emits them) + image_grid_hw int64 [num_images, 2] -> image_features
[num_image_tokens, text_hidden]. Video graph: pixel_values_videos FP32 [num_videos, num_tubelets,
T * 3, H, W] (the video processor's tubelets) -> video_features [num_video_tokens, text_hidden]
and video_retention_mask bool [num_video_tokens] (EVS; all True when video_pruning_rate is 0).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import cast_to
from mobius_lite.components.context import BuildContext
from mobius_lite.components.evs import retention_mask
from mobius_lite.components.projector import MultiModalProjector, pixel_shuffle, pixel_shuffle_order
from mobius_lite.components.radio import (
    LayerNorm,
    PackedGrids,
    RadioModel,
    UniformGrid,
    empty_rows,
    ints,
)
from mobius_lite.configs.omni_vision import OmniVisionConfig

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64


class OmniVisionModel(nn.Module):
    """The Omni vision modules with checkpoint names; forward() is the image path, video() the
    video path (both share every parameter)."""

    def __init__(self, config: OmniVisionConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.config = config
        self.ctx = ctx
        spec = config.radio
        f = config.downsample_factor
        self.vision_model = RadioModel(spec, ctx)
        self.vision_final_layernorm = (
            LayerNorm(spec.hidden_size, spec.layer_norm_eps, ctx)
            if config.final_layernorm
            else None
        )
        self.multi_modal_projector = MultiModalProjector(
            spec.hidden_size * f * f, config.projector_hidden_size, config.text_hidden_size, ctx
        )

    def _project(self, op: OpBuilder, hidden: ir.Value, order: ir.Value) -> ir.Value:
        """Patch rows of the tower output, in pixel-shuffle order -> projected tokens."""
        if self.vision_final_layernorm is not None:
            # per row, so normalising every row (prefix tokens too) before the gather is the same
            hidden = self.vision_final_layernorm(op, hidden)
        shuffled = pixel_shuffle(op, hidden, order, self.config.downsample_factor)
        return self.multi_modal_projector(op, shuffled)

    def forward(self, op: OpBuilder, pixel_values: ir.Value, image_grid_hw: ir.Value) -> ir.Value:
        spec = self.config.radio
        f = self.config.downsample_factor
        grids = PackedGrids.from_grid_hw(op, image_grid_hw, spec.num_prefix_tokens)
        dtype = self.ctx.dtype
        hidden = self.vision_model(op, cast_to(op, pixel_values, dtype), grids)
        prefix = ints(op, spec.num_prefix_tokens)

        def rows(op: OpBuilder, at: ir.Value) -> list[ir.Value]:
            order = pixel_shuffle_order(
                op, op.Gather(grids.heights, at), op.Gather(grids.widths, at), f
            )
            return [op.Add(order, op.Add(op.Gather(grids.seq_starts, at), prefix))]

        (order,) = grids.loop(op, rows, [empty_rows(op, grids.heights)], "feature_rows")
        return self._project(op, hidden, order)

    def video(self, op: OpBuilder, pixel_values_videos: ir.Value) -> tuple[ir.Value, ir.Value]:
        """[V, T, tp * C, H, W] -> (features [V * T * P, text_hidden], keep bool [V * T * P])."""
        spec = self.config.radio
        f = self.config.downsample_factor
        p = spec.patch_size
        dtype = self.ctx.dtype
        shape = op.Shape(pixel_values_videos)
        videos, tubelets = (
            op.Slice(shape, ints(op, 0), ints(op, 1)),
            op.Slice(shape, ints(op, 1), ints(op, 2)),
        )
        channels = op.Slice(shape, ints(op, 2), ints(op, 3))
        height = op.Div(op.Slice(shape, ints(op, 3), ints(op, 4)), ints(op, p))
        width = op.Div(op.Slice(shape, ints(op, 4), ints(op, 5)), ints(op, p))
        count = op.Mul(videos, tubelets)
        # (N, C', h, p, w, p) -> (N, h, w, C', p, p): row-major patches, channel-major in each
        split = op.Reshape(
            cast_to(op, pixel_values_videos, dtype),
            op.Concat(count, channels, height, ints(op, p), width, ints(op, p), axis=0),
        )
        patches = op.Reshape(
            op.Transpose(split, perm=[0, 2, 4, 1, 3, 5]),
            op.Concat(ints(op, -1), op.Mul(channels, ints(op, p * p)), axis=0),
        )
        per_frame = op.Add(op.Mul(height, width), ints(op, spec.num_prefix_tokens))
        grid = UniformGrid(count=count, height=height, width=width, seq_length=per_frame)
        hidden = self.vision_model(op, patches, grid)

        zero = op.Constant(value=ir.tensor(0, dtype=INT64))
        one = op.Constant(value=ir.tensor(1, dtype=INT64))
        frame_starts = op.Mul(op.Range(zero, op.Squeeze(count, ints(op, 0)), one), per_frame)
        inner = op.Add(pixel_shuffle_order(op, height, width, f), ints(op, spec.num_prefix_tokens))
        order = op.Reshape(
            op.Add(op.Unsqueeze(frame_starts, ints(op, 1)), op.Unsqueeze(inner, ints(op, 0))),
            ints(op, -1),
        )
        features = self._project(op, hidden, order)
        mask = retention_mask(op, features, videos, tubelets, self.config.video_pruning_rate)
        return features, mask
