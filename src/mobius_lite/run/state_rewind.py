"""The runtime side of a speculative verifying call's window inputs: the Mamba states after an
accepted prefix of the call, re-derived from the call's past states and the recurrence inputs
it returned per position (components/state_window.py). The conv state is the last kernel - 1
inputs up to the prefix's end (a copy); the SSM states come from one run of the weightless
rewind graph (graphs/state_rewind.py), built here from the decoder's own cache inputs, on the
decoder's execution provider, when the first rejected draft needs it. Requires the `runtime`
extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_lite.components.state_window import SSD_INPUTS
from mobius_lite.enums import RecurrenceInput, StateRole
from mobius_lite.graphs.state_rewind import RewindLayer, build_state_rewind
from mobius_lite.io_contract import layer_of
from mobius_lite.run.cached_session import CacheInput
from mobius_lite.run.ort_session import create_session, without_spinning


@dataclass(frozen=True)
class _Layer:
    """One Mamba layer's cache inputs, as the decoder session declares them."""

    name: str
    conv: CacheInput
    ssm: CacheInput


class StateRewind:
    """The Mamba states of a decoder with window inputs after a prefix of its last call.

    `cache`: the decoder's cache inputs; `outputs`: its output names; `domain`: its
    RECURRENCE_DOMAIN metadata; `providers`: the decoder session's.
    """

    def __init__(
        self, cache: list[CacheInput], outputs: set[str], domain: str, providers: list[str]
    ) -> None:
        by_name = {c.past_name: c for c in cache}
        self.layers: list[_Layer] = []
        for c in cache:
            layer = layer_of(c.past_name)
            ssm = by_name.get(StateRole.RECURRENT.past_name(layer))
            if c.past_name != StateRole.CONV.past_name(layer) or ssm is None:
                continue
            if all(which.window_name(layer) in outputs for which in RecurrenceInput):
                self.layers.append(_Layer(layer, c, ssm))
        self.domain = domain
        self.providers = providers
        self._session: Any = None

    @property
    def past_names(self) -> list[str]:
        """The cache inputs this rewind re-derives (the Mamba states)."""
        return [c.past_name for layer in self.layers for c in (layer.conv, layer.ssm)]

    def states(
        self, past: dict[str, np.ndarray], out: dict[str, np.ndarray], fed: int, kept: int
    ) -> dict[str, np.ndarray] | None:
        """Every Mamba state after the first `kept` of the `fed` positions of the call that
        started from `past` and returned `out`, by cache input name; None when the call
        returned no window inputs for its positions (a call longer than the window)."""
        if not self.layers:
            return {}
        slots = {
            name: out[name]
            for layer in self.layers
            for name in (which.window_name(layer.name) for which in RecurrenceInput)
        }
        if any(value.shape[0] != fed for value in slots.values()):
            return None
        states = {}
        feeds = {}
        for layer in self.layers:
            conv_input = slots[RecurrenceInput.CONV_INPUT.window_name(layer.name)][:kept]
            states[layer.conv.past_name] = conv_state(past[layer.conv.past_name], conv_input)
            feeds[layer.ssm.past_name] = past[layer.ssm.past_name]
            for which in SSD_INPUTS:
                name = which.window_name(layer.name)
                feeds[name] = slots[name][:kept]
        results = self._rewind_session().run(None, feeds)
        for layer, present in zip(self.layers, results, strict=True):
            states[layer.ssm.past_name] = present
        return states

    def _rewind_session(self) -> Any:
        if self._session is None:
            layers = [_rewind_layer(layer) for layer in self.layers]
            model = build_state_rewind(layers, self.domain)
            serialized = ir.serde.serialize_model(model).SerializeToString()
            options = without_spinning()
            options.intra_op_num_threads = 1  # a few small kernel calls
            self._session = create_session(serialized, self.providers, options)
        return self._session


def _rewind_layer(layer: _Layer) -> RewindLayer:
    heads, state_size, head_dim = (int(d) for d in layer.ssm.shape[1:])
    dtype = ir.DataType.from_numpy(layer.ssm.dtype)
    return RewindLayer(layer.name, heads, state_size, head_dim, dtype)


def conv_state(past: np.ndarray, conv_input: np.ndarray) -> np.ndarray:
    """The conv state after `conv_input`'s positions: past [batch, channels, kernel - 1] and
    conv_input [positions, batch, channels] -> the last kernel - 1 inputs, as the conv op's
    carry state holds them."""
    joined = np.concatenate([past, conv_input.transpose(1, 2, 0).astype(past.dtype)], axis=2)
    return np.ascontiguousarray(joined[:, :, joined.shape[2] - past.shape[2] :])
