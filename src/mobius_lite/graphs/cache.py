"""The decoder's cache ABI: which past/present tensors exist, with names, dtypes and shapes.

One function derives it from the per-layer specs; the graph builder, genai_config writer,
qualification harness and tests all read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from mobius_lite.configs import LayerSpec
from mobius_lite.enums import LayerKind, StateRole

BATCH = "batch"
PAST = "past_sequence"
# The cache scope of the multi-token-prediction head's layer i: past_key_values.mtp.{i}.key
MTP_SCOPE = "mtp"


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
    def present_shape(self) -> tuple[int | str, ...]:
        if self.role in (StateRole.KEY, StateRole.VALUE):
            return (BATCH, self.past_shape[1], "total_sequence", self.past_shape[3])
        return self.past_shape


def cache_tensors(layers: tuple[LayerSpec, ...], dtype: ir.DataType) -> list[CacheTensor]:
    """Every cache tensor of the decoder, in layer order (global layer indices)."""
    out: list[CacheTensor] = []
    for layer in layers:
        if layer.kind is LayerKind.ATTENTION:
            a = layer.attention
            shape = (BATCH, a.num_kv_heads, PAST, a.head_dim)
            out += [CacheTensor(layer.index, role, dtype, shape) for role in layer.kind.states]
        elif layer.kind is LayerKind.MAMBA:
            m = layer.mamba
            out.append(
                CacheTensor(
                    layer.index, StateRole.CONV, dtype, (BATCH, m.conv_dim, m.conv_kernel - 1)
                )
            )
            out.append(
                CacheTensor(
                    layer.index,
                    StateRole.RECURRENT,
                    m.ssm_cache_ir_dtype,
                    (BATCH, m.num_heads, m.ssm_state_size, m.head_dim),
                )
            )
    return out


def mtp_layer_name(index: int) -> str:
    """The cache layer name of the head's layer `index` (mtp.0 for its attention block)."""
    return f"{MTP_SCOPE}.{index}"


def mtp_cache_tensors(layers: tuple[LayerSpec, ...], dtype: ir.DataType) -> list[CacheTensor]:
    """Every cache tensor of the multi-token-prediction head (config.mtp_layers), in layer
    order: past_key_values.mtp.{i}.key / .value for each attention layer i of the head."""
    out: list[CacheTensor] = []
    for layer in layers:
        if layer.kind is LayerKind.ATTENTION:
            a = layer.attention
            shape = (BATCH, a.num_kv_heads, PAST, a.head_dim)
            name = mtp_layer_name(layer.index)
            out += [CacheTensor(name, role, dtype, shape) for role in layer.kind.states]
    return out
