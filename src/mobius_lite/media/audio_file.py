"""Reading audio clips for the Omni audio encoder: 16-bit PCM WAV files, mono, at the feature
extractor's sampling rate (no resampling: a file at another rate is one clear error)."""

from __future__ import annotations

import struct
import wave
from pathlib import Path

import numpy as np

from mobius_lite.errors import MobiusError


def load_wav(path: str | Path, sampling_rate: int) -> np.ndarray:
    """A mono 16-bit PCM WAV file as float32 samples in [-1, 1). A file that is not a WAV, is
    cut short (fewer sample bytes than its header declares) or holds another format is one
    MobiusError saying which."""
    path = Path(path)
    if not path.is_file():
        raise MobiusError(f"{path}: no such audio file")
    size = path.stat().st_size
    try:
        with wave.open(str(path), "rb") as handle:
            rate, channels, width = (
                handle.getframerate(),
                handle.getnchannels(),
                handle.getsampwidth(),
            )
            declared = handle.getnframes()
            data = handle.readframes(declared)
    except EOFError:
        raise MobiusError(
            f"{path}: not a readable WAV file (it ends inside its header: {size} bytes); give "
            "a complete 16-bit PCM WAV file"
        ) from None
    except (OSError, wave.Error, RuntimeError, ValueError, struct.error) as exc:
        reason = str(exc) or type(exc).__name__
        raise MobiusError(
            f"{path}: not a readable WAV file ({reason}); give a 16-bit PCM WAV file"
        ) from None
    if rate != sampling_rate:
        raise MobiusError(
            f"{path} is sampled at {rate} Hz; the audio encoder expects {sampling_rate} Hz. "
            f"Resample it first (e.g. sox in.wav -r {sampling_rate} out.wav)"
        )
    if channels != 1:
        raise MobiusError(f"{path} has {channels} channels; give a mono clip (sox in.wav -c 1 ...)")
    if width != 2:
        raise MobiusError(f"{path} holds {8 * width}-bit samples; give 16-bit PCM")
    frames = len(data) // (channels * width)
    if frames < declared:
        raise MobiusError(
            f"{path} is truncated: its header declares {declared} samples but the file holds "
            f"{frames} ({size} bytes); the file was cut short, copy or record it again"
        )
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0
