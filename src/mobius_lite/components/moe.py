"""NemotronHMoE: FP32 sigmoid router with group-limited top-k, ReLU^2 experts, optional latent
projections and shared expert.

Experts are stored stacked (up_proj [E, I, D], down_proj [E, D, I]). Only the experts selected
in this call are multiplied, on one of three paths picked at run time (see Experts); the node
count does not depend on E.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.components.common import FLOAT, cast_to, loop_body, relu_squared, to_float32
from mobius_lite.components.context import BuildContext, WeightedModule, fused_kernels
from mobius_lite.components.linear import Linear
from mobius_lite.components.mlp import ReLU2MLP
from mobius_lite.components.moe_fused import (
    dense_fused_experts,
    pairs_apart,
    quantized_fused_experts,
)
from mobius_lite.components.moe_scan import ExpertScan
from mobius_lite.components.row_by_row import RowsFn, row_by_row
from mobius_lite.configs.layers import MoESpec
from mobius_lite.enums import Activations
from mobius_lite.formats.weight import DenseWeight, FusedExperts, OutputScaled, WeightFormat

INT64 = ir.DataType.INT64
EXPERT_SLOTS = ("up_proj", "down_proj")
# Up to this many (row, expert) pairs the experts run as one gathered batched matmul.
GATHERED_PAIRS_LIMIT = 16
# What one Scan iteration over an unselected expert costs on onnxruntime CPU, in bytes of
# weight copy it is worth (~3 us at ~10 GB/s, measured; rounded up). Copying the selected
# experts' weights (Gather) pays off only while it moves fewer bytes than E such iterations.
SCAN_ITERATION_BYTES = 64 * 1024


class TopkRouter(nn.Module):
    """Selection uses sigmoid(logits) + e_score_correction_bias; weights use the plain sigmoid."""

    def __init__(self, spec: MoESpec, hidden_size: int, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        # The source keeps the router in FP32 (_keep_in_fp32_modules_strict), whatever the
        # context's activation precision.
        self.weight = nn.Parameter([spec.n_routed_experts, hidden_size], dtype=FLOAT)
        self.e_score_correction_bias = nn.Parameter([spec.n_routed_experts], dtype=FLOAT)

    def _group_limit(self, op: OpBuilder, choice: ir.Value) -> ir.Value:
        """Mask experts outside the topk_group best groups (group score = sum of its top-2)."""
        s = self.spec
        per_group = s.n_routed_experts // s.n_group
        grouped = op.Reshape(choice, op.Constant(value_ints=[-1, s.n_group, per_group]))
        top2, _ = op.TopK(grouped, op.Constant(value_ints=[2]), axis=-1, _outputs=2)
        group_scores = op.ReduceSum(top2, op.Constant(value_ints=[-1]), keepdims=0)
        _, best = op.TopK(group_scores, op.Constant(value_ints=[s.topk_group]), axis=-1, _outputs=2)
        zeros = op.Mul(group_scores, op.Constant(value=ir.tensor(0.0, dtype=FLOAT)))
        ones = op.Expand(op.Constant(value=ir.tensor(1.0, dtype=FLOAT)), op.Shape(best))
        keep_group = op.ScatterElements(zeros, best, ones, axis=1)
        keep = op.Expand(op.Unsqueeze(keep_group, op.Constant(value_ints=[-1])), op.Shape(grouped))
        keep = op.Cast(op.Reshape(keep, op.Shape(choice)), to=ir.DataType.BOOL)
        minus_inf = op.Constant(value=ir.tensor(float("-inf"), dtype=FLOAT))
        return op.Where(keep, choice, minus_inf)

    def forward(self, op: OpBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
        """x: [rows, hidden] -> (expert indices int64 [rows, k], weights FP32 [rows, k])."""
        s = self.spec
        scores = op.Sigmoid(op.Gemm(to_float32(op, x), self.weight, transB=1))
        choice = op.Add(scores, self.e_score_correction_bias)
        if s.n_group > 1 and s.topk_group < s.n_group:
            choice = self._group_limit(op, choice)
        _, indices = op.TopK(
            choice, op.Constant(value_ints=[s.num_experts_per_tok]), axis=-1, _outputs=2
        )
        weights = op.GatherElements(scores, indices, axis=1)
        if s.norm_topk_prob:
            total = op.ReduceSum(weights, op.Constant(value_ints=[-1]), keepdims=1)
            weights = op.Div(
                weights, op.Add(total, op.Constant(value=ir.tensor(1e-20, dtype=FLOAT)))
            )
        if s.routed_scaling_factor != 1.0:
            weights = op.Mul(
                weights, op.Constant(value=ir.tensor(s.routed_scaling_factor, dtype=FLOAT))
            )
        return indices, weights


class Experts(WeightedModule):
    """Stacked ReLU^2 experts, run for the selected experts only (any E, same nodes)."""

    def __init__(self, spec: MoESpec, input_size: int, ctx: BuildContext) -> None:
        super().__init__(ctx)
        self.spec = spec
        self.input_size = input_size
        e, inner = spec.n_routed_experts, spec.moe_intermediate_size
        self.weight_slot("up_proj", (e, inner, input_size))
        self.weight_slot("down_proj", (e, input_size, inner))
        # slot -> its QMoE operand, for the slots moved onto the fused kernel (--activations)
        self._operands: dict[str, FusedExperts] = {}
        # slot -> its output-scaled dense weight folded into one dense value (forward)
        self._folded: dict[str, ir.Value] = {}

    # ------------------------------------------------------------------ fused kernels
    def kernel_format(self, attr: str, fmt: WeightFormat) -> WeightFormat:
        """Under a fused activation mode, a packed slot as a QMoE operand where it fits
        exactly (the format's on_fused_experts); otherwise `fmt`, said once."""
        if not fused_kernels(self.ctx) or _dense_experts(fmt):
            return fmt
        moved = fmt.on_fused_experts("fc1" if attr == "up_proj" else "fc2", self._int8)
        if isinstance(moved, str):
            self.ctx.notice(f"{self._mode}: {moved}; kept on the exact experts route")
            return fmt
        self._operands[attr] = moved
        return moved

    def formats_applied(self) -> None:
        """QMoE takes both projections or neither, with one bit width and one block size
        (onnxruntime 1.32's CPU kernel: "Mixed-width QMoE execution is not yet implemented
        on CPU"); the fc1 operand pairs the two (formats/weight.py `paired_with`), else both
        go back to the slots' exact formats, said once."""
        if not self._operands:
            return
        up, down = (self._operands.get(a) for a in EXPERT_SLOTS)
        paired = up.paired_with(down) if up is not None and down is not None else None
        if paired is not None and not isinstance(paired, str):
            for attr, operand in zip(EXPERT_SLOTS, paired, strict=True):
                if operand is not self._operands[attr]:
                    self.set_weight_format(attr, operand)
                self._operands[attr] = operand
            up, down = paired
            cost = up.layer_byte_cost(down)
            self.ctx.notice(
                f"{self._mode}: experts ({up.stored_type} / {down.stored_type}) on QMoE, "
                f"{up.layer_layout(down)}: {cost:.2f}x the source experts' bytes"
            )
            return
        names = " / ".join(self.weight_format_of(a).name for a in EXPERT_SLOTS)
        for attr, operand in self._operands.items():
            self.set_weight_format(attr, operand.exact)
        self._operands.clear()
        reason = paired if isinstance(paired, str) else "do not both fit one QMoE layout"
        self.ctx.notice(f"{self._mode}: experts {names} {reason}; kept on the exact experts route")

    @property
    def _int8(self) -> bool:
        return self.ctx.activations is Activations.INT8

    @property
    def _mode(self) -> str:
        return f"--activations {self.ctx.activations.value}"

    def _fused_route(self) -> str | None:
        """ "qmoe", "moe" (dense f32 experts) or None (the Scan / Gather paths)."""
        if all(self.weight_format_of(a) is self._operands.get(a) for a in EXPERT_SLOTS):
            return "qmoe"
        if fused_kernels(self.ctx) and self._scannable() and self.ctx.dtype == FLOAT:
            self.ctx.notice(
                f"{self._mode}: dense experts on the fused MoE kernel; its SwiGLU form of "
                "ReLU^2 doubles every up row at session creation: 1.5x the experts' bytes"
            )
            return "moe"
        return None

    def _fused(self, op: OpBuilder, route: str, k: int | None = None) -> RowsFn:
        if route == "moe":
            up, down = (self._dense(a) for a in EXPERT_SLOTS)
            return dense_fused_experts(op, self.spec, up, down, k)
        up, down = ((self._operands[a], self.slot_values(a)) for a in EXPERT_SLOTS)
        accuracy = self.ctx.activations.accuracy_level
        return quantized_fused_experts(op, self.spec, up, down, accuracy, k)

    def _expert_bytes(self) -> int:
        """Bytes of one expert's up and down weights in the activation precision."""
        return int(2 * self.spec.moe_intermediate_size * self.input_size * self.ctx.dtype.itemsize)

    def _scannable(self) -> bool:
        """Dense stacked weights (or output-scaled ones folded into dense values) can be sliced
        per expert by Scan without a copy."""
        return all(
            isinstance(self.weight_format_of(a), DenseWeight) or a in self._folded
            for a in self._slots
        )

    def _fold_output_scales(self, op: OpBuilder) -> None:
        """Output-scaled dense slots (--dequantize: a ModelOpt FP8 or GGUF `.scale` weight) as
        one dense value each, W * s folded at session creation (OutputScaled.folded_weight):
        the experts then compute as dense experts, on the Scan path too."""
        for attr in EXPERT_SLOTS:
            fmt = self.weight_format_of(attr)
            if isinstance(fmt, OutputScaled):
                folded = fmt.folded_weight(op, self.slot_values(attr))
                if folded is not None:
                    self._folded[attr] = folded
        if set(self._folded) != set(EXPERT_SLOTS):
            self._folded.clear()  # both or neither: the paths below take the slots as a pair

    def _dense(self, attr: str) -> ir.Value:
        """A dense slot's stacked weight: its parameter, or its folded output-scaled value."""
        folded = self._folded.get(attr)
        return folded if folded is not None else self.slot_values(attr)[""]

    def _rows(self, op: OpBuilder, attr: str, indices: ir.Value) -> ir.Value:
        """The slices `indices` of slot `attr`, in the activation precision."""
        if attr in self._folded:
            return op.Gather(self._folded[attr], indices, axis=0)
        return self.select(op, attr, indices)

    def forward(
        self,
        op: OpBuilder,
        x: ir.Value,
        indices: ir.Value,
        weights: ir.Value,
        sequence: ir.Value | None = None,
    ) -> ir.Value:
        """x: [rows, D]; indices/weights: [rows, k] -> sum_k w * expert_k(x), FP32 [rows, D].

        Three paths, all reading only selected experts' weights, picked at run time by the
        number of (row, expert) pairs P:
        - gathered (P <= 16): gather the selected experts' weights (a copy) and run one batched
          matmul, no Loop;
        - looped: Loop over the distinct selected experts, each (copied by Gather) running on
          the rows that chose it;
        - scanned (dense weights, when copying P experts would move more bytes than E Scan
          iterations cost): Scan over all E experts, whose per-expert slices onnxruntime hands
          to the body without a copy; an If skips the unselected ones.

        Under int8 activations with speculation windows (BuildContext.row_window) every row
        must compute alike whatever the call's other rows chose: on the fused kernels every
        (row, expert) pair is a row of its own (moe_fused.pairs_apart), in any call; the other
        paths run one row at a time in calls of up to the window's positions (`sequence`,
        [1] int64; any batch).
        """
        self._fold_output_scales(op)
        route = self._fused_route()
        window = self.ctx.row_window
        if window and route is not None:
            one_a_row = self._fused(op, route, k=1)
            apart = pairs_apart(one_a_row, self.spec.num_experts_per_tok, self.input_size)
            return apart(op, x, indices, weights)
        experts = self._selected if route is None else self._fused(op, route)
        if not window:
            return experts(op, x, indices, weights)
        if sequence is None:
            raise ValueError("experts built with a row window need the call's sequence length")
        inputs = (x, indices, weights)
        short = op.LessOrEqual(sequence, op.Constant(value_ints=[window]))
        return row_by_row(op, short, experts, inputs, FLOAT, self.input_size, "expert_rows")

    def _selected(
        self, op: OpBuilder, x: ir.Value, indices: ir.Value, weights: ir.Value
    ) -> ir.Value:
        """The non-fused paths (forward's docstring), picked at run time."""
        flat_expert = op.Reshape(indices, op.Constant(value_ints=[-1]))
        flat_weight = op.Reshape(weights, op.Constant(value_ints=[-1]))
        pairs = op.Size(flat_expert)
        few_pairs = op.LessOrEqual(
            pairs, op.Constant(value=ir.tensor(GATHERED_PAIRS_LIMIT, dtype=INT64))
        )

        def branch(op: OpBuilder, path, name: str) -> ir.Graph:
            output = ir.Value(
                name="routed", type=ir.TensorType(FLOAT), shape=ir.Shape(["rows", self.input_size])
            )
            return op.builder.subgraph(
                lambda op: path(op, x, flat_expert, flat_weight),
                inputs=[],
                outputs=[output],
                name=name,
            )

        def copying(op: OpBuilder, x: ir.Value, flat_expert: ir.Value, flat_weight: ir.Value):
            gathered = branch(op, self._gathered, "experts_gathered")
            looped = branch(op, self._looped, "experts_looped")
            routed = op.If(few_pairs, then_branch=gathered, else_branch=looped)
            # As both branches declare: ONNX inference cannot type an If whose branches hold
            # contrib ops (a packed weight format's gathers).
            routed.type = ir.TensorType(FLOAT)
            routed.shape = ir.Shape(["rows", self.input_size])
            return routed

        if not self._scannable():
            return copying(op, x, flat_expert, flat_weight)
        # Copy while P * expert_bytes <= E * SCAN_ITERATION_BYTES, i.e. P <= this limit. Only
        # the limit's value depends on E, not the graph.
        copy_limit = self.spec.n_routed_experts * SCAN_ITERATION_BYTES // self._expert_bytes()
        copy_cheap = op.LessOrEqual(pairs, op.Constant(value=ir.tensor(copy_limit, dtype=INT64)))
        return op.If(
            copy_cheap,
            then_branch=branch(op, copying, "experts_copied"),
            else_branch=branch(op, self._scanned, "experts_scanned"),
        )

    def _gathered(
        self, op: OpBuilder, x: ir.Value, flat_expert: ir.Value, flat_weight: ir.Value
    ) -> ir.Value:
        """Per (row, k) pair: W_up[e] @ x[row] as one batched matmul over the gathered experts."""
        k = self.spec.num_experts_per_tok
        rows = op.Reshape(
            op.Expand(op.Unsqueeze(x, [1]), op.Constant(value_ints=[1, k, 1])),
            op.Constant(value_ints=[-1, self.input_size, 1]),
        )
        hidden = op.MatMul(self._rows(op, "up_proj", flat_expert), rows)  # [P, I, 1]
        out = op.MatMul(self._rows(op, "down_proj", flat_expert), relu_squared(op, hidden))
        weighted = op.Mul(
            op.Reshape(to_float32(op, out), op.Constant(value_ints=[-1, k, self.input_size])),
            op.Reshape(flat_weight, op.Constant(value_ints=[-1, k, 1])),
        )
        return op.ReduceSum(weighted, op.Constant(value_ints=[1]), keepdims=0)

    def _looped(
        self, op: OpBuilder, x: ir.Value, flat_expert: ir.Value, flat_weight: ir.Value
    ) -> ir.Value:
        """Loop over the distinct selected experts; each runs on the rows that chose it."""
        k = self.spec.num_experts_per_tok
        flat_row = _flat_rows(op, x, k)
        selected, *_ = op.Unique(flat_expert, sorted=1, _outputs=4)
        trip_count = op.Squeeze(op.Shape(selected), op.Constant(value_ints=[0]))
        zeros = op.Mul(to_float32(op, x), op.Constant(value=ir.tensor(0.0, dtype=FLOAT)))

        def body(op: OpBuilder, step: ir.Value, cond: ir.Value, acc: ir.Value):
            expert = op.Gather(selected, step, axis=0)
            positions = op.Squeeze(
                op.NonZero(op.Equal(flat_expert, expert)), op.Constant(value_ints=[0])
            )
            token_rows = op.Gather(flat_row, positions, axis=0)
            gate_weight = op.Unsqueeze(
                op.Gather(flat_weight, positions, axis=0), op.Constant(value_ints=[1])
            )
            hidden = op.Gemm(
                op.Gather(x, token_rows, axis=0), self._rows(op, "up_proj", expert), transB=1
            )
            out = op.Gemm(relu_squared(op, hidden), self._rows(op, "down_proj", expert), transB=1)
            contribution = op.Mul(to_float32(op, out), gate_weight)
            acc = op.ScatterND(
                acc,
                op.Unsqueeze(token_rows, op.Constant(value_ints=[1])),
                contribution,
                reduction="add",
            )
            return op.Identity(cond), acc

        width = ir.Shape(["rows", self.input_size])
        body_graph = loop_body(op, body, [("acc", FLOAT, width)], [], "experts_loop_body")
        true = op.Constant(value=ir.tensor(True, dtype=ir.DataType.BOOL))
        return op.Loop(trip_count, true, zeros, body=body_graph)

    def _scanned(
        self, op: OpBuilder, x: ir.Value, flat_expert: ir.Value, flat_weight: ir.Value
    ) -> ir.Value:
        """Scan over the experts' weight slices (views, no copy): moe_scan.py."""
        scan = ExpertScan(
            self.spec,
            self.input_size,
            self.ctx.dtype,
            self._dense("up_proj"),
            self._dense("down_proj"),
        )
        flat_row = _flat_rows(op, x, self.spec.num_experts_per_tok)
        return scan(op, x, flat_row, flat_expert, flat_weight)


def _dense_experts(fmt: WeightFormat) -> bool:
    """Whether stacked experts of format `fmt` compute as dense experts: dense weights, or
    output-scaled dense ones folded into one dense value (OutputScaled.folds)."""
    return isinstance(fmt, DenseWeight) or (isinstance(fmt, OutputScaled) and fmt.folds)


class MoE(nn.Module):
    def __init__(self, spec: MoESpec, hidden_size: int, ctx: BuildContext) -> None:
        super().__init__()
        self.spec = spec
        self.dtype = ctx.dtype
        self.gate = TopkRouter(spec, hidden_size, ctx)
        expert_width = spec.latent_size or hidden_size
        self.experts = Experts(spec, expert_width, ctx)
        if spec.latent_size is not None:
            self.fc1_latent_proj = Linear(hidden_size, spec.latent_size, spec.bias, ctx)
            self.fc2_latent_proj = Linear(spec.latent_size, hidden_size, spec.bias, ctx)
        else:
            self.fc1_latent_proj = None
            self.fc2_latent_proj = None
        if spec.has_shared_expert:
            self.shared_experts = ReLU2MLP(
                hidden_size, spec.shared_intermediate_size, spec.bias, ctx
            )
        else:
            self.shared_experts = None

    def forward(self, op: OpBuilder, x: ir.Value, sequence: ir.Value | None = None) -> ir.Value:
        """x [rows, hidden]; `sequence` ([1] int64, the call's positions) lets the experts run
        row by row in short calls (Experts.forward)."""
        indices, weights = self.gate(op, x)
        routed_in = self.fc1_latent_proj(op, x) if self.fc1_latent_proj is not None else x
        # Accumulated in FP32 like the reference (zeros_like(..., dtype=top_k_weights.dtype)).
        experts = self.experts(op, routed_in, indices, weights, sequence)
        routed = cast_to(op, experts, self.dtype)
        if self.fc2_latent_proj is not None:
            routed = self.fc2_latent_proj(op, routed)
        if self.shared_experts is not None:
            routed = op.Add(routed, self.shared_experts(op, x))
        return routed


def _flat_rows(op: OpBuilder, x: ir.Value, k: int) -> ir.Value:
    """The row index of each (row, k) pair, flattened like the expert indices: [rows * k]."""
    rows = op.Shape(x, start=0, end=1)
    row_ids = op.Range(
        op.Constant(value=ir.tensor(0, dtype=INT64)),
        op.Squeeze(rows, op.Constant(value_ints=[0])),
        op.Constant(value=ir.tensor(1, dtype=INT64)),
    )
    return op.Reshape(
        op.Expand(
            op.Unsqueeze(row_ids, op.Constant(value_ints=[1])),
            op.Concat(rows, op.Constant(value_ints=[k]), axis=0),
        ),
        op.Constant(value_ints=[-1]),
    )
