"""Nemotron-H's multi-token-prediction head as onnxscript modules (vLLM's NemotronHMTP).

At position t the head fuses the embedding of token t+1 with the decoder's final-normed
hidden state at t, runs its own blocks (attention over its own cache, then MoE, each
pre-norm + residual, the decoder's components) and a final RMSNorm, and scores the result
with the decoder's lm_head: a draft of token t+2. Attribute names follow the checkpoint
(mtp.layers.{i}.{enorm, hnorm, eh_proj, norm, mixer, final_layernorm}); the embedding table
(backbone.embeddings.weight) and lm_head.weight are the decoder's, shared with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components import Embedding, Linear, RMSNorm
from mobius_lite.components.context import BuildContext
from mobius_lite.configs import LayerSpec, NemotronHConfig
from mobius_lite.errors import ConfigError
from mobius_lite.models.nemotron_h import (
    Block,
    StepInputs,
    last_positions,
    output_logits,
    step_inputs,
)


class MTPBlock(Block):
    """One head block: the decoder's Block (pre-norm, mixer, residual), with the fusion of
    embedding and hidden state before the first one and the final norm after the last one."""

    def __init__(
        self,
        layer: LayerSpec,
        config: NemotronHConfig,
        ctx: BuildContext,
        *,
        first: bool,
        last: bool,
    ) -> None:
        super().__init__(layer, config, ctx)
        hidden, eps = config.hidden_size, config.layer_norm_epsilon
        self.first = first
        self.last = last
        if first:
            self.enorm = RMSNorm(hidden, eps, ctx)
            self.hnorm = RMSNorm(hidden, eps, ctx)
            self.eh_proj = Linear(2 * hidden, hidden, False, ctx)
        if last:
            self.final_layernorm = RMSNorm(hidden, eps, ctx)

    def forward(  # type: ignore[override]
        self, op: OpBuilder, hidden: ir.Value, step: StepInputs, embeds: ir.Value | None = None
    ) -> tuple[ir.Value, dict[str, ir.Value]]:
        """hidden, embeds: [rows, hidden]; for the first block `hidden` is the decoder's
        hidden state and `embeds` the next tokens' embeddings."""
        if self.first:
            assert embeds is not None
            # vLLM's order: the normed embedding first, then the normed hidden state.
            fused = op.Concat(self.enorm(op, embeds), self.hnorm(op, hidden), axis=-1)
            hidden = self.eh_proj(op, fused)
        out, presents = super().forward(op, hidden, step)
        if self.last:
            out = self.final_layernorm(op, out)
        return out, presents


class _DepthBlocks(nn.ModuleList):
    """One depth's blocks under their checkpoint indices (mtp.layers.{first}, ...), so a
    later depth's parameter paths are the checkpoint's names."""

    def __init__(self, blocks: list[MTPBlock], first: int) -> None:
        super().__init__()
        for offset, block in enumerate(blocks):
            self._register_child(str(first + offset), block)


class MTPModel(nn.Module):
    """mtp.layers.{i}: one depth's blocks in order (mtp_layers_block_type's blocks, the first
    fusing, the last with the final norm); depth d's are mtp.layers.{d * B ..}."""

    def __init__(self, config: NemotronHConfig, ctx: BuildContext, depth: int = 0) -> None:
        super().__init__()
        self.width = config.hidden_size
        layers = config.mtp_depth_layers(depth)
        last = len(layers) - 1
        self.layers = _DepthBlocks(
            [
                MTPBlock(layer, config, ctx, first=i == 0, last=i == last)
                for i, layer in enumerate(layers)
            ],
            layers[0].index,
        )

    def forward(
        self,
        op: OpBuilder,
        hidden: ir.Value,
        embeds: ir.Value,
        step: StepInputs,
        keep: ir.Value | None = None,
    ) -> tuple[ir.Value, dict[str, ir.Value]]:
        """The head's output rows: every position's, or with `keep` (logits_to_keep) the last
        that many positions' (all when 0). The blocks after the last one with a cache (the
        MoE after the attention) then run on those positions only: the other positions'
        outputs feed nothing but their own logits, and their cache entries are made before.
        A head catching up on many positions otherwise ran its experts on each of them."""
        stateful = [i for i, block in enumerate(self.layers) if block.layer.kind.states]
        narrow_at = stateful[-1] + 1 if stateful else 0
        presents: dict[str, ir.Value] = {}
        for i, block in enumerate(self.layers):
            if keep is not None and i == narrow_at:
                hidden = last_positions(op, hidden, step.dims, keep, self.width)
                if i == 0:
                    embeds = last_positions(op, embeds, step.dims, keep, self.width)
            hidden, block_presents = block(op, hidden, step, embeds if i == 0 else None)
            presents.update(block_presents)
        if keep is not None and narrow_at == len(self.layers):
            hidden = last_positions(op, hidden, step.dims, keep, self.width)
        return hidden, presents


