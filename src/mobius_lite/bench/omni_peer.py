"""An Omni package as the package peer: each media encoder timed on synthetic inputs, then the
prompt through the embedding graph and the decoder (OmniSession), one embedded token per
decode call, as `mobius generate` runs it."""

from __future__ import annotations

from typing import Any

import numpy as np

from mobius_lite.bench.measure import Tick, Timed, timed_call
from mobius_lite.bench.package_peer import argmax_last, session_options
from mobius_lite.configs.omni_vision import OmniVisionConfig
from mobius_lite.enums import GraphRole
from mobius_lite.io_contract import (
    IMAGE_GRID_HW,
    INPUT_FEATURES,
    INPUT_FEATURES_MASK,
    PIXEL_VALUES,
    PIXEL_VALUES_VIDEOS,
)
from mobius_lite.run.omni_session import OmniSession
from mobius_lite.run.ort_session import create_session, input_dtypes, session_providers
from mobius_lite.run.package_reader import PackageFiles

ENCODERS = (GraphRole.VISION_ENCODER, GraphRole.VIDEO_ENCODER, GraphRole.AUDIO_ENCODER)
IMAGE_SIDE, VIDEO_SIDE, VIDEO_FRAMES, AUDIO_FRAMES = 512, 256, 8, 1000  # 1000 frames: 10 s


def _side(largest: int, patch: int, wanted: int) -> int:
    """An image side of at most `wanted` pixels (and the tower's largest) that holds an even
    number of patches (the projector merges 2x2 patches)."""
    side = min(wanted, largest)
    return max(2 * patch, side // (2 * patch) * 2 * patch)


def synthetic_inputs(vision: OmniVisionConfig, mel_bins: int | None) -> dict[GraphRole, dict]:
    """Random inputs of each encoder, sized from the package's parsed vision tower: one image
    of up to 512x512, a video of 8 frames of up to 256x256, a 10 s audio clip (100 mel frames a
    second). Speed does not depend on the values; the sizes are in the peer's description."""
    radio = vision.radio
    patch, largest = radio.patch_size, radio.max_grid * radio.patch_size
    temporal = radio.video_temporal_patch_size or 2
    rng = np.random.default_rng(0)
    image, video = _side(largest, patch, IMAGE_SIDE), _side(largest, patch, VIDEO_SIDE)
    grid = image // patch
    inputs: dict[GraphRole, dict] = {
        GraphRole.VISION_ENCODER: {
            PIXEL_VALUES: rng.standard_normal((grid * grid, radio.patch_dim)),
            IMAGE_GRID_HW: np.array([[grid, grid]], dtype=np.int64),
        },
        GraphRole.VIDEO_ENCODER: {
            PIXEL_VALUES_VIDEOS: rng.standard_normal(
                (1, VIDEO_FRAMES // temporal, radio.num_channels * temporal, video, video)
            ),
        },
    }
    if mel_bins is not None:
        inputs[GraphRole.AUDIO_ENCODER] = {
            INPUT_FEATURES: rng.standard_normal((1, AUDIO_FRAMES, mel_bins)),
            INPUT_FEATURES_MASK: np.ones((1, AUDIO_FRAMES), dtype=np.int64),
        }
    return inputs


def describe_inputs(inputs: dict[GraphRole, dict]) -> str:
    parts = []
    for role, feeds in inputs.items():
        if role is GraphRole.VISION_ENCODER:
            (h, w) = feeds[IMAGE_GRID_HW][0]
            patch = int(round((feeds[PIXEL_VALUES].shape[1] / 3) ** 0.5))
            parts.append(f"image {h * patch}x{w * patch}")
        elif role is GraphRole.VIDEO_ENCODER:
            _, tubelets, channels, h, w = feeds[PIXEL_VALUES_VIDEOS].shape
            parts.append(f"video {tubelets * channels // 3} frames {h}x{w}")
        else:
            parts.append(f"audio {feeds[INPUT_FEATURES].shape[1]} mel frames")
    return ", ".join(parts)


class OmniPeer:
    """An Omni package on onnxruntime: encoders, embedding graph and decoder."""

    name = "package"

    def __init__(self, files: PackageFiles, ep: str, threads: int, decode_tokens: int) -> None:
        self.files = files
        self.providers = session_providers(ep)
        self.threads = threads
        self.roles = [role for role in ENCODERS if role.value in files.graphs]
        self.calls_per_pass = 1 + decode_tokens + len(self.roles)
        self.description = f"{files.directory} (Omni) on onnxruntime {self.providers[0]}"
        self.omni: OmniSession | None = None
        self.encoders: dict[GraphRole, tuple[Any, dict[str, np.ndarray]]] = {}

    def open(self) -> None:
        options = session_options(self.threads)
        self.omni = OmniSession(self.files.directory, self.providers, options)
        mel_bins = self.omni.audio_mel_bins if GraphRole.AUDIO_ENCODER in self.roles else None
        inputs = synthetic_inputs(self.omni.config.vision_tower, mel_bins)
        for role in self.roles:
            session = create_session(self.files.graph(role), self.providers, options)
            dtypes = input_dtypes(session)
            feeds = {k: v.astype(dtypes[k], copy=False) for k, v in inputs[role].items()}
            self.encoders[role] = (session, feeds)
        self.description += f"; encoders on {describe_inputs({r: inputs[r] for r in self.roles})}"

    def vocab_size(self) -> int | None:
        return self.omni.decoder.vocab_size if self.omni is not None else None

    def run(self, prompt: list[int], decode_tokens: int, tick: Tick) -> Timed:
        omni = self.omni
        assert omni is not None, "open() first"
        encoders_s = {}
        for role, (session, feeds) in self.encoders.items():
            _, encoders_s[role.value] = timed_call(
                lambda session=session, feeds=feeds: session.run(None, feeds)
            )
            tick()
        decoder = omni.decoder
        decoder.reset(1)
        ids = np.array([prompt], dtype=np.int64)
        out, prefill_s = timed_call(lambda: decoder.step(omni.embed(ids), logits_to_keep=1))
        tick()
        tokens, decode_s = [argmax_last(out)], []
        for _ in range(decode_tokens):
            token = tokens[-1]
            out, seconds = timed_call(
                lambda token=token: decoder.step(omni.embed_token(token), logits_to_keep=1)
            )
            tick()
            decode_s.append(seconds)
            tokens.append(argmax_last(out))
        return Timed(prefill_s, decode_s, tokens, encoders_s)
