"""Run an Omni package: the media encoders, the embedding graph and the decoder, chained.

OmniSession does on the host what transformers' NemotronH_Omni forward does around its
modules: placeholder accounting (the number of placeholder tokens must equal the number of
feature rows of that modality, checked before anything runs), efficient video sampling (the
video graph's retention mask drops pruned placeholder positions from input_ids, embeddings and
attention mask alike, so the decoder sees the shorter sequence), the decoder cache, and greedy
decoding (cached steps have no media: the embedding graph gets 0-row features).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs.omni import OmniConfig
from mobius_lite.configs.omni_audio import ParakeetSpec
from mobius_lite.enums import GraphRole
from mobius_lite.errors import MobiusError
from mobius_lite.io_contract import (
    AUDIO_FEATURES,
    IMAGE_FEATURES,
    IMAGE_GRID_HW,
    INPUT_FEATURES,
    INPUT_FEATURES_MASK,
    INPUT_IDS,
    INPUTS_EMBEDS,
    PIXEL_VALUES,
    PIXEL_VALUES_VIDEOS,
)
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import Generation, check_prompt, greedy, greedy_tokens, stop_token_ids
from mobius_lite.run.mtp_head import open_head
from mobius_lite.run.ort_session import (
    CPU,
    create_session,
    input_dtypes,
    on_shared_pool,
    shares_pool,
)
from mobius_lite.run.package_reader import open_package
from mobius_lite.run.speculative import (
    SpeculationOptions,
    SpeculationStats,
    speculative_greedy,
)
from mobius_lite.sources.config_json import read_config_json


class PlaceholderError(MobiusError, ValueError):
    """The prompt's placeholder tokens and the media's feature rows do not match."""


@dataclass
class Media:
    """What the processors produce for one prompt (any of them may be absent).

    images: pixel_values [total_patches, 3 * p * p] and image_grid_hw [num_images, 2];
    video: pixel_values_videos [1, num_tubelets, 2 * 3, H, W];
    audio: input_features [clips, frames, mel] and input_features_mask [clips, frames].
    """

    pixel_values: np.ndarray | None = None
    image_grid_hw: np.ndarray | None = None
    pixel_values_videos: np.ndarray | None = None
    input_features: np.ndarray | None = None
    input_features_mask: np.ndarray | None = None


@dataclass
class Prepared:
    """The prompt after media: the ids the decoder sees, their embeddings, and evidence."""

    input_ids: np.ndarray
    inputs_embeds: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)
    video_retention_mask: np.ndarray | None = None


class OmniSession:
    """onnxruntime sessions over an Omni package's graphs."""

    def __init__(
        self,
        package_dir: str | Path,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        self.directory = Path(package_dir)
        self.session_options = session_options  # every graph's (threads, profiling), or None
        self.files = open_package(self.directory)  # every graph and data file, before a session
        self.config = OmniConfig.from_dict(read_config_json(self.directory / CONFIG_FILE))
        self.providers = providers or [CPU]
        self._sessions: dict[GraphRole, Any] = {}
        self._inputs: dict[GraphRole, dict[str, np.dtype]] = {}
        self.decoder = DecoderSession(
            self.files.graph(GraphRole.DECODER), self.providers, session_options
        )
        self.hidden = self.config.text.hidden_size
        self.embedding_inputs = set(self._input_dtypes(GraphRole.EMBEDDING))
        # media features enter the embedding graph in its own element type
        self.feature_dtype = next(
            (
                self._inputs[GraphRole.EMBEDDING][n]
                for n in (IMAGE_FEATURES, AUDIO_FEATURES)
                if n in self.embedding_inputs
            ),
            self.decoder.inputs.get(INPUTS_EMBEDS, np.dtype(np.float32)),
        )

    def _graph(self, role: GraphRole) -> Any:
        if role not in self._sessions:
            self._sessions[role] = create_session(
                self.files.graph(role), self.providers, self.session_options
            )
            self._inputs[role] = input_dtypes(self._sessions[role])
        return self._sessions[role]

    def _input_dtypes(self, role: GraphRole) -> dict[str, np.dtype]:
        self._graph(role)
        return self._inputs[role]

    def _run(self, role: GraphRole, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Run one graph, each feed cast to the element type the graph declares for it."""
        dtypes = self._input_dtypes(role)
        cast = {
            k: np.asarray(v).astype(dtypes.get(k, np.asarray(v).dtype), copy=False)
            for k, v in feeds.items()
        }
        return self._graph(role).run(None, cast)

    def _empty(self) -> np.ndarray:
        return np.zeros((0, self.hidden), dtype=self.feature_dtype)

    def prepare(self, input_ids: np.ndarray, media: Media | None = None) -> Prepared:
        """Encode the media, apply efficient video sampling and merge into embeddings."""
        media = media or Media()
        ids = np.asarray(input_ids, dtype=np.int64)
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise PlaceholderError(
                f"input_ids must be [1, sequence] (one prompt with media), found {ids.shape}"
            )
        check_prompt(ids)
        features = {IMAGE_FEATURES: self._empty(), AUDIO_FEATURES: self._empty()}
        keep = None
        image_token = self.config.image_token_id
        if media.pixel_values is not None and media.pixel_values_videos is not None:
            raise PlaceholderError(
                "a prompt holds images or a video, not both: their placeholders share the "
                f"image token {image_token} (as in transformers)"
            )
        if media.pixel_values is not None:
            if media.image_grid_hw is None:
                raise PlaceholderError("pixel_values given without image_grid_hw")
            grid = np.asarray(media.image_grid_hw, dtype=np.int64)
            patches = int(grid.prod(-1).sum())
            if patches != media.pixel_values.shape[0]:
                raise PlaceholderError(
                    f"pixel_values holds {media.pixel_values.shape[0]} patches but "
                    f"image_grid_hw describes {patches}"
                )
            features[IMAGE_FEATURES] = self._run(
                GraphRole.VISION_ENCODER,
                {PIXEL_VALUES: media.pixel_values, IMAGE_GRID_HW: grid},
            )[0]
        if media.pixel_values_videos is not None:
            video, keep = self._run(
                GraphRole.VIDEO_ENCODER,
                {PIXEL_VALUES_VIDEOS: media.pixel_values_videos},
            )
            positions = np.flatnonzero(ids[0] == image_token)
            _check_count("video", image_token, len(positions), video.shape[0])
            retained = np.ones(ids.shape[1], dtype=bool)
            retained[positions] = keep
            ids = ids[:, retained]
            features[IMAGE_FEATURES] = video[keep]
        if media.input_features is not None:
            self._require_audio()
            mask = media.input_features_mask
            if mask is None:
                mask = np.ones(media.input_features.shape[:2], dtype=np.int64)
            features[AUDIO_FEATURES] = self._run(
                GraphRole.AUDIO_ENCODER,
                {
                    INPUT_FEATURES: media.input_features,
                    INPUT_FEATURES_MASK: np.asarray(mask, np.int64),
                },
            )[0]
        _check_count(
            "image", image_token, int((ids == image_token).sum()), len(features[IMAGE_FEATURES])
        )
        if AUDIO_FEATURES in self.embedding_inputs:
            audio_token = self.config.audio_token_id
            _check_count(
                "audio", audio_token, int((ids == audio_token).sum()), len(features[AUDIO_FEATURES])
            )
        embeds = self.embed(ids, features)
        return Prepared(ids, embeds, features, keep)

    def _require_audio(self) -> None:
        """PlaceholderError (one line) for audio given to a package without an audio encoder."""
        if AUDIO_FEATURES not in self.embedding_inputs:
            raise PlaceholderError(
                "this package has no audio encoder (its checkpoint had none): give no audio"
            )

    def _audio_spec(self) -> ParakeetSpec:
        """The audio tower's spec, parsed with the config at open; PlaceholderError for a
        package without an audio encoder."""
        self._require_audio()
        if self.config.audio_tower is None:
            raise PlaceholderError("this package's config.json has no audio_config: give no audio")
        return self.config.audio_tower.encoder

    @property
    def audio_mel_bins(self) -> int:
        """Mel bins the audio encoder takes."""
        return self._audio_spec().num_mel_bins

    def audio_token_counts(self, input_features_mask: np.ndarray) -> list[int]:
        """Feature rows the audio encoder gives each clip: the subsampled length of its mask
        sum + 1, at most the padded batch's own subsampled length (as transformers keeps)."""
        spec = self._audio_spec()
        mask = np.asarray(input_features_mask)
        cap = spec.subsampled_length(mask.shape[1])
        return [min(spec.subsampled_length(int(n) + 1), cap) for n in mask.sum(-1)]

    def embed(self, ids: np.ndarray, features: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """The embedding graph: ids with media features scattered in (0 rows: none)."""
        features = features or {}
        ids = np.asarray(ids, np.int64)
        self.decoder.check_ids(ids)
        feeds = {INPUT_IDS: ids}
        for name in (IMAGE_FEATURES, AUDIO_FEATURES):
            if name in self.embedding_inputs:
                feeds[name] = features.get(name, self._empty())
        return self._run(GraphRole.EMBEDDING, feeds)[0]

    def embed_token(self, token: int) -> np.ndarray:
        """inputs_embeds [1, 1, hidden] of one generated token (no media)."""
        return self.embed(np.array([[token]], dtype=np.int64))

    @property
    def stop_tokens(self) -> set[int]:
        """The text model's end-of-sequence ids."""
        return stop_token_ids(self.config.text.eos_token_id)

    def generate(
        self,
        input_ids: np.ndarray,
        media: Media | None = None,
        max_new_tokens: int = 16,
        stop_at_eos: bool = True,
    ) -> Generation:
        """Greedy tokens after the prompt (until an end-of-sequence id, unless not
        `stop_at_eos`), and every decoder call's outputs (prefill first; its logits for the
        last position only)."""
        prepared = self.prepare(input_ids, media)
        return greedy(
            self.decoder,
            prepared.inputs_embeds,
            max_new_tokens,
            next_input=self.embed_token,
            stop_tokens=self.stop_tokens if stop_at_eos else (),
        )

    def generate_tokens(
        self,
        input_ids: np.ndarray,
        media: Media | None = None,
        max_new_tokens: int = 16,
        stop_at_eos: bool = True,
    ) -> Iterator[int]:
        """`generate`'s tokens one at a time as they are chosen, keeping no call's outputs
        (what `mobius generate` prints as it goes)."""
        prepared = self.prepare(input_ids, media)
        yield from greedy_tokens(
            self.decoder,
            prepared.inputs_embeds,
            max_new_tokens,
            next_input=self.embed_token,
            stop_tokens=self.stop_tokens if stop_at_eos else (),
        )

    def generate_speculative(
        self,
        input_ids: np.ndarray,
        media: Media | None,
        max_new_tokens: int,
        k: int,
        stop_at_eos: bool = True,
        keep_outputs: bool = True,
        adaptive: bool = True,
    ) -> tuple[list[int], list[dict[str, np.ndarray]], SpeculationStats]:
        """`generate`'s greedy tokens, drafted up to `k` at a time (exactly `k` unless
        `adaptive`) by the package's MTP head and verified by the decoder
        (run/speculative.py); every decoder call's outputs (none unless `keep_outputs`); also
        the draft counts."""
        # on the process's shared thread pool when this session's graphs are (they take turns)
        shared = on_shared_pool() if shares_pool(self.session_options) else None
        head = open_head(self.files, self.providers, shared)
        prepared = self.prepare(input_ids, media)
        outputs: list[dict[str, np.ndarray]] = []
        options = SpeculationOptions(
            prompt_input=prepared.inputs_embeds,
            decoder_input=self.embed,
            stops=self.stop_tokens if stop_at_eos else (),
            outputs=outputs if keep_outputs else None,
            adaptive=adaptive,
        )
        tokens, stats = speculative_greedy(
            self.decoder, head, prepared.input_ids, max_new_tokens, k, options
        )
        return tokens[0], outputs, stats


def _check_count(modality: str, token: int | None, placeholders: int, rows: int) -> None:
    if placeholders != rows:
        raise PlaceholderError(
            f"the prompt has {placeholders} {modality} placeholder tokens (id {token}) but the "
            f"{modality} gives {rows} feature rows; expand each placeholder as the processor does "
            "(one token per feature row)"
        )