class _SharedEmbeddings(nn.Module):
    """backbone.embeddings: the decoder's table, which the head reads under the same name."""

    def __init__(self, config: NemotronHConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.embeddings = Embedding(config.vocab_size, config.hidden_size, ctx)

    def forward(self, op: OpBuilder, ids: ir.Value) -> ir.Value:
        return self.embeddings(op, ids)


class NemotronHMTPForCausalLM(nn.Module):
    """One depth of the head with the decoder's embeddings and lm_head (or the tied table).

    A head of distinct depths (mtp_use_repeated_layer false) is one such module per depth.
    Every depth but the last feeds the next its mtp_hidden_states at every position it runs
    (`every_hidden`): its blocks then run on all positions and only its logits keep the
    last `logits_to_keep` positions; the last depth (and a one-depth head) narrows both."""

    def __init__(
        self,
        config: NemotronHConfig,
        ctx: BuildContext,
        logits_from_embeddings: bool = False,
        depth: int = 0,
    ) -> None:
        super().__init__()
        if not config.mtp_layers:
            raise ConfigError(
                "the config declares no multi-token-prediction head (num_nextn_predict_layers "
                "is 0, or a Puzzle config without mtp_block_configs): there is no mtp graph"
            )
        if not 0 <= depth < config.mtp_depths:
            raise ConfigError(
                f"the head has {config.mtp_depths} depth(s) (num_nextn_predict_layers="
                f"{config.num_nextn_predict_layers}, mtp_use_repeated_layer="
                f"{config.mtp_use_repeated_layer}): there is no depth {depth}"
            )
        self.config = config
        self.depth = depth
        self.every_hidden = depth < config.mtp_depths - 1
        self.backbone = _SharedEmbeddings(config, ctx)
        self.mtp = MTPModel(config, ctx, depth)
        self.lm_head = (
            None
            if logits_from_embeddings
            else Linear(config.hidden_size, config.vocab_size, False, ctx)
        )

    def forward(
        self,
        op: OpBuilder,
        input_ids: ir.Value,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        past: Mapping[str, ir.Value],
        logits_to_keep: ir.Value | None = None,
    ) -> tuple[ir.Value, dict[str, ir.Value], ir.Value]:
        """input_ids [batch, seq] (tokens t+1, t+d+1 at depth d), hidden_states [batch, seq,
        hidden] (the decoder's at t, or depth d-1's mtp_hidden_states), attention_mask int64
        [batch, past + seq] (the depth's own cache), logits_to_keep: int64 scalar, logits of
        only the last that many positions (0: all).

        Returns (logits FP32 [batch, seq or kept, vocab], presents by name, the final-normed
        head output [rows, hidden]: of the kept positions, or of every position when
        `every_hidden`)."""
        step = step_inputs(op, input_ids, attention_mask, past)
        embeds = self.backbone(op, input_ids)
        rows = op.Constant(value_ints=[-1, self.config.hidden_size])
        narrow = None if self.every_hidden else logits_to_keep
        hidden, presents = self.mtp(
            op, op.Reshape(hidden_states, rows), op.Reshape(embeds, rows), step, narrow
        )
        scored = hidden
        if self.every_hidden and logits_to_keep is not None:
            scored = last_positions(op, hidden, step.dims, logits_to_keep, self.config.hidden_size)
        logits = output_logits(
            op, scored, step.dims, self.config.vocab_size, self.lm_head, self.backbone.embeddings
        )
        return logits, presents, hidden
