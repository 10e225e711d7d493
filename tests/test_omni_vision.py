"""The Omni vision graphs (C-RADIO tower, pixel shuffle, projector, EVS) against transformers'
NemotronH_Omni_Reasoning_V3 (get_image_features, get_video_features, compute_retention_mask)
in FP32 on onnxruntime CPU. Gates are fixed: NRMSE <= 1e-4, cosine >= 0.99999; masks exact."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnxscript import OpBuilder
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
    compute_retention_mask,
)

from formats.emit_harness import run_emitter
from mobius_lite.components.context import BuildContext
from mobius_lite.components.evs import retention_mask
from mobius_lite.components.projector import pixel_shuffle, pixel_shuffle_order
from mobius_lite.components.radio import interpolate_position_embedding
from mobius_lite.configs.omni_vision import OmniVisionConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.graphs.omni import build_video_graph, build_vision_graph
from reference_fixtures.omni_fixtures import (
    TEMPORAL,
    make_omni,
    omni_config,
    pack_images,
    pack_video,
    session,
    vision_state,
)
from reference_fixtures.omni_fixtures import bind as bind_state

RATE = 0.4


def _config(model: NemotronH_Omni_Reasoning_V3) -> OmniVisionConfig:
    return OmniVisionConfig.from_dict(model.config.to_dict())


def _unused_expected(state: dict[str, np.ndarray], unused_projection: str) -> set[str]:
    """State-dict tensors the reference does not compute with (or, lambda1, multiplies by 1)."""
    layer_scales = {k for k in state if k.endswith("lambda1")}
    for name in layer_scales:
        assert (state[name] == 1.0).all(), name
    return {"vision_model.summary_idxs", unused_projection, *layer_scales}


def _gate(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    result = compare(name, actual, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


@pytest.mark.parametrize(
    ("final_layernorm", "grids"),
    [
        (True, [(4, 6), (10, 6)]),  # crop of a 6x6 resize; upsampling past the 8x8 table
        (False, [(2, 4), (8, 8), (6, 2)]),  # three images, one at the table's own size
        (True, [(6, 10)]),  # a single image: the reference's dense (non-packed) path
    ],
)
def test_image_features_match_transformers(
    final_layernorm: bool, grids: list[tuple[int, int]]
) -> None:
    model = make_omni(final_layernorm)
    gen = torch.Generator().manual_seed(7)
    images = [torch.randn(3, h * 4, w * 4, generator=gen) for h, w in grids]
    pixel_values, grid_hw = pack_images(images)
    with torch.no_grad():
        pooled = model.get_image_features(
            torch.from_numpy(pixel_values), torch.from_numpy(grid_hw)
        ).pooler_output
    expected = torch.cat(pooled).numpy()

    graph = build_vision_graph(_config(model))
    state = vision_state(model)
    unused = bind_state(graph, state)
    assert unused == _unused_expected(
        state, "vision_model.embeddings.video_patch_projection.weight"
    )
    (actual,) = session(graph).run(None, {"pixel_values": pixel_values, "image_grid_hw": grid_hw})
    assert actual.shape == (sum(h * w for h, w in grids) // 4, 24)
    _gate("image_features", actual, expected)


@pytest.mark.parametrize(
    ("final_layernorm", "num_frames", "num_videos"),
    [(True, 5, 1), (False, 6, 1), (False, 4, 2)],
)
def test_video_features_and_evs_match_transformers(
    final_layernorm: bool, num_frames: int, num_videos: int
) -> None:
    model = make_omni(final_layernorm, RATE)
    gen = torch.Generator().manual_seed(11)
    clips = [torch.randn(num_frames, 3, 16, 24, generator=gen) for _ in range(num_videos)]
    videos = np.concatenate([pack_video(c) for c in clips])
    with torch.no_grad():
        if num_frames % TEMPORAL:
            # the reference pads odd frame counts itself on its (deprecated) raw-frames path
            out = model.get_video_features(clips[0])
        else:
            out = model.get_video_features(torch.from_numpy(videos))
    tubelets = out.last_hidden_state.shape[1]
    assert tubelets == -(-num_frames // TEMPORAL)
    expected = torch.cat(out.pooler_output).numpy()
    expected_mask = torch.cat(
        [compute_retention_mask(v, tubelets, RATE) for v in out.pooler_output]
    ).numpy()

    graph = build_video_graph(_config(model))
    state = vision_state(model)
    assert bind_state(graph, state) == _unused_expected(
        state, "vision_model.embeddings.patch_projection.weight"
    )
    features, mask = session(graph).run(None, {"pixel_values_videos": videos})
    _gate("video_features", features, expected)
    assert mask.dtype == np.bool_
    per_tubelet = (16 // 4) * (24 // 4) // 4
    assert mask.shape == (num_videos * tubelets * per_tubelet,)
    # the first tubelet is always kept; later ones are pruned in part
    assert mask.reshape(num_videos, tubelets, per_tubelet)[:, 0].all()
    assert not mask.all()
    np.testing.assert_array_equal(mask, expected_mask)


def _evs_emitter(rate: float, dtype: ir.DataType):
    def emit(op: OpBuilder, embeds: ir.Value, videos: ir.Value, tubelets: ir.Value) -> ir.Value:
        x = embeds if dtype == ir.DataType.FLOAT else op.Cast(embeds, to=dtype)
        return retention_mask(op, x, videos, tubelets, rate)

    return emit


def _reference_masks(embeds: torch.Tensor, videos: int, tubelets: int, rate: float) -> np.ndarray:
    return torch.cat(
        [
            compute_retention_mask(v, tubelets, rate)
            for v in embeds.reshape(videos, -1, embeds.shape[-1])
        ]
    ).numpy()


def _one_hot_video(tubelets: int, tokens: int, hidden: int) -> torch.Tensor:
    """Tokens of +-one-hot vectors: 1 - cosine is exactly 0, 1 or 2, so scores tie in groups."""
    gen = torch.Generator().manual_seed(3)
    axes = torch.randint(0, 3, (tubelets, tokens), generator=gen)
    signs = torch.where(torch.rand(tubelets, tokens, generator=gen) < 0.2, -2.0, 2.0)
    embeds = torch.zeros(tubelets, tokens, hidden)
    embeds.scatter_(2, axes.unsqueeze(-1), signs.unsqueeze(-1))
    return embeds.reshape(-1, hidden)


@pytest.mark.parametrize("dtype", [ir.DataType.FLOAT, ir.DataType.BFLOAT16])
@pytest.mark.parametrize(
    ("tubelets", "tokens", "rate"), [(3, 4, 0.3), (4, 6, 0.7), (5, 2, 0.3), (6, 3, 0.2)]
)
def test_evs_ties_go_to_the_lower_index(
    dtype: ir.DataType, tubelets: int, tokens: int, rate: float
) -> None:
    embeds = _one_hot_video(tubelets, tokens, 8)
    scores = 1 - torch.nn.functional.cosine_similarity(
        embeds.reshape(tubelets, tokens, -1)[1:], embeds.reshape(tubelets, tokens, -1)[:-1], dim=-1
    )
    kept = max(tokens, int(tubelets * tokens * (1 - rate)))
    ordered = torch.sort(scores.flatten(), descending=True).values
    cut = kept - tokens  # the cutoff among the later tubelets' scores
    assert 0 < cut < ordered.numel() and ordered[cut - 1] == ordered[cut], "no tie at the cutoff"
    torch_dtype = torch.float32 if dtype == ir.DataType.FLOAT else torch.bfloat16
    expected = _reference_masks(embeds.to(torch_dtype), 1, tubelets, rate)
    (actual,) = run_emitter(
        _evs_emitter(rate, dtype),
        [embeds.numpy(), np.array([1], np.int64), np.array([tubelets], np.int64)],
    )
    np.testing.assert_array_equal(actual, expected)


def test_evs_bf16_scores_round_like_torch() -> None:
    """Random bf16 embeddings of two videos: bf16 scores tie often; the mask must still match."""
    gen = torch.Generator().manual_seed(5)
    videos, tubelets, tokens, hidden = 2, 6, 16, 24
    embeds = torch.randn(videos * tubelets * tokens, hidden, generator=gen)
    embeds[: tubelets * tokens // 2] += 3.0  # similar neighbours: scores crowd near zero
    embeds = embeds.to(torch.bfloat16)
    expected = _reference_masks(embeds, videos, tubelets, RATE)
    (actual,) = run_emitter(
        _evs_emitter(RATE, ir.DataType.BFLOAT16),
        [
            embeds.float().numpy(),
            np.array([videos], np.int64),
            np.array([tubelets], np.int64),
        ],
    )
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(("height", "width", "factor"), [(4, 6, 2), (6, 9, 3)])
def test_pixel_shuffle_matches_reference(height: int, width: int, factor: int) -> None:
    hidden = 5
    features = torch.randn(1, height, width, hidden, generator=torch.Generator().manual_seed(1))
    expected = NemotronH_Omni_Reasoning_V3.pixel_shuffle(None, features, 1 / factor)
    expected = expected.reshape(-1, expected.shape[-1]).numpy()

    def emit(op: OpBuilder, rows: ir.Value, h: ir.Value, w: ir.Value) -> ir.Value:
        return pixel_shuffle(op, rows, pixel_shuffle_order(op, h, w, factor), factor)

    (actual,) = run_emitter(
        emit,
        [
            features.reshape(-1, hidden).numpy(),
            np.array([height], np.int64),
            np.array([width], np.int64),
        ],
    )
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("grid", [(3, 5), (8, 8), (12, 4), (2, 2), (9, 9)])
def test_position_embedding_resize_matches_reference(grid: tuple[int, int]) -> None:
    model = make_omni(False)
    embeddings = model.vision_model.embeddings
    with torch.no_grad():
        expected = embeddings._interpolate_position_embedding(grid, torch.float32)[0].numpy()
    rows = embeddings.max_rows
    table = embeddings.position_embedding.detach().reshape(1, rows, rows, -1).permute(0, 3, 1, 2)

    def emit(op: OpBuilder, t: ir.Value, h: ir.Value, w: ir.Value) -> ir.Value:
        return interpolate_position_embedding(op, t, h, w)

    (actual,) = run_emitter(
        emit,
        [table.contiguous().numpy(), np.array([grid[0]], np.int64), np.array([grid[1]], np.int64)],
    )
    # ORT's Resize maps coordinates as (x + 0.5) / (out / in) - 0.5, torch as
    # (x + 0.5) * (in / out) - 0.5: the last-ulp difference leaves ~1e-6 absolute noise
    # (NRMSE < 1e-6 here), so this is held to the FP32 gates rather than to equality.
    _gate("position_embedding", actual, expected)


def test_config_reads_released_names() -> None:
    """The legacy spellings (llm_config, vit_hidden_size) give the same config."""
    current = omni_config(True, RATE).to_dict()
    legacy = dict(current)
    legacy["llm_config"] = legacy.pop("text_config")
    legacy["vit_hidden_size"] = legacy.pop("vision_hidden_size")
    config = OmniVisionConfig.from_dict(current)
    assert OmniVisionConfig.from_dict(legacy) == config
    assert config.final_layernorm and config.downsample_factor == 2
    assert config.radio.num_prefix_tokens == 5 and config.radio.max_grid == 8
    assert not OmniVisionConfig.from_dict(omni_config(False, 0.0).to_dict()).final_layernorm
    bad = dict(current, downsample_ratio=0.4)
    with pytest.raises(ValueError, match="downsample_ratio"):
        OmniVisionConfig.from_dict(bad)


def test_bf16_graphs_are_valid() -> None:
    """The BF16 graphs pass the ONNX checker with full shape inference (CPU ORT lacks BF16
    kernels for Gemm, so their numbers are checked where a GPU is available, not here)."""
    import onnx

    config = OmniVisionConfig.from_dict(omni_config(True, RATE).to_dict())
    for build in (build_vision_graph, build_video_graph):
        model = build(config, BuildContext.dense("bf16"))
        for value in model.graph.initializers.values():
            assert value.dtype == ir.DataType.BFLOAT16
            value.const_value = ir.tensor(
                np.zeros(tuple(value.shape), dtype=ml_dtypes.bfloat16), name=value.name
            )
        onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)


def test_graph_size_does_not_depend_on_images() -> None:
    """Per-image work runs in Loops (embedding, attention in each layer, feature rows): the
    graph has no image count baked in, and attention never sees the packed sequence whole."""
    config = OmniVisionConfig.from_dict(omni_config(False, RATE).to_dict())
    graph = build_vision_graph(config).graph
    top = [node.op_type for node in graph]
    assert top.count("Loop") == config.radio.num_layers + 2
    assert "Attention" not in top  # only inside the per-image loop bodies
