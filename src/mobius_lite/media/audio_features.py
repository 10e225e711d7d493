"""Log-mel features of 16 kHz audio for the Omni sound encoder, in numpy, computed as
transformers' ParakeetFeatureExtractor does: pad the clips to the longest, preemphasis (zeroed
past each clip's end), centred zero-padded STFT with a symmetric Hann window, power spectrum,
Slaney mel filter bank, log(x + 2^-24), per-clip per-bin normalisation over the valid frames
(unbiased variance, std + 1e-5), padded frames zeroed.

A clip of n samples gives 1 + longest // hop frames, of which n // hop are valid (the mask).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import ConfigError

LOG_GUARD = 2.0**-24  # added before the log so silence stays finite
NORM_EPS = 1e-5  # added to the standard deviation
# The Slaney mel scale: linear (3 / 200 mel per Hz) below 1 kHz, logarithmic above.
_MEL_BREAK_HZ = 1000.0
_MEL_BREAK = 15.0
_MEL_LOG_STEP = np.log(6.4) / 27.0


@dataclass(frozen=True)
class LogMelConfig:
    """The ParakeetFeatureExtractor settings (its defaults; preprocessor_config.json names)."""

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    n_fft: int = 512
    win_length: int = 400
    preemphasis: float | None = 0.97
    padding_value: float = 0.0

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> LogMelConfig:
        """A feature-extractor dict, or a processor dict holding one under "feature_extractor"."""
        nested = config.get("feature_extractor")
        if isinstance(nested, Mapping):
            config = nested
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in config.items() if k in known}
        if "preemphasis" in values and values["preemphasis"] is not None:
            values["preemphasis"] = float(values["preemphasis"])
        result = cls(**values)
        if result.win_length > result.n_fft:
            raise ValueError(f"win_length={result.win_length} exceeds n_fft={result.n_fft}")
        return result

    @classmethod
    def from_package(cls, directory: str | Path, mel_bins: int) -> LogMelConfig:
        """The feature extractor of a package's processor files; without one, the extractor's
        defaults with the audio encoder's `mel_bins`. A file disagreeing with the encoder's
        mel bins is a ConfigError."""
        for name in ("processor_config.json", "preprocessor_config.json"):
            path = Path(directory) / name
            if path.is_file():
                raw = json.loads(path.read_text())
                if "feature_extractor" in raw or "feature_extractor_type" in raw:
                    config = cls.from_dict(raw)
                    if config.feature_size != mel_bins:
                        raise ConfigError(
                            f"{path}: feature_size {config.feature_size} but the audio encoder "
                            f"takes {mel_bins} mel bins"
                        )
                    return config
        return cls(feature_size=mel_bins)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    linear = 3.0 * hz / 200.0
    with np.errstate(divide="ignore"):
        logarithmic = _MEL_BREAK + np.log(np.maximum(hz, 1e-12) / _MEL_BREAK_HZ) / _MEL_LOG_STEP
    return np.where(hz >= _MEL_BREAK_HZ, logarithmic, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    linear = 200.0 * mel / 3.0
    logarithmic = _MEL_BREAK_HZ * np.exp(_MEL_LOG_STEP * (mel - _MEL_BREAK))
    return np.where(mel >= _MEL_BREAK, logarithmic, linear)


def mel_filters(config: LogMelConfig) -> np.ndarray:
    """Slaney-normalised triangular filters on the Slaney scale, FP32 [mels, n_fft // 2 + 1].

    The triangles are built in FP64 and rounded to FP32 before the area normalisation, the
    order transformers' mel_filter_bank uses.
    """
    bins = config.n_fft // 2 + 1
    edges_mel = np.linspace(
        _hz_to_mel(np.array(0.0)),
        _hz_to_mel(np.array(config.sampling_rate / 2)),
        config.feature_size + 2,
    )
    edges = _mel_to_hz(edges_mel)
    bin_hz = np.linspace(0, config.sampling_rate // 2, bins)
    rising = (bin_hz[:, None] - edges[None, :-2]) / (edges[1:-1] - edges[:-2])
    falling = (edges[None, 2:] - bin_hz[:, None]) / (edges[2:] - edges[1:-1])
    triangles = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    triangles *= 2.0 / (edges[2:] - edges[:-2])  # equal area per band (in place: stays FP32)
    return np.ascontiguousarray(triangles.T)


def _window(config: LogMelConfig) -> np.ndarray:
    """Symmetric Hann of win_length, zero-padded to n_fft with the extra zeros split evenly."""
    n = config.win_length
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / (n - 1)) if n > 1 else np.ones(1)
    left = (config.n_fft - n) // 2
    return np.pad(hann, (left, config.n_fft - n - left))


def _power_spectrogram(signal: np.ndarray, config: LogMelConfig) -> np.ndarray:
    """[clips, samples] -> |STFT|^2 [clips, frames, n_fft // 2 + 1] (centred, zero padding)."""
    half = config.n_fft // 2
    padded = np.pad(signal.astype(np.float64), ((0, 0), (half, half)))
    frames = 1 + (padded.shape[1] - config.n_fft) // config.hop_length
    starts = np.arange(frames) * config.hop_length
    windows = padded[:, starts[:, None] + np.arange(config.n_fft)[None, :]] * _window(config)
    spectrum = np.fft.rfft(windows, axis=-1)
    return spectrum.real**2 + spectrum.imag**2


def log_mel_features(
    waveforms: Sequence[np.ndarray], sampling_rate: int, config: LogMelConfig | Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Mono clips -> (input_features FP32 [clips, frames, mels], input_features_mask int64
    [clips, frames]), the inputs of the audio graph (the extractor's mask, as 0/1)."""
    if not isinstance(config, LogMelConfig):
        config = LogMelConfig.from_dict(config)
    if sampling_rate != config.sampling_rate:
        raise ValueError(
            f"audio sampled at {sampling_rate} Hz: the feature extractor expects "
            f"{config.sampling_rate} Hz; resample the clips first"
        )
    clips = [np.asarray(w, dtype=np.float32) for w in waveforms]
    if not clips:
        raise ValueError("no waveforms given")
    for i, clip in enumerate(clips):
        if clip.ndim != 1:
            raise ValueError(f"waveform {i} has shape {clip.shape}: expected mono [samples]")
    lengths = np.array([len(c) for c in clips], dtype=np.int64)
    # valid frames: n // hop for an even n_fft (the extractor's formula)
    valid = (lengths + config.n_fft // 2 * 2 - config.n_fft) // config.hop_length
    if (valid < 2).any():
        short = int(np.flatnonzero(valid < 2)[0])
        raise ValueError(
            f"waveform {short} has {lengths[short]} samples: at least "
            f"{2 * config.hop_length + config.n_fft - config.n_fft // 2 * 2} are needed for "
            "two valid frames (the normalisation divides by frames - 1)"
        )
    signal = np.full((len(clips), lengths.max()), config.padding_value, dtype=np.float32)
    for i, clip in enumerate(clips):
        signal[i, : len(clip)] = clip
    if config.preemphasis is not None:
        emphasised = signal.copy()
        emphasised[:, 1:] = signal[:, 1:] - np.float32(config.preemphasis) * signal[:, :-1]
        signal = np.where(np.arange(signal.shape[1])[None, :] < lengths[:, None], emphasised, 0)

    mel = _power_spectrogram(signal, config) @ mel_filters(config).T.astype(np.float64)
    log_mel = np.log(mel + LOG_GUARD)  # [clips, frames, mels]
    mask = np.arange(log_mel.shape[1])[None, :] < valid[:, None]
    keep = mask[:, :, None]
    count = valid[:, None].astype(np.float64)
    mean = np.where(keep, log_mel, 0.0).sum(axis=1) / count
    centred = np.where(keep, log_mel - mean[:, None, :], 0.0)
    std = np.sqrt((centred**2).sum(axis=1) / (count - 1))
    normalised = (log_mel - mean[:, None, :]) / (std[:, None, :] + NORM_EPS)
    features = np.where(keep, normalised, 0.0).astype(np.float32)
    return features, mask.astype(np.int64)
