"""Nemotron-H Omni's audio side: the Parakeet FastConformer tower (audio_tower.*) and its
projector (embed_audio.*), named like transformers' NemotronH_Omni_Reasoning_V3, and its graph.

Audio graph: input_features FP32 [clips, frames, mel_bins] (log-mel features, see
mobius_lite.media.audio_features) + input_features_mask int64 [clips, frames] -> audio_features
[num_audio_tokens, text_hidden]: the clips run as one padded batch, as the reference does, and
each clip keeps its first subsampled_length(mask.sum + 1) tokens, clip after clip. The encoder's
own mask uses subsampled_length(mask.sum), so a clip can keep one token the encoder treated as
padding (its attention row is fully masked, i.e. uniform); the graph reproduces that too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import cast_to
from mobius_lite.components.context import BuildContext
from mobius_lite.components.parakeet import (
    ParakeetEncoder,
    ParakeetSpec,
    subsampled_lengths,
    time_mask,
)
from mobius_lite.components.projector import MultiModalProjector
from mobius_lite.components.radio import ints

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64
# What NemotronH_Omni_Reasoning_V3_Config supplies when an audio config omits them (released
# checkpoints predate the fields and mean False; ParakeetEncoderConfig itself defaults to True).
_OMNI_AUDIO_DEFAULTS = {"attention_bias": False, "scale_input": False}


@dataclass(frozen=True)
class OmniAudioConfig:
    """What the audio graph needs from an Omni config.json (audio_config, or the released
    spelling sound_config with model_type "parakeet")."""

    encoder: ParakeetSpec
    projection_hidden_size: int
    projection_bias: bool
    text_hidden_size: int

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> OmniAudioConfig:
        """Validate the audio fields of an Omni config dict; errors name the field."""
        text = config.get("text_config", config.get("llm_config"))
        if not isinstance(text, Mapping):
            raise ValueError("text_config (or llm_config) is missing")
        audio = config.get("audio_config")
        if audio is None:
            audio = config.get("sound_config")
        if audio is None:
            raise ValueError("audio_config (or sound_config) is missing: no audio tower")
        if not isinstance(audio, Mapping):
            raise ValueError("audio_config must be a mapping")
        audio = {k: v for k, v in audio.items() if k != "model_type"}
        for name in ("projection_hidden_size", "projection_bias"):
            if audio.get(name) is None:
                raise ValueError(f"audio_config.{name} is missing (the projector needs it)")
        return cls(
            encoder=ParakeetSpec.from_dict({**_OMNI_AUDIO_DEFAULTS, **audio}),
            projection_hidden_size=int(audio["projection_hidden_size"]),
            projection_bias=bool(audio["projection_bias"]),
            text_hidden_size=int(text["hidden_size"]),
        )


class OmniAudioModel(nn.Module):
    """audio_tower (ParakeetEncoder) + embed_audio (RMSNorm -> Linear -> ReLU^2 -> Linear)."""

    def __init__(self, config: OmniAudioConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.config = config
        self.ctx = ctx
        spec = config.encoder
        self.audio_tower = ParakeetEncoder(spec, ctx)
        self.embed_audio = MultiModalProjector(
            spec.hidden_size,
            config.projection_hidden_size,
            config.text_hidden_size,
            ctx,
            bias=config.projection_bias,
        )

    def forward(self, op: OpBuilder, features: ir.Value, mask: ir.Value) -> ir.Value:
        lengths = op.ReduceSum(mask, ints(op, 1), keepdims=0)
        rows, dims = self.audio_tower(op, cast_to(op, features, self.ctx.dtype), lengths)
        one = op.Constant(value=ir.tensor(1, dtype=INT64))
        kept = subsampled_lengths(op, op.Add(lengths, one), self.config.encoder)
        keep = op.Reshape(time_mask(op, kept, dims.steps), ints(op, -1))
        # (Compress has no BF16 kernel type) the projector works row by row, so dropping the
        # other rows first changes nothing
        rows = op.Gather(rows, op.Squeeze(op.NonZero(keep), ints(op, 0)), axis=0)
        return self.embed_audio(op, rows)
