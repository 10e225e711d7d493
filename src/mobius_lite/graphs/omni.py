"""The Omni media graphs and their I/O contract (docs/omni.md): images, videos, audio.

Weights are not bound here: initializers carry the checkpoint's names (models/omni_names.py
maps them to the released layout) and no data. Each builder takes the tower's BuildContext
(precision, weight formats, backend; default: dense FP32).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import GraphBuilder, nn

from mobius_lite.components.context import BuildContext, apply_weight_formats
from mobius_lite.configs.omni_audio import OmniAudioConfig
from mobius_lite.configs.omni_vision import OmniVisionConfig
from mobius_lite.errors import ConfigError
from mobius_lite.graphs.builder import graph_value, name_output, new_graph, to_model
from mobius_lite.io_contract import (
    AUDIO_FEATURES,
    IMAGE_FEATURES,
    IMAGE_GRID_HW,
    INPUT_FEATURES,
    INPUT_FEATURES_MASK,
    PIXEL_VALUES,
    PIXEL_VALUES_VIDEOS,
    VIDEO_FEATURES,
    VIDEO_RETENTION_MASK,
)
from mobius_lite.models.omni_audio import OmniAudioModel
from mobius_lite.models.omni_vision import OmniVisionModel

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64


def _formatted(module: nn.Module, ctx: BuildContext) -> nn.Module:
    apply_weight_formats(module, ctx)
    return module


def build_vision_graph(
    config: OmniVisionConfig,
    ctx: BuildContext | None = None,
) -> ir.Model:
    """pixel_values [total_patches, 3 p p] + image_grid_hw [images, 2] -> image_features."""
    ctx = ctx or BuildContext.dense()
    module = _formatted(OmniVisionModel(config, ctx), ctx)
    pixels = graph_value(PIXEL_VALUES, FLOAT, ["total_patches", config.radio.patch_dim])
    grid = graph_value(IMAGE_GRID_HW, INT64, ["num_images", 2])
    graph = new_graph("omni_vision", [pixels, grid])
    features = module(GraphBuilder(graph).op, pixels, grid)
    shape = ["num_image_tokens", config.text_hidden_size]
    graph.outputs.append(name_output(features, IMAGE_FEATURES, ctx.dtype, shape))
    return to_model(graph)


def build_video_graph(
    config: OmniVisionConfig,
    ctx: BuildContext | None = None,
) -> ir.Model:
    """pixel_values_videos [videos, tubelets, tp C, H, W] -> video_features + the EVS mask
    (same initializer names as the image graph, plus video_patch_projection)."""
    ctx = ctx or BuildContext.dense()
    spec = config.radio
    if spec.video_temporal_patch_size is None:
        raise ConfigError("the video graph needs vision_config.video_temporal_patch_size")
    module = _formatted(OmniVisionModel(config, ctx), ctx)
    channels = spec.video_temporal_patch_size * spec.num_channels
    videos = graph_value(
        PIXEL_VALUES_VIDEOS, FLOAT, ["num_videos", "num_tubelets", channels, "height", "width"]
    )
    graph = new_graph("omni_video", [videos])
    op = GraphBuilder(graph).op
    op.builder.push_module("", type(module).__qualname__)
    try:
        features, mask = module.video(op, videos)
    finally:
        op.builder.pop_module()
    tokens = ["num_video_tokens", config.text_hidden_size]
    graph.outputs.append(name_output(features, VIDEO_FEATURES, ctx.dtype, tokens))
    graph.outputs.append(
        name_output(mask, VIDEO_RETENTION_MASK, ir.DataType.BOOL, ["num_video_tokens"])
    )
    return to_model(graph)


def build_audio_graph(
    config: OmniAudioConfig,
    ctx: BuildContext | None = None,
) -> ir.Model:
    """input_features [clips, frames, mel] + input_features_mask [clips, frames] ->
    audio_features (every clip's kept tokens, clip after clip)."""
    ctx = ctx or BuildContext.dense()
    module = _formatted(OmniAudioModel(config, ctx), ctx)
    features = graph_value(INPUT_FEATURES, FLOAT, ["clips", "frames", config.encoder.num_mel_bins])
    mask = graph_value(INPUT_FEATURES_MASK, INT64, ["clips", "frames"])
    graph = new_graph("omni_audio", [features, mask])
    out = module(GraphBuilder(graph).op, features, mask)
    shape = ["num_audio_tokens", config.text_hidden_size]
    graph.outputs.append(name_output(out, AUDIO_FEATURES, ctx.dtype, shape))
    return to_model(graph)
