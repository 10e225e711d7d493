"""The decoder graph and its I/O contract (docs/decoder_contract.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_lite.components.context import BuildContext, apply_weight_formats
from mobius_lite.configs import NemotronHConfig
from mobius_lite.graphs.builder import graph_value, name_output, new_graph, to_model
from mobius_lite.graphs.cache import BATCH, CacheTensor, cache_tensors, window_inputs
from mobius_lite.graphs.state_rewind import recurrence_domain
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    HIDDEN_STATES,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LAYER_HIDDEN_PREFIX,
    LOGITS,
    LOGITS_TO_KEEP,
    RECURRENCE_DOMAIN,
    ROW_BY_ROW_WINDOW,
)
from mobius_lite.models.nemotron_h import NemotronHForCausalLM


def logits_to_keep_input() -> ir.Value:
    """The optional int64 scalar input `logits_to_keep`: logits of the last that many positions
    only. Its initializer is its default, 0 (every position), so a runtime that does not feed
    it (onnxruntime-genai) gets the contract's [batch, sequence, vocab]."""
    value = graph_value(LOGITS_TO_KEEP, ir.DataType.INT64, ())
    value.const_value = ir.tensor(np.array(0, dtype=np.int64), name=LOGITS_TO_KEEP)
    return value


def build_decoder(
    config: NemotronHConfig,
    ctx: BuildContext | None = None,
    *,
    inputs_embeds: bool = False,
    hidden_state_outputs: bool = False,
    final_hidden_output: bool = False,
    logits_from_embeddings: bool = False,
    speculation_window: int = 0,
    window_kernel: bool = False,
) -> tuple[ir.Model, NemotronHForCausalLM]:
    """Build the decoder graph (weights not yet bound: initializers have no data).

    `ctx` gives the activation precision, the weight formats by checkpoint name (dense when
    absent), the backend, how the source stores Mamba's A and the activation mode of the fused
    CPU kernels (enums.Activations); default: dense FP32.
    inputs_embeds=True makes a decoder that takes embeddings instead of ids (a runtime chains
    an embedding graph before it). hidden_state_outputs=True adds hidden_states.{i} outputs
    (per-layer block outputs in the model dtype, rows flattened to [batch * sequence, hidden]) for
    qualification; other outputs are unchanged. final_hidden_output=True adds the output
    `hidden_states` [batch, sequence, hidden] (after the final norm, every position), which
    the MTP head reads (packages with a head). logits_from_embeddings: the logits weight is
    the embedding table (models/nemotron_h_names.logits_from_embeddings decides it from the
    source). speculation_window W > 0 adds, per Mamba layer, the outputs
    window_input.{layer}.{input} [window, batch, width]: its recurrence inputs at each
    position of a call of 2..W positions, no slot otherwise (components/state_window.py), so a
    speculative runtime continues from an accepted prefix without a second decoder call
    (run/state_rewind.py); the metadata RECURRENCE_DOMAIN names the recurrence kernel's
    domain for it. window_kernel: instead, per Mamba state, present_window.{layer}.{role}
    [window, batch, ...], the state after each position, from onnxruntime's `state_window`
    attribute (ort backend, CUDA kernels only).
    """
    ctx = ctx or BuildContext.dense()
    if speculation_window:
        ctx = dataclasses.replace(
            ctx, speculation_window=speculation_window, window_kernel=window_kernel
        )
    dtype = ctx.dtype
    module = NemotronHForCausalLM(config, ctx, logits_from_embeddings)
    apply_weight_formats(module, ctx)

    if inputs_embeds:
        tokens = graph_value(INPUTS_EMBEDS, dtype, (BATCH, "sequence", config.hidden_size))
    else:
        tokens = graph_value(INPUT_IDS, ir.DataType.INT64, (BATCH, "sequence"))
    mask = graph_value(ATTENTION_MASK, ir.DataType.INT64, (BATCH, "total_sequence"))
    cache = cache_tensors(config.layers, dtype)
    past = {c.past_name: graph_value(c.past_name, c.dtype, c.past_shape) for c in cache}
    keep = logits_to_keep_input()

    graph = new_graph("nemotron_h_decoder", [tokens, mask, *past.values(), keep])
    graph.register_initializer(keep)
    builder = GraphBuilder(graph)
    logits, presents, layer_outputs, final = module(builder.op, tokens, mask, past, keep)

    logits.name = LOGITS
    logits.type = ir.TensorType(ir.DataType.FLOAT)
    logits.shape = ir.Shape([BATCH, "logits_sequence", config.vocab_size])
    outputs = [logits, *cache_outputs(builder, presents, cache, [logits])]
    inputs = window_inputs(config.layers, dtype) if speculation_window and not window_kernel else []
    if speculation_window and window_kernel:
        outputs += [
            name_output(presents[c.window_name], c.window_name, c.dtype, c.window_shape)
            for c in cache
            if c.windowed
        ]
    outputs += [name_output(presents[w.name], w.name, w.dtype, w.shape) for w in inputs]
    if final_hidden_output:
        outputs.append(final_hidden(builder, final, tokens, config.hidden_size, dtype))
    if hidden_state_outputs:
        for i, hidden in enumerate(layer_outputs):
            exposed = builder.op.Identity(hidden)
            exposed.name = f"{LAYER_HIDDEN_PREFIX}{i}"
            exposed.type = ir.TensorType(dtype)
            exposed.shape = ir.Shape(["rows", config.hidden_size])
            outputs.append(exposed)
    graph.outputs.extend(outputs)
    model = to_model(graph)
    if ctx.row_window:
        model.metadata_props[ROW_BY_ROW_WINDOW] = str(ctx.row_window)
    if inputs:  # the runtime's rewind runs the recurrence op of this domain
        model.metadata_props[RECURRENCE_DOMAIN] = recurrence_domain(ctx.backend)
    return model, module


def cache_outputs(
    builder: GraphBuilder,
    presents: dict[str, ir.Value],
    cache: list[CacheTensor],
    taken: list[ir.Value],
) -> list[ir.Value]:
    """The present.* outputs in cache order, named and typed; a value that is not a node's
    own output (a graph input, or one already an output) goes through an Identity."""
    outputs: list[ir.Value] = []
    for c in cache:
        value = presents[c.present_name]
        if value.producer() is None or value in taken or value in outputs or value.is_graph_input():
            value = builder.op.Identity(value)
        value.name = c.present_name
        value.type = ir.TensorType(c.dtype)
        value.shape = ir.Shape(list(c.present_shape))
        outputs.append(value)
    return outputs


def final_hidden(
    builder: GraphBuilder, final: ir.Value, tokens: ir.Value, width: int, dtype: ir.DataType
) -> ir.Value:
    """The `hidden_states` output: the final-normed rows [rows, width] as [batch, sequence,
    width] (the MTP head's input)."""
    op = builder.op
    shape = op.Concat(op.Slice(op.Shape(tokens), [0], [2]), op.Constant(value_ints=[width]), axis=0)
    per_sequence = op.Reshape(final, shape)
    return name_output(per_sequence, HIDDEN_STATES, dtype, (BATCH, "sequence", width))
