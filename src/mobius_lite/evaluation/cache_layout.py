"""The reference's cache layouts mapped onto the package's cache ABI (graphs/cache.py).

transformers keeps a Mamba layer's conv state as [batch, conv_dim, conv_kernel] (the newest
column last, the oldest one no longer needed by the next step first) and its SSM state as
[batch, heads, head_dim, state]; the package carries [batch, conv_dim, conv_kernel - 1] and
[batch, heads, state, head_dim]. Attention K/V share the layout [batch, kv_heads, seq, head_dim].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mobius_lite.enums import LayerKind, StateRole


def _numpy(tensor: Any) -> np.ndarray:
    # a copy: the reference updates its cache tensors in place on the next call
    return tensor.detach().float().cpu().numpy().copy()


def reference_cache_arrays(cache: Any, kinds: Sequence[LayerKind]) -> dict[str, np.ndarray]:
    """A transformers hybrid cache as {present.{i}.{role}: array} in the package's layouts.

    `kinds` is the layer kind of every global layer index; layers without state are skipped.
    conv: [B, C, kernel] -> the last kernel - 1 columns; recurrent: [B, H, head_dim, N] ->
    [B, H, N, head_dim].
    """
    out: dict[str, np.ndarray] = {}
    for i, kind in enumerate(kinds):
        if kind is LayerKind.ATTENTION:
            layer = cache.layers[i]
            out[StateRole.KEY.present_name(i)] = _numpy(layer.keys)
            out[StateRole.VALUE.present_name(i)] = _numpy(layer.values)
        elif kind is LayerKind.MAMBA:
            layer = cache.layers[i]
            conv = _numpy(layer.conv_states[0])[:, :, 1:]
            recurrent = np.swapaxes(_numpy(layer.recurrent_states[0]), -1, -2)
            out[StateRole.CONV.present_name(i)] = np.ascontiguousarray(conv)
            out[StateRole.RECURRENT.present_name(i)] = np.ascontiguousarray(recurrent)
    return out
