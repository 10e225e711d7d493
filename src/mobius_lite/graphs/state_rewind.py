"""The state rewind graph: what re-derives a Mamba layer's SSM state after an accepted prefix
of a speculative verifying call, from the call's past state and its window inputs
(components/state_window.py). It has no weights: the runtime builds it from the decoder's
own cache inputs when the first rejected draft needs it (run/state_rewind.py), so a package
carries no second graph for it.

Per Mamba layer: past_key_values.{layer}.recurrent_state [batch, heads, state, head_dim] (the
cache dtype) and window_input.{layer}.key / .value / .decay [kept, batch, width] (FP32) in,
present.{layer}.recurrent_state out: one call of the decoder's own recurrence op
(mamba2.gated_recurrence, in the domain the decoder's metadata names) over the kept
positions. The key stands in for the query: the output `y` is not used, and the state does
not depend on the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_lite.components.common import FLOAT, cast_to, to_float32
from mobius_lite.components.mamba2 import gated_recurrence
from mobius_lite.components.state_window import SSD_INPUTS, positions_first, ssd_input_widths
from mobius_lite.enums import Backend, StateRole
from mobius_lite.formats.contrib import CONTRIB_DOMAIN, is_ort
from mobius_lite.graphs.builder import graph_value, name_output, new_graph, to_model

# The default ONNX domain, as a decoder's RECURRENCE_DOMAIN metadata spells it.
ONNX_DOMAIN = "ai.onnx"


def recurrence_domain(backend: Backend) -> str:
    """The domain of the recurrence op a decoder of `backend` runs (mamba2.Mamba2Mixer)."""
    return CONTRIB_DOMAIN if is_ort(backend) else ONNX_DOMAIN


@dataclass(frozen=True)
class RewindLayer:
    """One Mamba layer's SSM state: its layer name ("3") and the cache input's layout."""

    layer: str
    heads: int
    state_size: int
    head_dim: int
    dtype: ir.DataType  # the SSM cache's element type

    @property
    def state_shape(self) -> tuple[int | str, ...]:
        return ("batch", self.heads, self.state_size, self.head_dim)


def build_state_rewind(layers: Sequence[RewindLayer], domain: str) -> ir.Model:
    """The rewind graph of `layers` (module doc); `domain`: the decoder's RECURRENCE_DOMAIN."""
    if domain not in (CONTRIB_DOMAIN, ONNX_DOMAIN):
        raise ValueError(f"unknown recurrence domain {domain!r}")
    contrib = domain == CONTRIB_DOMAIN
    inputs: list[ir.Value] = []
    for spec in layers:
        past = StateRole.RECURRENT.past_name(spec.layer)
        inputs.append(graph_value(past, spec.dtype, spec.state_shape))
        widths = ssd_input_widths(spec.heads, spec.state_size, spec.head_dim)
        inputs += [
            graph_value(which.window_name(spec.layer), FLOAT, ("kept", "batch", width))
            for which, width in widths.items()
        ]
    graph = new_graph("mamba_state_rewind", inputs)
    op = GraphBuilder(graph).op
    per_layer = 1 + len(SSD_INPUTS)
    for i, spec in enumerate(layers):
        past, key, value, decay = inputs[i * per_layer : (i + 1) * per_layer]
        key, value, decay = (positions_first(op, v) for v in (key, value, decay))
        operands = (key, key, value, decay, to_float32(op, past))
        _, present = gated_recurrence(op, *operands, spec.heads, contrib)
        name = StateRole.RECURRENT.present_name(spec.layer)
        present = cast_to(op, present, spec.dtype)
        graph.outputs.append(name_output(present, name, spec.dtype, spec.state_shape))
    return to_model(graph)
