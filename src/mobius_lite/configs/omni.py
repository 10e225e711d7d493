"""The Nemotron-H Omni config (transformers 5.x `nemotron_h_omni`; released legacy names too):
the decoder's text config, the placeholder token ids and the towers' configs.

Everything is resolved here once, when config.json is parsed (the build's parse, an
OmniSession's open): the towers' specs by configs/omni_vision.py and omni_audio.py, every
error a ConfigError naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mobius_lite.configs.loader import decoder_type, load_text_config
from mobius_lite.configs.model_type_entry import ModelConfig, ModelType
from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.configs.omni_audio import OmniAudioConfig
from mobius_lite.configs.omni_vision import OmniVisionConfig
from mobius_lite.enums import Task
from mobius_lite.errors import ConfigError

OMNI_MODEL_TYPE = "nemotron_h_omni"
# released name -> transformers 5.x name
LEGACY_FIELDS = {
    "img_context_token_id": "image_token_id",
    "video_context_token_id": "video_token_id",
    "sound_context_token_id": "audio_token_id",
    "llm_config": "text_config",
    "sound_config": "audio_config",
    "vit_hidden_size": "vision_hidden_size",
}


def modern_omni_dict(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The config with legacy field names renamed (a modern name given too wins)."""
    out = dict(raw)
    for legacy, name in LEGACY_FIELDS.items():
        if legacy in out:
            value = out.pop(legacy)
            out.setdefault(name, value)
    return out


@dataclass(frozen=True)
class OmniConfig:
    """The Omni config: the decoder's text config, the towers' configs, the placeholder ids."""

    raw: dict[str, Any]  # modern field names
    text: NemotronHConfig
    image_token_id: int
    video_token_id: int | None
    audio_token_id: int | None
    vision_tower: OmniVisionConfig
    audio_tower: OmniAudioConfig | None  # None: the checkpoint has no audio tower

    @property
    def has_audio(self) -> bool:
        return self.audio_tower is not None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> OmniConfig:
        config = modern_omni_dict(raw)
        if config.get("model_type") != OMNI_MODEL_TYPE:
            raise ConfigError(f"model_type {config.get('model_type')!r} is not {OMNI_MODEL_TYPE!r}")
        text_raw = config.get("text_config")
        if not isinstance(text_raw, Mapping):
            raise ConfigError("text_config (llm_config) is missing from the Omni config.json")
        text_raw = dict(text_raw)
        if "model_type" not in text_raw:
            text_raw["model_type"] = decoder_type(text_raw).name
        if not isinstance(config.get("vision_config"), Mapping):
            raise ConfigError("vision_config is missing from the Omni config.json")
        image = config.get("image_token_id")
        if not isinstance(image, int):
            raise ConfigError(
                f"image_token_id (img_context_token_id) must be a token id, found {image!r}"
            )
        audio = config.get("audio_token_id")
        if config.get("audio_config") is not None and not isinstance(audio, int):
            raise ConfigError("audio_config is present but audio_token_id is not a token id")
        text = load_text_config(text_raw)
        for name, token in (("image_token_id", image), ("audio_token_id", audio)):
            if token is not None and not 0 <= token < text.vocab_size:
                raise ConfigError(
                    f"{name} {token} is outside the vocabulary [0, {text.vocab_size})"
                )
        vision_tower, audio_tower = _towers(config)
        return cls(
            config, text, image, config.get("video_token_id"), audio, vision_tower, audio_tower
        )


def _towers(config: dict[str, Any]) -> tuple[OmniVisionConfig, OmniAudioConfig | None]:
    """The vision tower's config and the audio tower's (None without audio_config); their
    ConfigErrors say they come from the Omni config.json."""
    try:
        vision = OmniVisionConfig.from_dict(config)
        has_audio = config.get("audio_config") is not None
        return vision, OmniAudioConfig.from_dict(config) if has_audio else None
    except ValueError as exc:  # a ConfigError, or a field that is not a number
        raise ConfigError(f"Omni config.json: {exc}") from None


def _text_of(config: ModelConfig) -> NemotronHConfig:
    assert isinstance(config, OmniConfig)
    return config.text


NEMOTRON_H_OMNI = ModelType(
    name=OMNI_MODEL_TYPE,
    read_config=OmniConfig.from_dict,
    task=Task.IMAGE_TEXT_TO_TEXT,
    reference="mobius_lite.evaluation.qualify_omni:omni_reference_model",
    reference_name="transformers",
    decoder=_text_of,
)
