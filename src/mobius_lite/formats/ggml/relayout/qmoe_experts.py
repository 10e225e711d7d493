"""Stacked ggml experts as onnxruntime's com.microsoft QMoE operands (the fused CPU kernel).

QMoE computes every selected expert as fc2(act(fc1(x))) over block-wise 4- or 8-bit codes:
(code - zero_point) * scale per block along K, uint8 zero points, float32 scales. The exact
code layouts (exact_codes.py) without a min term fit it as they are: Q4_0 (4 bits), Q8_0,
Q6_K, IQ2_XXS, MXFP4 and NVFP4 (8 bits). Per-expert `.scale` sidecars multiply each expert's
block scales (formats/weight.py, ScaledExperts). The up projection is fc1 in SwiGLU's fused,
interleaved form, every row given twice (1.5x the experts' bytes; components/moe_fused.py
says why ReLU^2 comes out exactly). A layer with Q4_K experts takes the min-term layouts of
qmoe_min_term.py instead (`MinTermExperts`: the input's block sums appended for Q4_K up, the
intermediate doubled or tripled for Q4_K down), chosen for both slots together
(`QMoEExperts.paired_with`).

Kernel facts (onnxruntime 1.32 CPU, its schema and tests/test_cpu_fast_routes.py): 4-bit
experts keep float32 activations at accuracy 0 and 1, int8 at 4; 8-bit experts have no float32
kernel and use int8 activations at every level, so they belong to the int8 route only; fc1 and
fc2 must share one bit width and block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.formats.contrib import typed
from mobius_lite.formats.ggml.relayout.exact_codes import code_form
from mobius_lite.formats.ggml.relayout.exact_layout import layout_bytes_per_element
from mobius_lite.formats.ggml.relayout.exact_parts import (
    exact_layout_parameters,
    exact_layout_values,
)
from mobius_lite.formats.ggml.relayout.qmoe_min_term import (
    MIN_TYPE,
    SUB,
    SUMS_PER_SUPER,
    SUPER,
    MinTermOperand,
    MinTermPlan,
    ggml_bytes,
    min_term_bytes,
    min_term_plan,
    operand_shapes,
)
from mobius_lite.formats.ggml.types import GGML_TYPES, GGMLType
from mobius_lite.formats.parts import Operand, PartOf, part_parameters
from mobius_lite.formats.weight import FusedExperts, InsideQMoE, WeightFormat

UINT8 = ir.DataType.UINT8


def qmoe_refusal(type_name: str, int8: bool) -> str | None:
    """Why experts of this type cannot run on QMoE exactly (None when they can)."""
    form = code_form(type_name)
    if form is None:
        return f"ggml {type_name} experts have no exact QMoE layout"
    if form.bits == 8 and not int8:
        return f"ggml {type_name} experts are 8-bit: QMoE computes them with int8 activations only"
    return None


def experts_byte_cost(up_type: str, down_type: str) -> float:
    """The QMoE layouts' bytes (fc1 rows twice) over the ggml bytes of up and down expert
    tensors of equal element counts (as Nemotron-H's are)."""

    def ggml_bpe(name: str) -> float:
        t = GGML_TYPES[name]
        return t.block_bytes / t.block_elements

    packed = layout_bytes_per_element(up_type, repeat=2) + layout_bytes_per_element(down_type)
    return packed / (ggml_bpe(up_type) + ggml_bpe(down_type))


@dataclass(frozen=True)
class QMoEExperts(InsideQMoE):
    """One stacked expert slot ([E, N, K]) as QMoE's fc1 (up, rows twice) or fc2 (down)."""

    type: GGMLType
    dtype: ir.DataType
    shape: tuple[int, ...]
    kind: str  # "fc1" or "fc2"
    exact: WeightFormat  # the slot's exact format (a GGMLWeight), if the layer falls back to it
    int8: bool = False  # int8 activations allowed (the int8 route)

    @property
    def name(self) -> str:
        return f"ggml {self.type.name} (QMoE {self.kind}, {self.bits}-bit)"

    @property
    def bits(self) -> int:
        form = self.type.exact
        assert form is not None
        return form.bits

    @property
    def block_size(self) -> int:
        form = self.type.exact
        assert form is not None
        return form.block_size

    @property
    def stored_type(self) -> str:
        return self.type.name

    def layer_byte_cost(self, down: FusedExperts) -> float:
        """This fc1 and `down` (fc2) together: package bytes over the GGUF experts' bytes
        (the build's line calls them the source experts' bytes)."""
        return experts_byte_cost(self.type.name, down.stored_type)

    def layer_layout(self, down: FusedExperts) -> str:
        return "fc1 stores every up row twice (the SwiGLU form of ReLU^2)"

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return x

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        """This fc1 with `down` as fc2 of one QMoE node: as they are, or both on the min-term
        layouts when either is Q4_K; else why not (one bit width and block size)."""
        types = (self.type.name, down.stored_type)
        if MIN_TYPE in types and isinstance(down, QMoEExperts):
            plan = min_term_plan(*types, self.int8)
            if isinstance(plan, str):
                return plan
            up = MinTermExperts(self.type, self.dtype, self.shape, self.kind, plan, self.exact)
            fc2 = MinTermExperts(down.type, down.dtype, down.shape, down.kind, plan, down.exact)
            return up, fc2
        if MIN_TYPE not in types and (self.bits, self.block_size) == (down.bits, down.block_size):
            return self, down
        return "do not both fit one QMoE layout (one bit width and block size)"

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        return exact_layout_parameters(self.type.name, Operand.of_experts(self.kind), shape)

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """(weights, scales, zero points or None) for QMoE's fc1 / fc2 inputs."""
        parts = exact_layout_values(self.type.name, Operand.of_experts(self.kind), params)
        return parts["b"], parts["scales"], parts.get("zero_points")


@dataclass(frozen=True)
class MinTermExperts(InsideQMoE):
    """One stacked expert slot of a layer with Q4_K experts, on the layer's min-term `plan`
    (qmoe_min_term.py): fc1 (up: rows twice, tiled per intermediate copy, sum columns for Q4_K)
    or fc2 (down: [A2 | -B2] for Q4_K, zero rows for fc1's sum columns)."""

    type: GGMLType
    dtype: ir.DataType
    shape: tuple[int, ...]
    kind: str  # "fc1" or "fc2"
    plan: MinTermPlan
    exact: WeightFormat

    @property
    def name(self) -> str:
        p = self.plan
        return f"ggml {self.type.name} (QMoE {self.kind}, {p.bits}-bit, block {p.block}, min term)"

    @property
    def bits(self) -> int:
        return self.plan.bits

    @property
    def block_size(self) -> int:
        return self.plan.block

    @property
    def stored_type(self) -> str:
        return self.type.name

    def _shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        return operand_shapes(self.type.name, self.kind, self.plan, shape)

    @property
    def layout(self) -> MinTermOperand:
        return MinTermOperand(Operand.of_experts(self.kind), self.plan)

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        types = {"b": UINT8, "scales": ir.DataType.FLOAT, "zero_points": UINT8}
        return part_parameters(
            {PartOf(self.layout, p): (s, types[p]) for p, s in self._shapes(shape).items()}
        )

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        def part(name: str) -> str:
            return PartOf(self.layout, name).suffix

        return params[part("b")], params[part("scales")], params.get(part("zero_points"))

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        """fc1's input: x, with its block sums appended when up is Q4_K."""
        if self.kind != "fc1" or not self.plan.augmented:
            return x
        return augment_input(op, x, self.plan, self.shape[-1])

    def _bytes(self) -> int:
        return min_term_bytes(self.type.name, self.kind, self.plan, self.shape)

    def layer_byte_cost(self, down: FusedExperts) -> float:
        assert isinstance(down, MinTermExperts)
        stored = ggml_bytes(self.type.name, self.shape) + ggml_bytes(down.type.name, down.shape)
        return (self._bytes() + down._bytes()) / stored

    def layer_layout(self, down: FusedExperts) -> str:
        p = self.plan
        said = [f"{p.bits}-bit, block {p.block}", "fc1 stores every up row twice (the SwiGLU form)"]
        if p.augmented:
            said.append(f"Q4_K up's mins as {p.extra_columns(self.shape[-1])} block-sum columns")
        if p.copies > 1:
            said.append(f"Q4_K down's mins as {p.copies} copies of the intermediate")
        return "; ".join(said)

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        return self, down


def augment_input(op: OpBuilder, x: ir.Value, plan: MinTermPlan, hidden: int) -> ir.Value:
    """x [rows, hidden] -> [x, S (, S)]: S the 32-block sums of x, each super-block's 8 padded
    to one kernel block with zeros (qmoe_min_term.py, fc1's sum columns), once per min part."""
    supers = hidden // SUPER
    per_sub = op.Reshape(x, op.Constant(value_ints=[-1, supers, SUMS_PER_SUPER, SUB]))
    sums = op.ReduceSum(per_sub, op.Constant(value_ints=[-1]), keepdims=0)  # [rows, K/256, 8]
    padded = op.Pad(sums, op.Constant(value_ints=[0, 0, 0, 0, 0, plan.block - SUMS_PER_SUPER]))
    flat = op.Reshape(padded, op.Constant(value_ints=[-1, supers * plan.block]))
    out = op.Concat(x, *([flat] * plan.min_parts), axis=-1)
    return typed(out, ir.DataType.FLOAT, None)


__all__ = [
    "MinTermExperts",
    "QMoEExperts",
    "augment_input",
    "experts_byte_cost",
    "qmoe_refusal",
]
