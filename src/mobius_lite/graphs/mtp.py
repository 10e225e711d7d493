"""The multi-token-prediction head's graph, mtp.onnx, and its I/O contract
(docs/decoder_contract.md, "The multi-token-prediction head")."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_lite.components.context import BuildContext, apply_weight_formats
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import Activations, DraftHead, GraphId, GraphRole
from mobius_lite.errors import ConfigError
from mobius_lite.graphs.builder import graph_value, name_output, new_graph, to_model
from mobius_lite.graphs.cache import BATCH, mtp_cache_tensors
from mobius_lite.graphs.decoder import logits_to_keep_input
from mobius_lite.graphs.draft_int8 import INT8_MATMUL, draft_int8_weights, mark_draft_int8
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    HIDDEN_STATES,
    INPUT_IDS,
    LOGITS,
    MTP_HIDDEN_STATES,
)
from mobius_lite.models.nemotron_h_mtp import NemotronHMTPForCausalLM


def build_mtp(
    config: NemotronHConfig,
    ctx: BuildContext | None = None,
    *,
    logits_from_embeddings: bool = False,
    depth: int = 0,
) -> tuple[ir.Model, NemotronHMTPForCausalLM]:
    """Build mtp.onnx, or a later depth's graph of a head of distinct depths (`depth` >= 1,
    enums.GraphId), weights not yet bound: (input_ids, hidden_states, attention_mask,
    past_key_values.mtp.*, logits_to_keep) -> (logits, present.mtp.*, mtp_hidden_states).
    logits_to_keep is the decoder's optional input (default 0: every position): a draft
    needs the last position's logits only, and a head catching up on many positions would
    otherwise run its lm_head, and its experts, over every one of them. Unlike the
    decoder's, it also keeps mtp_hidden_states to those positions (models/nemotron_h_mtp.py),
    except in a depth that feeds a further one: there mtp_hidden_states has every position.

    The arguments mean what they mean for build_decoder; the head's weight slots resolve
    their formats by their checkpoint names (mtp.layers.*, backbone.embeddings.weight,
    lm_head.weight) as the decoder's do.
    """
    ctx = ctx or BuildContext.dense()
    dtype = ctx.dtype
    module = NemotronHMTPForCausalLM(config, ctx, logits_from_embeddings, depth)
    apply_weight_formats(module, ctx)

    hidden = config.hidden_size
    ids = graph_value(INPUT_IDS, ir.DataType.INT64, (BATCH, "sequence"))
    states = graph_value(HIDDEN_STATES, dtype, (BATCH, "sequence", hidden))
    mask = graph_value(ATTENTION_MASK, ir.DataType.INT64, (BATCH, "total_sequence"))
    cache = mtp_cache_tensors(config, dtype, depth)
    past = {c.past_name: graph_value(c.past_name, c.dtype, c.past_shape) for c in cache}

    keep = logits_to_keep_input()

    name = "nemotron_h_mtp" if not depth else f"nemotron_h_mtp_depth{depth}"
    graph = new_graph(name, [ids, states, mask, *past.values(), keep])
    graph.register_initializer(keep)
    op = GraphBuilder(graph).op
    logits, presents, head_hidden = module(op, ids, states, mask, past, keep)

    logits_shape = (BATCH, "logits_sequence", config.vocab_size)
    outputs = [name_output(logits, LOGITS, ir.DataType.FLOAT, logits_shape)]
    for c in cache:
        outputs.append(
            name_output(presents[c.present_name], c.present_name, c.dtype, c.present_shape)
        )
    per_sequence = op.Reshape(
        head_hidden,
        op.Concat(op.Slice(op.Shape(ids), [0], [1]), op.Constant(value_ints=[-1, hidden]), axis=0),
    )
    # the positions the logits keep, or every position for a depth that feeds the next
    hidden_shape = (BATCH, "sequence" if module.every_hidden else "logits_sequence", hidden)
    outputs.append(name_output(per_sequence, MTP_HIDDEN_STATES, dtype, hidden_shape))
    graph.outputs.extend(outputs)
    return to_model(graph), module


def build_head_graphs(
    config: NemotronHConfig,
    ctx: BuildContext,
    *,
    logits_from_embeddings: bool,
    draft_head: DraftHead,
) -> list[tuple[GraphId, ir.Model]]:
    """The head's graphs on the `draft_head` route: mtp.onnx, and for a head of distinct
    depths (mtp_use_repeated_layer false) one more graph per further depth, each binding its
    own blocks (mtp.layers.{d * B ..}) and the shared embedding table and lm_head."""
    graphs = []
    for depth in range(config.mtp_depths):
        model, _ = build_mtp(
            config, ctx, logits_from_embeddings=logits_from_embeddings, depth=depth
        )
        apply_draft_head(model, draft_head)
        graphs.append((GraphId(GraphRole.MTP, depth), model))
    return graphs


def make_fast_head(graph: ir.Graph) -> int:
    """Put the head's packed matmuls (MatMulNBits, subgraphs included) on int8 activations
    (accuracy_level 4), a fast draft head (enums.DraftHead.FAST): the same initializers, so
    the lm_head the decoder shares stays stored once. Returns how many nodes moved."""
    moved = 0
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                moved += make_fast_head(attr.value)
        if node.op_type == INT8_MATMUL:
            level = Activations.INT8.accuracy_level
            node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", level)
            moved += 1
    return moved


def apply_draft_head(model: ir.Model, route: DraftHead) -> None:
    """The head on its route: unchanged when exact. A fast head computes with int8
    activations: its packed matmuls at accuracy_level 4, and its dense projections listed for
    the session to re-lay as int8 blocks (graphs/draft_int8.py). A ConfigError (raised before
    any weight is read) when it has neither."""
    if route is not DraftHead.FAST:
        return
    moved = make_fast_head(model.graph)
    dense = draft_int8_weights(model.graph)
    if dense:
        mark_draft_int8(model, dense)
    if not moved and not dense:
        raise ConfigError(
            "a fast draft head computes its projections on int8 blocks, and this head has "
            "none that hold whole 32-element blocks (packed, or dense float32 rows); build "
            "the exact head"
        )
