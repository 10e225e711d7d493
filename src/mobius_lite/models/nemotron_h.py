"""The Nemotron-H causal LM as onnxscript modules: backbone.{embeddings, layers, norm_f} + lm_head.

Module attribute names follow the released checkpoint (backbone.* prefix), so every
initializer's name is the checkpoint tensor it comes from (stacked experts excepted: see
models/nemotron_h_names.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components import Attention, Embedding, Linear, Mamba2Mixer, MoE, ReLU2MLP, RMSNorm
from mobius_lite.components.common import FLOAT, Dims, to_float32
from mobius_lite.components.context import BuildContext
from mobius_lite.configs import LayerSpec, NemotronHConfig
from mobius_lite.enums import LayerKind


@dataclass
class StepInputs:
    """Per-call values every block may need, computed once at the top of the graph."""

    dims: Dims
    token_mask: ir.Value  # FP32 [rows, 1]: 1 for real tokens of this call, 0 for padding
    key_mask: ir.Value  # bool [batch, 1, 1, past + seq]
    past: Mapping[str, ir.Value]  # past_key_values.* inputs by name


def step_inputs(
    op: OpBuilder, tokens: ir.Value, attention_mask: ir.Value, past: Mapping[str, ir.Value]
) -> StepInputs:
    """The per-call values of a graph whose first input is input_ids or inputs_embeds
    ([batch, seq, ...]) and whose attention_mask is int64 [batch, past + seq]."""
    shape = op.Shape(tokens)
    dims = Dims(batch=op.Slice(shape, [0], [1]), sequence=op.Slice(shape, [1], [2]))
    current = op.Slice(attention_mask, op.Neg(dims.sequence), op.Constant(value_ints=[2**62]), [1])
    token_mask = op.Cast(op.Reshape(current, op.Constant(value_ints=[-1, 1])), to=FLOAT)
    key_mask = op.Unsqueeze(
        op.Cast(attention_mask, to=ir.DataType.BOOL), op.Constant(value_ints=[1, 2])
    )
    return StepInputs(dims=dims, token_mask=token_mask, key_mask=key_mask, past=past)


class Block(nn.Module):
    """NemotronHBlock: residual + mixer(norm(x))."""

    def __init__(self, layer: LayerSpec, config: NemotronHConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.layer = layer
        hidden = config.hidden_size
        self.norm = RMSNorm(hidden, config.layer_norm_epsilon, ctx)
        if layer.kind is LayerKind.MAMBA:
            self.mixer = Mamba2Mixer(layer.mamba, hidden, ctx)
        elif layer.kind is LayerKind.ATTENTION:
            self.mixer = Attention(layer.attention, hidden, ctx)
        elif layer.kind is LayerKind.MLP:
            self.mixer = ReLU2MLP(hidden, layer.mlp.intermediate_size, layer.mlp.bias, ctx)
        else:
            self.mixer = MoE(layer.moe, hidden, ctx)

    def forward(
        self, op: OpBuilder, hidden: ir.Value, step: StepInputs
    ) -> tuple[ir.Value, dict[str, ir.Value]]:
        i = self.layer.cache_layer
        normed = self.norm(op, hidden)
        kind = self.layer.kind
        if kind is LayerKind.MOE:  # its experts may run row by row in short calls
            return op.Add(hidden, self.mixer(op, normed, step.dims.sequence)), {}
        if not kind.states:
            return op.Add(hidden, self.mixer(op, normed)), {}
        # Stateful mixers take (x, dims, mask, *past states in role order) and return
        # (out, *present states in the same order); Mamba's also a dict of its speculation
        # window's outputs (components/state_window.py), each named by its key's window_name.
        mask = step.token_mask if kind is LayerKind.MAMBA else step.key_mask
        past = [step.past[role.past_name(i)] for role in kind.states]
        out, *states = self.mixer(op, normed, step.dims, mask, *past)
        windows = states.pop() if kind is LayerKind.MAMBA else {}
        presents = {role.present_name(i): s for role, s in zip(kind.states, states, strict=True)}
        presents.update({key.window_name(i): value for key, value in windows.items()})
        return op.Add(hidden, out), presents


class NemotronHModel(nn.Module):
    def __init__(self, config: NemotronHConfig, ctx: BuildContext) -> None:
        super().__init__()
        self.hidden_size = config.hidden_size
        self.embeddings = Embedding(config.vocab_size, config.hidden_size, ctx)
        self.layers = nn.ModuleList([Block(layer, config, ctx) for layer in config.layers])
        self.norm_f = RMSNorm(config.hidden_size, config.layer_norm_epsilon, ctx)

    def forward(
        self, op: OpBuilder, tokens: ir.Value, step: StepInputs
    ) -> tuple[ir.Value, dict[str, ir.Value], list[ir.Value]]:
        """tokens: input_ids [batch, seq] (int64) or inputs_embeds [batch, seq, hidden]
        -> (final normed hidden [rows, hidden], presents, per-layer outputs)."""
        if tokens.dtype == ir.DataType.INT64:
            tokens = self.embeddings(op, tokens)
        hidden = op.Reshape(tokens, op.Constant(value_ints=[-1, self.hidden_size]))
        presents: dict[str, ir.Value] = {}
        layer_outputs: list[ir.Value] = []
        for block in self.layers:
            hidden, block_presents = block(op, hidden, step)
            presents.update(block_presents)
            layer_outputs.append(hidden)
        return self.norm_f(op, hidden), presents, layer_outputs


class NemotronHForCausalLM(nn.Module):
    def __init__(
        self, config: NemotronHConfig, ctx: BuildContext, logits_from_embeddings: bool = False
    ) -> None:
        """logits_from_embeddings: compute logits with the embedding table (a tied checkpoint
        without lm_head.weight; see nemotron_h_names.logits_from_embeddings)."""
        super().__init__()
        self.config = config
        self.backbone = NemotronHModel(config, ctx)
        self.lm_head = (
            None
            if logits_from_embeddings
            else Linear(config.hidden_size, config.vocab_size, False, ctx)
        )

    def forward(
        self,
        op: OpBuilder,
        tokens: ir.Value,
        attention_mask: ir.Value,
        past: Mapping[str, ir.Value],
        logits_to_keep: ir.Value | None = None,
    ) -> tuple[ir.Value, dict[str, ir.Value], list[ir.Value], ir.Value]:
        """tokens: input_ids or inputs_embeds; attention_mask: int64 [batch, past + seq];
        logits_to_keep: int64 scalar, logits of only the last that many positions (0: all).

        Returns (logits FP32 [batch, kept, vocab], presents by name, per-layer hidden outputs,
        the final-normed hidden of every position [rows, hidden]).
        """
        step = step_inputs(op, tokens, attention_mask, past)
        dims = step.dims
        final, presents, layer_outputs = self.backbone(op, tokens, step)
        hidden = final
        if logits_to_keep is not None:
            hidden = last_positions(op, hidden, dims, logits_to_keep, self.config.hidden_size)
        logits = self.logits(op, hidden, dims)
        return logits, presents, layer_outputs, final

    def logits(self, op: OpBuilder, hidden: ir.Value, dims: Dims) -> ir.Value:
        return output_logits(
            op, hidden, dims, self.config.vocab_size, self.lm_head, self.backbone.embeddings
        )


def output_logits(
    op: OpBuilder,
    hidden: ir.Value,
    dims: Dims,
    vocab: int,
    lm_head: Linear | None,
    embeddings: Embedding,
) -> ir.Value:
    """hidden [rows, hidden] -> FP32 logits [batch, rows / batch, vocab], with lm_head, or
    the embedding table when there is none (tied)."""
    logits = lm_head(op, hidden) if lm_head is not None else embeddings.logits(op, hidden)
    return op.Reshape(
        to_float32(op, logits), op.Concat(dims.batch, op.Constant(value_ints=[-1, vocab]), axis=0)
    )


def last_positions(
    op: OpBuilder, hidden: ir.Value, dims: Dims, keep: ir.Value, width: int
) -> ir.Value:
    """The rows of the last `keep` positions of every sequence ([rows, width] in, batch-major);
    all of them when keep is 0 or less, or not below the sequence length. Generation needs one
    position's logits; the lm_head over the others was a quarter of a 128-token prefill of the
    benchmark model (docs/performance.md)."""
    keep = op.Reshape(keep, op.Constant(value_ints=[1]))
    zero = op.Constant(value_ints=[0])
    start = op.Where(op.Greater(keep, zero), op.Max(op.Sub(dims.sequence, keep), zero), zero)
    per_sequence = op.Reshape(hidden, dims.shape(op, width))
    kept = op.Slice(
        per_sequence, start, op.Constant(value_ints=[2**62]), op.Constant(value_ints=[1])
    )
    return op.Reshape(kept, op.Constant(value_ints=[-1, width]))
