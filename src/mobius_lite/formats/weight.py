"""How a layer computes with a weight stored in some format: the WeightFormat protocol and its
first member, dense float weights.

A layer (Linear, Embedding, the experts) never branches on formats: it declares a weight slot
and asks the slot's format to create the parameters and to emit the math. Packed formats
(GGUF blocks, NVFP4, FP8) implement the same three methods with their own parameters and
decode, and say whether they move onto onnxruntime's fused CPU kernels (`--activations`):
`on_exact_layout` for a linear's MatMulNBits, `on_fused_experts` for a QMoE operand
(`FusedExperts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import onnx_ir as ir
from onnxscript import OpBuilder, nn


class WeightFormat(Protocol):
    """A weight's storage as the graph sees it."""

    name: str

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        """The parameters holding a logical [..., out, in] weight, by name suffix ("" is the
        weight slot's own name; e.g. "_scale" for a block-scale tensor beside it)."""
        ...

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        """x [rows, in] @ W^T (+ bias) -> [rows, out] in the activation precision."""
        ...

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        """The leading-axis slices W[indices] (embedding rows, chosen experts), decoded to the
        activation precision."""
        ...

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        """This weight's matmul on onnxruntime's MatMulNBits over an exact re-layout of its
        codes at `accuracy_level` (0: f32 activations, 4: int8; `--activations`), or why there
        is none (a sentence naming the format)."""
        ...

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        """This stacked expert slot as the fused experts kernel's "fc1" (up) or "fc2" (down)
        operand, exact unless `int8` allows int8 activations, or why it cannot be one (a
        sentence naming the format)."""
        ...


class FusedExperts(WeightFormat, Protocol):
    """A stacked expert slot as one operand of onnxruntime's fused QMoE kernel: its math runs
    inside the experts' one QMoE node (components/moe_fused.py), not through matmul / select."""

    @property
    def bits(self) -> int:
        """The operand's code width (QMoE's fc1 / fc2 expert_weight_bits)."""
        ...

    @property
    def block_size(self) -> int:
        """Elements per scale block along K."""
        ...

    @property
    def stored_type(self) -> str:
        """The name of the stored block type (for the build's lines)."""
        ...

    @property
    def exact(self) -> WeightFormat:
        """The slot's format on the exact route, should the layer fall back to it."""
        ...

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """(weights, scales, zero points or None): QMoE's fc1 / fc2 inputs (the parameters
        themselves, or a constant expression of them that onnxruntime folds once)."""
        ...

    def layer_byte_cost(self, down: FusedExperts) -> float:
        """This fc1 and `down` (fc2) together: package bytes over the stored experts' bytes."""
        ...

    def layer_layout(self, down: FusedExperts) -> str:
        """What this fc1 and `down` store beyond their codes (for the build's cost line)."""
        ...

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        """The fused kernel's input for expert input x [rows, width] (as fc1): x, or x with
        columns a layout needs appended (the kernel's output is then sliced back to width)."""
        ...

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        """The layer's (fc1, fc2) operands for this fc1 and `down` (one kernel takes both, with
        one bit width and block size), or why the two cannot share one kernel (a sentence)."""
        ...


# (checkpoint name of a weight slot, its logical shape) -> its format, or None for dense
WeightFormatResolver = Callable[[str, tuple[int, ...]], WeightFormat | None]


@dataclass(frozen=True)
class DenseWeight:
    """A float weight in the activation precision, stored [..., out, in] as the checkpoint."""

    dtype: ir.DataType

    @property
    def name(self) -> str:
        return f"dense {self.dtype.name.lower()}"

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        return {"": nn.Parameter(list(shape), dtype=self.dtype)}

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        return gemm_transposed(op, x, params[""], bias)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        return op.Gather(params[""], indices, axis=0)

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        return self  # a dense float matmul is exact already

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        return "dense experts take the fused MoE kernel as they are, not a QMoE layout"


