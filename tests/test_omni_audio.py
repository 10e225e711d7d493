"""The Omni audio graph (Parakeet FastConformer tower + embed_audio projector) against
transformers' NemotronH_Omni_Reasoning_V3.get_audio_features, and the numpy log-mel features
against ParakeetFeatureExtractor, in FP32 on onnxruntime CPU. Gates are fixed: NRMSE <= 1e-4,
cosine >= 0.99999; token counts and masks exact."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
import torch
from onnxscript import OpBuilder
from transformers.audio_utils import mel_filter_bank
from transformers.models.parakeet.feature_extraction_parakeet import ParakeetFeatureExtractor

from formats.emit_harness import run_emitter
from mobius_lite.components.context import BuildContext
from mobius_lite.components.parakeet import subsampled_lengths
from mobius_lite.configs.omni_audio import OmniAudioConfig, ParakeetSpec
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.graphs.omni import build_audio_graph
from mobius_lite.media.audio_features import LogMelConfig, log_mel_features, mel_filters
from omni_audio_fixtures import (
    SMALL_AUDIO,
    WIDER_AUDIO,
    audio_state,
    make_omni_audio,
    omni_audio_config,
    padded_batch,
    waveforms,
)
from reference_fixtures.omni_fixtures import bind, session

RATE = 16000


def _gate(name: str, actual: np.ndarray, expected: np.ndarray) -> None:
    result = compare(name, actual, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result


def _reference(model, features: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pooler_output, tokens kept per clip) from get_audio_features on the padded batch."""
    with torch.no_grad():
        out = model.get_audio_features(torch.from_numpy(features), torch.from_numpy(mask))
    steps = out.last_hidden_state.shape[1]
    sums = torch.from_numpy(mask).sum(-1)
    kept = model.audio_tower._get_subsampling_output_length(sums + 1).clamp(max=steps)
    return out.pooler_output.numpy(), kept.numpy()


def _run(model, features: np.ndarray, mask: np.ndarray) -> np.ndarray:
    graph = build_audio_graph(OmniAudioConfig.from_dict(model.config.to_dict()))
    unused = bind(graph, audio_state(model))
    # BatchNorm's step counter is the only tensor eval-mode inference never reads
    assert unused == {k for k in audio_state(model) if k.endswith("num_batches_tracked")}
    (actual,) = session(graph).run(
        None, {"input_features": features, "input_features_mask": mask.astype(np.int64)}
    )
    return actual


@pytest.mark.parametrize(
    ("audio", "lengths", "frames"),
    [
        # 64: keeps ceil(65 / 8) = 9 > 8 steps (capped); 40: keeps 6 tokens, the encoder masks
        # its 6th; 23: the first conv reads a padded frame
        (SMALL_AUDIO, [64, 40, 23], 64),
        # no clip fills the batch; 16 and 48 keep one encoder-padding token each
        (WIDER_AUDIO, [48, 16, 37], 53),
        (WIDER_AUDIO, [29], 29),  # a single clip
    ],
)
def test_audio_features_match_transformers(audio: dict, lengths: list[int], frames: int) -> None:
    model = make_omni_audio(audio)
    features, mask = padded_batch(lengths, frames, audio["num_mel_bins"], seed=len(lengths))
    expected, kept = _reference(model, features, mask)
    encoder_valid = model.audio_tower._get_subsampling_output_length(
        torch.from_numpy(mask).sum(-1)
    ).numpy()
    if len(lengths) > 1:
        assert (kept > encoder_valid).any(), "no clip keeps a token its encoder mask drops"
    actual = _run(model, features, mask)
    assert actual.shape == (int(kept.sum()), 24) == expected.shape
    _gate("audio_features", actual, expected)


def test_waveforms_to_audio_features_match_transformers() -> None:
    """The whole audio path: waveforms -> numpy log-mel -> graph, vs the extractor -> model."""
    model = make_omni_audio(SMALL_AUDIO, seed=3)
    clips = waveforms([3200, 1900, 2561], RATE, seed=4)
    extractor = ParakeetFeatureExtractor(feature_size=SMALL_AUDIO["num_mel_bins"])
    reference = extractor(clips, sampling_rate=RATE, return_tensors="np")
    expected, kept = _reference(
        model, reference["input_features"], reference["attention_mask"].astype(np.int64)
    )
    features, mask = log_mel_features(clips, RATE, LogMelConfig.from_dict(extractor.to_dict()))
    np.testing.assert_array_equal(mask.astype(bool), reference["attention_mask"])
    actual = _run(model, features, mask)
    assert actual.shape == expected.shape == (int(kept.sum()), 24)
    _gate("audio_features", actual, expected)


