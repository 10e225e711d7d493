"""Reading audio clips for the Omni audio encoder: 16-bit PCM WAV files, mono, at the feature
extractor's sampling rate (no resampling: a file at another rate is one clear error)."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np

from mobius_lite.errors import MobiusError


def load_wav(path: str | Path, sampling_rate: int) -> np.ndarray:
    """A mono 16-bit PCM WAV file as float32 samples in [-1, 1)."""
    try:
        with wave.open(str(path), "rb") as handle:
            rate, channels, width = (
                handle.getframerate(),
                handle.getnchannels(),
                handle.getsampwidth(),
            )
            data = handle.readframes(handle.getnframes())
    except (OSError, wave.Error, EOFError) as exc:
        raise MobiusError(f"{path}: not a readable WAV file ({exc})") from None
    if rate != sampling_rate:
        raise MobiusError(
            f"{path} is sampled at {rate} Hz; the audio encoder expects {sampling_rate} Hz. "
            f"Resample it first (e.g. sox in.wav -r {sampling_rate} out.wav)"
        )
    if channels != 1:
        raise MobiusError(f"{path} has {channels} channels; give a mono clip (sox in.wav -c 1 ...)")
    if width != 2:
        raise MobiusError(f"{path} holds {8 * width}-bit samples; give 16-bit PCM")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
