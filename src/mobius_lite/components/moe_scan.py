"""The experts' Scan path: a Scan over the stacked dense expert tensors, whose per-expert
slices onnxruntime hands to the body without a copy (components/moe.py picks it at run time
when copying the selected experts would move more bytes than the Scan's iterations cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.components.common import FLOAT, relu_squared, to_float32
from mobius_lite.configs.layers import MoESpec

INT64 = ir.DataType.INT64


def scan_group_size(n_experts: int, k: int) -> int:
    """The divisor s of E that makes a decode step's grouped Scan shortest (E / s outer
    iterations plus s for each of the k chosen groups at most); 1 when no grouping beats the
    plain Scan's E iterations (the grouped branch is then never taken, but stays in the
    graph, so the node count does not depend on E)."""
    best, best_cost = 1, n_experts
    for s in range(2, n_experts):
        if n_experts % s == 0 and n_experts // s + k * s < best_cost:
            best, best_cost = s, n_experts // s + k * s
    return best


def grouped_scan_pairs_limit(n_experts: int, group: int) -> int:
    """Up to this many (row, expert) pairs the grouped Scan's worst case (every pair in its
    own group) takes fewer iterations than the plain Scan's E; 0 for groups of one."""
    return (n_experts - n_experts // group) // group


@dataclass(frozen=True)
class ExpertScan:
    """The Scan over stacked experts up [E, I, D] and down [E, D, I] of `dtype`; called on
    x [rows, D] and the flattened (row, expert, weight) pairs -> FP32 [rows, D]."""

    spec: MoESpec
    width: int
    dtype: ir.DataType
    up: ir.Value
    down: ir.Value

    def __call__(
        self,
        op: OpBuilder,
        x: ir.Value,
        flat_row: ir.Value,
        flat_expert: ir.Value,
        flat_weight: ir.Value,
    ) -> ir.Value:
        """Scan over every expert's weight slices (views, no copy); the selected ones run on
        the rows that chose them, accumulated like the Loop path (ScatterND add, FP32).

        Every Scan iteration costs onnxruntime a subgraph run even when its If skips the
        expert, so for few pairs (a decode step) the experts are scanned in groups of
        `scan_group_size` (a Reshape of the stacked weights: still views): an outer Scan over
        the groups skips a whole group unless one of its experts was chosen, an inner one
        runs the chosen group's experts. E=64, k=4: at most 16 + 4 * 4 = 32 iterations for 64.
        """
        k, e = self.spec.num_experts_per_tok, self.spec.n_routed_experts
        # Pairs per expert, [E]; an expert with none is skipped inside the Scan.
        counts = op.ScatterElements(
            op.Constant(value=ir.tensor([0] * e, dtype=INT64)),
            flat_expert,
            op.Expand(op.Constant(value=ir.tensor(1, dtype=INT64)), op.Shape(flat_expert)),
            axis=0,
            reduction="add",
        )
        zero = op.Constant(value=ir.tensor(0, dtype=INT64))
        chosen = op.Greater(counts, zero)
        expert_ids = op.Range(
            zero,
            op.Constant(value=ir.tensor(e, dtype=INT64)),
            op.Constant(value=ir.tensor(1, dtype=INT64)),
        )
        zeros = op.Mul(to_float32(op, x), op.Constant(value=ir.tensor(0.0, dtype=FLOAT)))
        up, down = self.up, self.down

        def expert_body(op: OpBuilder) -> ir.Graph:  # one graph per Scan that runs it
            return self._scan_body(op, x, flat_row, flat_expert, flat_weight)

        def flat(op: OpBuilder) -> ir.Value:
            body = expert_body(op)
            return op.Scan(zeros, up, down, chosen, expert_ids, body=body, num_scan_inputs=4)

        group = scan_group_size(e, k)

        def grouped(op: OpBuilder) -> ir.Value:
            def by_group(value: ir.Value, *tail: int) -> ir.Value:
                return op.Reshape(value, op.Constant(value_ints=[e // group, group, *tail]))

            inner, width = self.spec.moe_intermediate_size, self.width
            group_chosen = op.Greater(
                op.ReduceSum(by_group(counts), op.Constant(value_ints=[1]), keepdims=0), zero
            )
            outer_body = self._group_body(op, expert_body(op), group)
            return op.Scan(
                zeros,
                by_group(up, inner, width),
                by_group(down, width, inner),
                by_group(chosen),
                by_group(expert_ids),
                group_chosen,
                body=outer_body,
                num_scan_inputs=5,
            )

        few_pairs = op.LessOrEqual(
            op.Size(flat_expert),
            op.Constant(value=ir.tensor(grouped_scan_pairs_limit(e, group), dtype=INT64)),
        )
        out = op.If(
            few_pairs,
            then_branch=self._acc_graph(op, grouped, "experts_scan_grouped"),
            else_branch=self._acc_graph(op, flat, "experts_scan_flat"),
        )
        out.type, out.shape = ir.TensorType(FLOAT), ir.Shape(["rows", self.width])
        return out

    def _acc_graph(self, op: OpBuilder, fn, name: str) -> ir.Graph:
        """A branch graph with no inputs whose one output is an FP32 [rows, D] accumulator."""
        width = ir.Shape(["rows", self.width])
        out = ir.Value(name=f"{name}_acc", type=ir.TensorType(FLOAT), shape=width)
        return op.builder.subgraph(fn, inputs=[], outputs=[out], name=name)

    def _scan_inputs(self, lead: tuple[int, ...] = ()) -> list[ir.Value]:
        """The per-iteration inputs of an experts Scan body: the accumulator, then one
        expert's (or, with `lead`, one group's) up / down slices, chosen flags and ids."""
        inner, width, dtype = self.spec.moe_intermediate_size, self.width, self.dtype
        lead_shape = list(lead)
        return [
            ir.Value(name="acc_in", type=ir.TensorType(FLOAT), shape=ir.Shape(["rows", width])),
            ir.Value(
                name="up_e", type=ir.TensorType(dtype), shape=ir.Shape([*lead_shape, inner, width])
            ),
            ir.Value(
                name="down_e",
                type=ir.TensorType(dtype),
                shape=ir.Shape([*lead_shape, width, inner]),
            ),
            ir.Value(name="chosen_e", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape(lead)),
            ir.Value(name="expert_e", type=ir.TensorType(INT64), shape=ir.Shape(lead)),
        ]

    def _acc_output(self) -> ir.Value:
        width = ir.Shape(["rows", self.width])
        return ir.Value(name="acc_out", type=ir.TensorType(FLOAT), shape=width)

    def _scan_body(
        self,
        op: OpBuilder,
        x: ir.Value,
        flat_row: ir.Value,
        flat_expert: ir.Value,
        flat_weight: ir.Value,
    ) -> ir.Graph:
        """One expert per iteration: if chosen, its rows' contribution is added to acc."""

        def body(
            op: OpBuilder,
            acc: ir.Value,
            up_e: ir.Value,
            down_e: ir.Value,
            chosen_e: ir.Value,
            expert: ir.Value,
        ):
            def run(op: OpBuilder) -> ir.Value:
                positions = op.Squeeze(
                    op.NonZero(op.Equal(flat_expert, expert)), op.Constant(value_ints=[0])
                )
                token_rows = op.Gather(flat_row, positions, axis=0)
                gate_weight = op.Unsqueeze(
                    op.Gather(flat_weight, positions, axis=0), op.Constant(value_ints=[1])
                )
                out = self._expert_rows(op, op.Gather(x, token_rows, axis=0), up_e, down_e)
                contribution = op.Mul(to_float32(op, out), gate_weight)
                return op.ScatterND(
                    acc,
                    op.Unsqueeze(token_rows, op.Constant(value_ints=[1])),
                    contribution,
                    reduction="add",
                )

            return op.If(
                chosen_e,
                then_branch=self._acc_graph(op, run, "expert_run"),
                else_branch=self._acc_graph(op, lambda op: op.Identity(acc), "skip"),
            )

        return op.builder.subgraph(
            body, inputs=self._scan_inputs(), outputs=[self._acc_output()], name="experts_scan_body"
        )

    def _group_body(self, op: OpBuilder, expert_body: ir.Graph, group: int) -> ir.Graph:
        """One group of experts per iteration: skipped whole unless one of them was chosen,
        else the experts Scan over its `group` slices."""

        def body(op: OpBuilder, acc, up_g, down_g, chosen_g, ids_g, group_chosen):
            def run(op: OpBuilder) -> ir.Value:
                return op.Scan(
                    acc, up_g, down_g, chosen_g, ids_g, body=expert_body, num_scan_inputs=4
                )

            return op.If(
                group_chosen,
                then_branch=self._acc_graph(op, run, "group_run"),
                else_branch=self._acc_graph(op, lambda op: op.Identity(acc), "group_skip"),
            )

        inputs = self._scan_inputs((group,))
        inputs.append(
            ir.Value(name="group_chosen", type=ir.TensorType(ir.DataType.BOOL), shape=ir.Shape([]))
        )
        return op.builder.subgraph(
            body, inputs=inputs, outputs=[self._acc_output()], name="experts_group_body"
        )

    def _expert_rows(
        self, op: OpBuilder, rows: ir.Value, up_e: ir.Value, down_e: ir.Value
    ) -> ir.Value:
        """down_e @ relu2(up_e @ rows^T), as [n, D], for one expert's slices (not constants).

        As `W @ x^T` the stored [out, in] slice is MatMul's A operand, streamed as is; MLAS
        then computes a 16-column panel for each of the n columns it has, so one row (a
        decode step) costs ~2x its memory time in arithmetic. As Gemm's transB operand the
        slice is re-packed per call instead, which is the cheaper of the two for one row and
        the dearer for several (a session microbenchmark on onnxruntime 1.32 CPU, 4 layers x
        4 experts: one row 5.2-6.6 vs 6.6-7.7 ms, eight rows 9.8-10.8 vs 8.2 ms; the one-row
        side is what benchmarks/investigations/decode_breakdown.py's gemm- and matmul-twins
        show). So an FP32 graph picks the form by the row count at run time; other precisions
        keep the MatMul form.
        """

        def matmul_form(op: OpBuilder) -> ir.Value:
            hidden = op.MatMul(up_e, op.Transpose(rows, perm=[1, 0]))  # [I, n]
            return op.Transpose(op.MatMul(down_e, relu_squared(op, hidden)), perm=[1, 0])

        if self.dtype != FLOAT:
            return matmul_form(op)

        def gemm_form(op: OpBuilder) -> ir.Value:
            hidden = op.Gemm(rows, up_e, transB=1)  # [1, I]
            return op.Gemm(relu_squared(op, hidden), down_e, transB=1)

        def graph(fn, name: str) -> ir.Graph:
            out = ir.Value(
                name=f"{name}_out",
                type=ir.TensorType(FLOAT),
                shape=ir.Shape(["n", self.width]),
            )
            return op.builder.subgraph(fn, inputs=[], outputs=[out], name=name)

        one_row = op.Equal(op.Shape(rows, start=0, end=1), op.Constant(value_ints=[1]))
        return op.If(
            op.Squeeze(one_row, op.Constant(value_ints=[0])),
            then_branch=graph(gemm_form, "expert_one_row"),
            else_branch=graph(matmul_form, "expert_rows"),
        )