@pytest.mark.parametrize(
    "settings",
    [
        {},  # the defaults: 80 bins, 512-point FFT, 400-sample window, hop 160, preemphasis 0.97
        {"feature_size": 128},
        {
            "feature_size": 40,
            "n_fft": 400,
            "win_length": 320,
            "hop_length": 128,
            "preemphasis": None,
            "padding_value": 0.25,
        },
    ],
)
def test_log_mel_features_match_extractor(settings: dict) -> None:
    extractor = ParakeetFeatureExtractor(**settings)
    clips = waveforms([8000, 5123, 12345], RATE, seed=1)
    expected = extractor(clips, sampling_rate=RATE, return_tensors="np")
    config = LogMelConfig.from_dict(extractor.to_dict())
    features, mask = log_mel_features(clips, RATE, config)
    assert features.dtype == np.float32 and mask.dtype == np.int64
    np.testing.assert_array_equal(mask.astype(bool), expected["attention_mask"])
    assert features.shape == expected["input_features"].shape
    # the torch extractor computes its STFT in FP32 and the numpy one in FP64: given torch's
    # own power spectrum the rest agrees to ~6e-7; the FFT rounding leaves NRMSE ~1e-5
    _gate("input_features", features, expected["input_features"])


def test_mel_filters_equal_transformers() -> None:
    config = LogMelConfig(feature_size=128)
    expected = mel_filter_bank(
        num_frequency_bins=config.n_fft // 2 + 1,
        num_mel_filters=config.feature_size,
        min_frequency=0.0,
        max_frequency=config.sampling_rate / 2,
        sampling_rate=config.sampling_rate,
        norm="slaney",
        mel_scale="slaney",
        dtype=np.float32,
    )
    np.testing.assert_array_equal(mel_filters(config), expected.T)


def test_log_mel_rejects_bad_input() -> None:
    clips = waveforms([4000], RATE, seed=2)
    with pytest.raises(ValueError, match="16000 Hz"):
        log_mel_features(clips, 44100, LogMelConfig())
    with pytest.raises(ValueError, match="two valid frames"):
        log_mel_features([np.zeros(300, np.float32)], RATE, LogMelConfig())
    with pytest.raises(ValueError, match="mono"):
        log_mel_features([np.zeros((2, 4000), np.float32)], RATE, LogMelConfig())


def test_subsampled_lengths_match_reference() -> None:
    model = make_omni_audio(WIDER_AUDIO)
    spec = OmniAudioConfig.from_dict(model.config.to_dict()).encoder
    lengths = np.arange(0, 70, dtype=np.int64)
    expected = model.audio_tower._get_subsampling_output_length(torch.from_numpy(lengths))

    def emit(op: OpBuilder, x: ir.Value) -> ir.Value:
        return subsampled_lengths(op, x, spec)

    (actual,) = run_emitter(emit, [lengths])
    np.testing.assert_array_equal(actual, expected.numpy())


def test_config_reads_both_spellings() -> None:
    """audio_config and the released sound_config (model_type "parakeet") give one config; the
    Omni defaults (no attention bias, no input scaling) apply when the fields are absent."""
    current = omni_audio_config(WIDER_AUDIO).to_dict()
    released = {k: v for k, v in current.items() if k != "audio_config"}
    released["sound_config"] = {"model_type": "parakeet", **WIDER_AUDIO}
    config = OmniAudioConfig.from_dict(current)
    assert OmniAudioConfig.from_dict(released) == config
    assert not config.encoder.attention_bias and not config.encoder.scale_input
    assert config.encoder.subsampling_layers == 3 and config.encoder.subsampled_mel_bins == 3
    assert (config.projection_hidden_size, config.text_hidden_size) == (28, 24)
    small = OmniAudioConfig.from_dict(omni_audio_config(SMALL_AUDIO).to_dict()).encoder
    assert small.attention_bias and small.scale_input
    # ParakeetEncoderConfig's own defaults differ from the Omni ones
    assert ParakeetSpec.from_dict({}).attention_bias and ParakeetSpec.from_dict({}).scale_input
    with pytest.raises(ValueError, match="audio_config"):
        OmniAudioConfig.from_dict({k: v for k, v in current.items() if k != "audio_config"})
    with pytest.raises(ValueError, match="num_mel_bins"):
        OmniAudioConfig.from_dict({**current, "audio_config": {**WIDER_AUDIO, "num_mel_bins": 20}})
    with pytest.raises(ValueError, match="projection_hidden_size"):
        bad = {k: v for k, v in WIDER_AUDIO.items() if k != "projection_hidden_size"}
        OmniAudioConfig.from_dict({**current, "audio_config": bad})


def test_bf16_graph_is_valid() -> None:
    """The BF16 graph passes the ONNX checker with full shape inference (CPU ORT lacks BF16
    kernels for Gemm/Conv, so its numbers are checked where a GPU is available, not here)."""
    import onnx

    model = build_audio_graph(
        OmniAudioConfig.from_dict(omni_audio_config(SMALL_AUDIO).to_dict()),
        BuildContext.dense("bf16"),
    )
    for value in model.graph.initializers.values():
        assert value.dtype == ir.DataType.BFLOAT16
        value.const_value = ir.tensor(
            np.zeros(tuple(value.shape), dtype=ml_dtypes.bfloat16), name=value.name
        )
    onnx.checker.check_model(ir.serde.serialize_model(model), full_check=True)
