"""NemotronHAttention: causal GQA self-attention with a KV cache and no positional embedding."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import Dims
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.configs.layers import AttentionSpec


class Attention(nn.Module):
    def __init__(self, spec: AttentionSpec, hidden_size: int, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        q_width = spec.num_heads * spec.head_dim
        kv_width = spec.num_kv_heads * spec.head_dim
        self.q_proj = Linear(hidden_size, q_width, False, ctx)
        self.k_proj = Linear(hidden_size, kv_width, False, ctx)
        self.v_proj = Linear(hidden_size, kv_width, False, ctx)
        self.o_proj = Linear(q_width, hidden_size, False, ctx)

    def _heads(self, op: OpBuilder, dims: Dims, x: ir.Value, heads: int) -> ir.Value:
        """[rows, heads * head_dim] -> [batch, heads, seq, head_dim]."""
        split = op.Reshape(x, dims.shape(op, heads, self.spec.head_dim))
        return op.Transpose(split, perm=[0, 2, 1, 3])

    def forward(
        self,
        op: OpBuilder,
        x: ir.Value,
        dims: Dims,
        key_mask: ir.Value,
        past_key: ir.Value,
        past_value: ir.Value,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """x: [rows, hidden]; key_mask: bool [batch, 1, 1, past + seq] (False = padding).

        Causality is bottom-right aligned after the past (the Attention op's is_causal), and the
        softmax runs in FP32 as in the reference's eager path.
        """
        s = self.spec
        q = self._heads(op, dims, self.q_proj(op, x), s.num_heads)
        k = self._heads(op, dims, self.k_proj(op, x), s.num_kv_heads)
        v = self._heads(op, dims, self.v_proj(op, x), s.num_kv_heads)
        y, present_key, present_value = op.Attention(
            q,
            k,
            v,
            key_mask,
            past_key,
            past_value,
            is_causal=1,
            scale=float(s.head_dim**-0.5),
            softmax_precision=1,
            _outputs=3,
        )
        rows = op.Reshape(
            op.Transpose(y, perm=[0, 2, 1, 3]),
            op.Constant(value_ints=[-1, s.num_heads * s.head_dim]),
        )
        return self.o_proj(op, rows), present_key, present_value
