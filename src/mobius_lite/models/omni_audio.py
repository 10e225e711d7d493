"""Nemotron-H Omni's audio side: the Parakeet FastConformer tower (audio_tower.*) and its
projector (embed_audio.*), named like transformers' NemotronH_Omni_Reasoning_V3 (its config:
configs/omni_audio.py).

Audio graph: input_features FP32 [clips, frames, mel_bins] (log-mel features, see
mobius_lite.media.audio_features) + input_features_mask int64 [clips, frames] -> audio_features
[num_audio_tokens, text_hidden]: the clips run as one padded batch, as the reference does, and
each clip keeps its first subsampled_length(mask.sum + 1) tokens, clip after clip. The encoder's
own mask uses subsampled_length(mask.sum), so a clip can keep one token the encoder treated as
padding (its attention row is fully masked, i.e. uniform); the graph reproduces that too.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import cast_to
from mobius_lite.components.context import BuildContext
from mobius_lite.components.parakeet import (
    ParakeetEncoder,
    subsampled_lengths,
    time_mask,
)
from mobius_lite.components.projector import MultiModalProjector
from mobius_lite.components.radio import ints
from mobius_lite.configs.omni_audio import OmniAudioConfig

FLOAT = ir.DataType.FLOAT
INT64 = ir.DataType.INT64


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