def gemm_transposed(
    op: OpBuilder, x: ir.Value, weight: ir.Value, bias: ir.Value | None = None
) -> ir.Value:
    """x @ weight^T (+ bias): Gemm(transB=1) reads the weight in its stored [out, in] layout."""
    if bias is not None:
        return op.Gemm(x, weight, bias, transB=1)
    return op.Gemm(x, weight, transB=1)


# The parameter beside a weight slot that holds its output scale: "<slot>_output_scale".
OUTPUT_SCALE = "_output_scale"
FLOAT = ir.DataType.FLOAT


@dataclass(frozen=True)
class OutputScaled:
    """A weight whose products are multiplied by a stored FP32 scale: one value ([1]) for a
    matrix, one per slice ([E]) for stacked experts. `inner` is the weight's own format, built
    for FLOAT activations: the unscaled product of a 16-bit graph can leave the 16-bit range
    (an NVFP4 weight without its scale is ~1 / scale times too large), so the scaled linear
    computes in FP32 and rounds once.

    matmul: (x @ W^T) * s (+ bias), as llama.cpp applies a `.scale` tensor; select (rows of
    stacked experts): W[i] * s[i], the same product for the experts' matmuls that follow.
    """

    inner: WeightFormat
    dtype: ir.DataType  # the activation precision
    stacked: bool = False

    @property
    def name(self) -> str:
        return f"{self.inner.name} x output scale"

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        scales = shape[0] if self.stacked else 1
        return {
            **self.inner.parameters(shape),
            OUTPUT_SCALE: nn.Parameter([scales], dtype=FLOAT),
        }

    def _inner_params(self, params: dict[str, ir.Value]) -> dict[str, ir.Value]:
        return {k: v for k, v in params.items() if k != OUTPUT_SCALE}

    def _to_dtype(self, op: OpBuilder, value: ir.Value) -> ir.Value:
        return value if self.dtype == FLOAT else op.Cast(value, to=self.dtype)

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        wide = x if self.dtype == FLOAT else op.Cast(x, to=FLOAT)
        y = self.inner.matmul(op, wide, self._inner_params(params))
        y = self._to_dtype(op, op.Mul(y, params[OUTPUT_SCALE]))
        return y if bias is None else op.Add(y, bias)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        rows = self.inner.select(op, self._inner_params(params), indices)
        if self.stacked:
            scale = op.Gather(params[OUTPUT_SCALE], indices, axis=0)
            scale = op.Unsqueeze(scale, op.Constant(value_ints=[-1, -2]))
        else:
            scale = params[OUTPUT_SCALE]
        return self._to_dtype(op, op.Mul(rows, scale))

    @property
    def folds(self) -> bool:
        """Whether W * s can stand for this weight as one dense weight in the activation
        precision (folded_weight): the inner weight is dense in it."""
        return isinstance(self.inner, DenseWeight) and self.inner.dtype == self.dtype

    def folded_weight(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value | None:
        """W * s as a dense weight in the activation precision, when the inner weight is dense
        in it (a dequantized weight of an f32 build), else None. A constant expression of two
        parameters: onnxruntime folds it once at session creation, so the session holds the
        dense product (one float32 rounding: the reference's dequantized value) and the
        parameters are dropped. Stacked experts take it to compute as dense experts do (their
        Scan over weight slices and the fused MoE kernel need one dense tensor)."""
        if not self.folds:
            return None
        scale = params[OUTPUT_SCALE]
        if self.stacked:  # [E] -> [E, 1, 1]
            scale = op.Reshape(scale, op.Constant(value_ints=[-1, 1, 1]))
        return op.Mul(params[""], scale)

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        """The inner weight on its exact MatMulNBits layout, its output still scaled here."""
        moved = self.inner.on_exact_layout(accuracy_level)
        if isinstance(moved, str):
            return moved
        return OutputScaled(moved, self.dtype, self.stacked)

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        """The inner experts as a QMoE operand, each expert's scale folded into its scales."""
        moved = self.inner.on_fused_experts(kind, int8)
        if isinstance(moved, str):
            return moved
        return ScaledExperts(moved, kind, self)


class InsideQMoE:
    """What a QMoE operand answers as a weight format: it computes only inside the QMoE node
    (moe_fused.py), never as a linear layer or a gather. Needs `name`, `kind` and `exact`."""

    name: str
    kind: str
    exact: WeightFormat


@dataclass(frozen=True)
class ScaledExperts(InsideQMoE):
    """A QMoE operand (`inner`) whose experts' products are multiplied by a stored per-expert
    FP32 scale s [E] (OutputScaled around stacked experts, e.g. GGUF NVFP4 `.scale` sidecars).

    QMoE mixes the selected experts inside one node, so the scale cannot multiply each
    expert's fc1 / fc2 output there. It multiplies the operand's block scales instead: every
    value of expert e is (code - zero point) * scale, so scale * s[e] gives s[e] * W_e, whose
    products are llama.cpp's (x W_e^T) * s[e] (any sign; one float32 rounding per block
    scale). The product is a constant expression of two initializers, folded once when the
    session is created; the package keeps the layout's scales and the `.scale` as they are.
    (Folding s into the mixing weights instead fails: onnxruntime 1.32's CPU QMoE returned 0
    for mixing weights of 1e-9 and was right at 1e-6, measured; ModelOpt's s1^2 * s2 is often
    1e-9 or below.)
    """

    inner: FusedExperts
    kind: str  # "fc1" or "fc2"
    exact: WeightFormat  # the slot's OutputScaled format, should the layer fall back

    @property
    def name(self) -> str:
        return f"{self.inner.name} x output scale"

    @property
    def bits(self) -> int:
        return self.inner.bits

    @property
    def block_size(self) -> int:
        return self.inner.block_size

    @property
    def stored_type(self) -> str:
        return self.inner.stored_type

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        return {
            **self.inner.parameters(shape),
            OUTPUT_SCALE: nn.Parameter([shape[0]], dtype=FLOAT),
        }

    def _inner_params(self, params: dict[str, ir.Value]) -> dict[str, ir.Value]:
        return {k: v for k, v in params.items() if k != OUTPUT_SCALE}

    def matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value], bias=None):
        raise NotImplementedError("QMoE experts compute inside the QMoE node (moe_fused.py)")

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value):
        raise NotImplementedError("QMoE experts compute inside the QMoE node (moe_fused.py)")

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        return f"{self.name}: stacked experts, not a linear layer"

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        return self if kind == self.kind else self.exact.on_fused_experts(kind, int8)

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        weights, scales, zero_points = self.inner.operands(op, self._inner_params(params))
        per_expert = op.Reshape(params[OUTPUT_SCALE], op.Constant(value_ints=[-1, 1, 1]))
        return weights, op.Mul(scales, per_expert), zero_points

    def layer_byte_cost(self, down: FusedExperts) -> float:
        return self.inner.layer_byte_cost(_unscaled(down))

    def layer_layout(self, down: FusedExperts) -> str:
        return self.inner.layer_layout(_unscaled(down)) + "; output scales in the block scales"

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return self.inner.kernel_input(op, x)

    def with_inner(self, inner: FusedExperts) -> ScaledExperts:
        return self if inner is self.inner else ScaledExperts(inner, self.kind, self.exact)

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        paired = self.inner.paired_with(_unscaled(down))
        if isinstance(paired, str):
            return paired
        up, fc2 = paired
        return self.with_inner(up), down.with_inner(fc2) if isinstance(down, ScaledExperts) else fc2


def _unscaled(operand: FusedExperts) -> FusedExperts:
    return operand.inner if isinstance(operand, ScaledExperts) else operand
