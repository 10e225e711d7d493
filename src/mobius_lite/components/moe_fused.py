"""Nemotron-H's ReLU^2 experts on onnxruntime's fused com.microsoft MoE / QMoE CPU kernels.

The CPU kernels refuse activation_type="relu2", but their SwiGLU computes it exactly:
    swiglu(G, L) = G * sigmoid(alpha * G) * (L + beta)
with fc1 giving every up row twice, interleaved (swiglu_fusion=1: [u0, u0, u1, u1, ...], so
G = L = the up projection), beta = 0 and alpha = 1e30: sigmoid(alpha * G) is 1 for G > 0 and
0 for G < 0 (or 1e-8-small where the kernel clamps its logistic input), so the product is
G * G for G > 0 and 0 otherwise: relu(G)^2. The price is fc1's doubled rows: 1.5x the
experts' bytes (the dense MoE kernel builds its doubled fc1 from the stored up_proj at session
creation; the QMoE layouts store it).

Routing stays the graph's own (TopkRouter: sigmoid + correction bias, group-limited top-k):
- QMoE: router_probs is 0 at the k selected experts and -inf elsewhere, so its top-k is
  exactly the graph's selection, and router_weights holds the graph's mixing weights there
  (used as given with normalize_routing_weights=0);
- MoE (no router_weights input): its routing is a softmax over the top-k router_probs, so
  router_probs = log(weight) at the selected experts (-inf elsewhere) gives w / sum(w), and the
  output is multiplied by sum(w) again.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT
from mobius_lite.components.row_by_row import RowsFn
from mobius_lite.configs.layers import MoESpec
from mobius_lite.formats.contrib import contrib_op, typed
from mobius_lite.formats.weight import FusedExperts

# The SwiGLU attributes that make ReLU^2 (module doc); alpha >= 1e4 measured to suffice.
RELU2_AS_SWIGLU: dict[str, object] = {
    "activation_type": "swiglu",
    "swiglu_fusion": 1,
    "activation_alpha": 1e30,
    "activation_beta": 0.0,
}


def _scatter_rows(op: OpBuilder, fill: float, n_experts: int, indices: ir.Value, values: ir.Value):
    """[rows, E] filled with `fill`, `values` [rows, k] at `indices` [rows, k]."""
    rows = op.Shape(indices, start=0, end=1)
    shape = op.Concat(rows, op.Constant(value_ints=[n_experts]), axis=0)
    base = op.Expand(op.Constant(value=ir.tensor(fill, dtype=FLOAT)), shape)
    return op.ScatterElements(base, indices, values, axis=1)


def doubled_rows(op: OpBuilder, up: ir.Value, n_experts: int, inner: int, width: int) -> ir.Value:
    """up [E, I, D] -> [E, 2I, D] with every row twice ([u0, u0, u1, u1, ...]); a constant
    expression onnxruntime folds once at session creation."""
    twice = op.Concat(op.Unsqueeze(up, [2]), op.Unsqueeze(up, [2]), axis=2)  # [E, I, 2, D]
    return op.Reshape(twice, op.Constant(value_ints=[n_experts, 2 * inner, width]))


def dense_fused_experts(
    op: OpBuilder, spec: MoESpec, up: ir.Value, down: ir.Value, k: int | None = None
) -> RowsFn:
    """The rows' sum_k w_k * relu2-expert_k(x) on the MoE kernel, f32 [rows, D] (module doc),
    as a function of (op, x, indices, weights) with `k` (default the spec's) experts a row;
    fc1's doubled rows, a constant expression, are made in `op`'s graph."""
    e, inner, width = spec.n_routed_experts, spec.moe_intermediate_size, int(up.shape[-1])
    fc1 = doubled_rows(op, up, e, inner, width)

    def routed(op: OpBuilder, x: ir.Value, indices: ir.Value, weights: ir.Value) -> ir.Value:
        probs = _scatter_rows(op, float("-inf"), e, indices, op.Log(weights))
        out = op.MoE(
            x,
            probs,
            fc1,
            None,
            down,
            k=k or spec.num_experts_per_tok,
            normalize_routing_weights=0,
            use_sparse_mixer=0,
            **RELU2_AS_SWIGLU,
            **contrib_op(op),
        )
        out = typed(out, FLOAT, None)
        total = op.ReduceSum(weights, op.Constant(value_ints=[-1]), keepdims=1)
        return op.Mul(out, total)

    return routed


def emit_qmoe(
    op: OpBuilder,
    x: ir.Value,
    router_probs: ir.Value,
    router_weights: ir.Value,
    fc1: tuple[ir.Value, ir.Value, ir.Value | None],
    fc2: tuple[ir.Value, ir.Value, ir.Value | None],
    *,
    k: int,
    fc1_bits: int,
    fc2_bits: int,
    block_size: int,
    accuracy_level: int,
    activation: dict[str, object],
) -> ir.Value:
    """One com.microsoft QMoE node: selection by `router_probs` (top-k), mixing by the values
    of `router_weights` at the selected experts as given (normalize_routing_weights=0)."""
    (w1, s1, z1), (w2, s2, z2) = fc1, fc2
    inputs: list[ir.Value | None] = [x, router_probs, w1, s1, None, w2, s2, None]
    inputs += [None, None, None, z1, z2, None, router_weights]
    out = op.QMoE(
        *inputs,
        k=k,
        expert_weight_bits=fc1_bits,
        fc1_expert_weight_bits=fc1_bits,
        fc2_expert_weight_bits=fc2_bits,
        block_size=block_size,
        accuracy_level=accuracy_level,
        normalize_routing_weights=0,
        use_sparse_mixer=0,
        weights_prepacked=0,  # the raw [E, N, K * bits / 8] layout (the default -1 means an
        # execution provider's own prepacked layout)
        **activation,
        **contrib_op(op),
    )
    return typed(out, ir.DataType.FLOAT, None)


def quantized_fused_experts(
    op: OpBuilder,
    spec: MoESpec,
    fc1: tuple[FusedExperts, dict[str, ir.Value]],
    fc2: tuple[FusedExperts, dict[str, ir.Value]],
    accuracy_level: int,
    k: int | None = None,
) -> RowsFn:
    """The rows' sum_k w_k * relu2-expert_k(x) on the QMoE kernel, f32 [rows, D] (module doc),
    as a function of (op, x, indices, weights) with `k` (default the spec's) experts a row;
    the operands (constant expressions of the parameters) are made in `op`'s graph. The
    kernel's input is fc1's `kernel_input` (Q4_K up appends its block sums:
    formats/ggml/relayout/qmoe_min_term.py)."""
    (up, up_params), (down, down_params) = fc1, fc2
    e = spec.n_routed_experts
    operands = up.operands(op, up_params), down.operands(op, down_params)

    def routed(op: OpBuilder, x: ir.Value, indices: ir.Value, weights: ir.Value) -> ir.Value:
        zeros = op.Mul(weights, op.Constant(value=ir.tensor(0.0, dtype=FLOAT)))
        kernel_x = up.kernel_input(op, x)
        out = emit_qmoe(
            op,
            kernel_x,
            _scatter_rows(op, float("-inf"), e, indices, zeros),
            _scatter_rows(op, 0.0, e, indices, weights),
            *operands,
            k=k or spec.num_experts_per_tok,
            fc1_bits=up.bits,
            fc2_bits=down.bits,
            block_size=up.block_size,
            accuracy_level=accuracy_level,
            activation=RELU2_AS_SWIGLU,
        )
        if kernel_x is x:
            return out
        # The kernel's output is as wide as its input: the appended columns' rows are zero.
        start, axis = op.Constant(value_ints=[0]), op.Constant(value_ints=[-1])
        return typed(op.Slice(out, start, op.Shape(x, start=-1), axis), FLOAT, None)

    return routed


def pairs_apart(routed_one: RowsFn, k: int, width: int) -> RowsFn:
    """The rows' sum_k w_k * expert_k(x) from a fused function built for one expert a row:
    every (row, expert) pair becomes a row of its own, so the kernel sums no two terms of a row
    (its threads' buffers each hold a pair's one term or zero), and the k terms are added here
    in the selection's order. A row then computes alike whatever the call's other rows chose,
    which the kernels' own sums do not guarantee (components/row_by_row.py says why)."""

    def routed(op: OpBuilder, x: ir.Value, indices: ir.Value, weights: ir.Value) -> ir.Value:
        pair_rows = op.Constant(value_ints=[-1, width])
        each = op.Reshape(
            op.Expand(op.Unsqueeze(x, [1]), op.Constant(value_ints=[1, k, 1])), pair_rows
        )
        column = op.Constant(value_ints=[-1, 1])
        terms = routed_one(op, each, op.Reshape(indices, column), op.Reshape(weights, column))
        stacked = op.Reshape(terms, op.Constant(value_ints=[-1, k, width]))
        split = op.Split(stacked, axis=1, num_outputs=k, _outputs=k) if k > 1 else [stacked]
        total = split[0]
        for term in split[1:]:
            total = op.Add(total, term)
        return typed(op.Reshape(total, pair_rows), FLOAT, None)

    return routed
