"""The decoder's cache ABI: which past/present tensors exist, with names, dtypes and shapes.

One function derives it from the per-layer specs; the graph builder, genai_config writer,
qualification harness and tests all read it from here, and another the outputs a decoder
with a speculation window adds per Mamba layer (window_input.*). The names themselves (the
past_key_values. / present. / present_window. / window_input. prefixes) are spelled in
io_contract.py, through StateRole and RecurrenceInput, which the runtime pairs inputs with
outputs by.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from mobius_lite.components.state_window import recurrence_input_widths
from mobius_lite.configs import LayerSpec, NemotronHConfig
from mobius_lite.enums import LayerKind, RecurrenceInput, StateRole

BATCH = "batch"
PAST = "past_sequence"


@dataclass(frozen=True)
class CacheTensor:
    """One past_key_values.{layer}.{role} input and its present.{layer}.{role} output.

    `layer` is the decoder's global layer index, or "mtp.{i}" for the head's layer i."""

    layer: int | str
    role: StateRole
    dtype: ir.DataType
    past_shape: tuple[int | str, ...]

    @property
    def past_name(self) -> str:
        return self.role.past_name(self.layer)

    @property
    def present_name(self) -> str:
        return self.role.present_name(self.layer)

    @property
    def window_name(self) -> str:
        return self.role.window_name(self.layer)

    @property
    def windowed(self) -> bool:
        """Whether a speculation window can hold this state per position (Mamba states;
        attention K/V are cut back on their sequence axis instead)."""
        return self.role in (StateRole.CONV, StateRole.RECURRENT)

    @property
    def window_shape(self) -> tuple[int | str, ...]:
        """[window, batch, ...]: the state after each position of a short call."""
        return ("window", *self.past_shape)

    @property
    def present_shape(self) -> tuple[int | str, ...]:
        if self.role in (StateRole.KEY, StateRole.VALUE):
            return (BATCH, self.past_shape[1], "total_sequence", self.past_shape[3])
        return self.past_shape


def cache_tensors(layers: tuple[LayerSpec, ...], dtype: ir.DataType) -> list[CacheTensor]:
    """Every cache tensor of `layers`, in layer order: the decoder's (config.layers, global
    layer indices) or the MTP head's (config.mtp_layers, layers "mtp.{i}")."""
    out: list[CacheTensor] = []
    for layer in layers:
        if layer.kind is LayerKind.ATTENTION:
            a = layer.attention
            shape = (BATCH, a.num_kv_heads, PAST, a.head_dim)
            out += [
                CacheTensor(layer.cache_layer, role, dtype, shape) for role in layer.kind.states
            ]
        elif layer.kind is LayerKind.MAMBA:
            m = layer.mamba
            out.append(
                CacheTensor(
                    layer.cache_layer, StateRole.CONV, dtype, (BATCH, m.conv_dim, m.conv_kernel - 1)
                )
            )
            out.append(
                CacheTensor(
                    layer.cache_layer,
                    StateRole.RECURRENT,
                    m.ssm_cache_ir_dtype,
                    (BATCH, m.num_heads, m.ssm_state_size, m.head_dim),
                )
            )
    return out


@dataclass(frozen=True)
class WindowInput:
    """One window_input.{layer}.{input} output of a decoder with a speculation window: a Mamba
    layer's recurrence input at each position of a short call, [window, batch, width]
    (components/state_window.py)."""

    layer: int | str
    recurrence_input: RecurrenceInput
    dtype: ir.DataType
    width: int

    @property
    def name(self) -> str:
        return self.recurrence_input.window_name(self.layer)

    @property
    def shape(self) -> tuple[int | str, ...]:
        return ("window", BATCH, self.width)


def window_inputs(layers: tuple[LayerSpec, ...], dtype: ir.DataType) -> list[WindowInput]:
    """Every window_input.* output of a decoder of `layers` with a speculation window: per
    Mamba layer the conv input (in the conv cache's dtype, `dtype`) and the SSD recurrence's
    key, value and decay (FP32), in RecurrenceInput order."""
    out: list[WindowInput] = []
    for layer in layers:
        if layer.kind is not LayerKind.MAMBA:
            continue
        widths = recurrence_input_widths(layer.mamba, dtype)
        out += [
            WindowInput(layer.cache_layer, which, width_dtype, width)
            for which, (width_dtype, width) in widths.items()
        ]
    return out


def mtp_cache_tensors(
    config: NemotronHConfig, dtype: ir.DataType, depth: int = 0
) -> list[CacheTensor]:
    """The cache tensors of the MTP head's depth `depth` (past_key_values.mtp.{i}.key /
    .value for each of its attention blocks i, global indices); empty without a head."""
    if not config.mtp_layers:
        return []
    return cache_tensors(config.mtp_depth_layers(depth), dtype)
