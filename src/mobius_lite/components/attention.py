"""NemotronHAttention: causal GQA self-attention with a KV cache and no positional embedding.

The standard backend emits the opset-27 Attention op. onnxruntime 1.32 has an Attention kernel
for opsets 23-24 only and runs the opset-27 one as its function body: about 30 nodes per layer
that transpose the whole key cache and expand K and V to every query head on each step (3.3 ms
of a mid Q8_0 decode step's kernel time for two layers; docs/performance.md, Issue 22).
The ort backend's f32 graphs therefore compute the same attention with com.microsoft
FusedMatMul on the grouped queries ([batch, kv_heads, group * seq, head_dim] against the
[batch, kv_heads, total, head_dim] cache, no copy of it), an additive mask and Softmax. As the
op's function body does, a query row with no visible key (a padded position) gives zeros.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import FLOAT, Dims
from mobius_lite.components.context import BuildContext
from mobius_lite.components.linear import Linear
from mobius_lite.configs.layers import AttentionSpec
from mobius_lite.enums import Backend
from mobius_lite.formats.contrib import contrib_op, typed

# the additive mask's value for a hidden key: exp(score + MASKED - max) is 0 in float32 while
# a row with no visible key stays finite (then zeroed), where -inf would give NaN
MASKED = float(np.finfo(np.float32).min)


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
        self.grouped = ctx.backend is Backend.ORT and ctx.dtype == FLOAT  # module doc

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
        if self.grouped:
            y, present_key, present_value = grouped_attention(
                op, s, q, k, v, key_mask, past_key, past_value
            )
        else:
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


def grouped_attention(
    op: OpBuilder,
    s: AttentionSpec,
    q: ir.Value,
    k: ir.Value,
    v: ir.Value,
    key_mask: ir.Value,
    past_key: ir.Value,
    past_value: ir.Value,
) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The Attention op's result (is_causal, bool key mask, past) on FusedMatMul over grouped
    queries, f32 (module doc): y [batch, heads, seq, head_dim] and the presents [batch,
    kv_heads, total, head_dim]."""
    kv, heads, d = s.num_kv_heads, s.num_heads, s.head_dim
    present_key = op.Concat(past_key, k, axis=2)
    present_value = op.Concat(past_value, v, axis=2)

    def const(*values: int) -> ir.Value:
        return op.Constant(value_ints=list(values))

    # (Reshape's 0 copies the input's dim.) Query head h uses kv head h // group: q [b, heads,
    # seq, d] read as [b, kv, group * seq, d] meets the cache [b, kv, total, d] directly.
    grouped = op.Reshape(q, const(0, kv, -1, d))
    scores = op.FusedMatMul(grouped, present_key, transB=1, alpha=float(d**-0.5), **contrib_op(op))
    scores = op.Reshape(scores, const(0, heads, -1, 0))  # [b, heads, seq, total]
    # key j is visible to query i when unpadded and j <= (total - seq) + i: the key mask
    # [b, 1, 1, total] repeated over the queries, its lower triangle from diagonal total - seq
    seq = op.Shape(q, start=2, end=3)
    total = op.Shape(present_key, start=2, end=3)
    rows = op.Expand(key_mask, op.Concat(const(1, 1), seq, const(1), axis=0))
    visible = op.Trilu(rows, op.Squeeze(op.Sub(total, seq)), upper=0)  # [b, 1, seq, total]
    zero = op.Constant(value=ir.tensor(0.0, dtype=FLOAT))
    bias = op.Where(visible, zero, op.Constant(value=ir.tensor(MASKED, dtype=FLOAT)))
    probs = op.Softmax(op.Add(scores, bias), axis=-1)
    any_visible = op.ReduceMax(op.Cast(visible, to=FLOAT), const(-1), keepdims=1)
    probs = op.Mul(probs, any_visible)  # a row with no visible key: zeros
    y = op.MatMul(op.Reshape(probs, const(0, kv, -1, 0)), present_value)  # [b, kv, group*seq, d]
    return typed(op.Reshape(y, const(0, heads, -1, d)), FLOAT), present_key, present_value
