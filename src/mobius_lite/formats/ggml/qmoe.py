"""Stacked ggml experts as onnxruntime's com.microsoft QMoE operands (the fused CPU kernel).

QMoE computes every selected expert as fc2(act(fc1(x))) over block-wise 4- or 8-bit codes:
(code - zero_point) * scale per block along K, uint8 zero points, float32 scales. The exact
code layouts (exact_codes.py) without a min term fit it: Q4_0 (4 bits), Q8_0, Q6_K and
IQ2_XXS (8 bits). Q4_K has none: its min is not a zero point and QMoE has no place for the
[K / 32] correction of an expert's input. The up projection is fc1 in SwiGLU's fused,
interleaved form, every row given twice (1.5x the experts' bytes; components/moe_fused.py
says why ReLU^2 comes out exactly).

Kernel facts (onnxruntime 1.32 CPU, its schema and tests/test_cpu_fast_routes.py): 4-bit
experts keep float32 activations at accuracy 0 and 1, int8 at 4; 8-bit experts have no float32
kernel and use int8 activations at every level, so they belong to the int8 route only.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.formats.contrib import contrib_op, typed
from mobius_lite.formats.ggml.exact_codes import code_form
from mobius_lite.formats.ggml.nbits_layout import layout_bytes_per_element, layout_parts
from mobius_lite.formats.ggml.relayout_part import FC1_KIND, FC2_KIND, part_suffix
from mobius_lite.formats.ggml.types import GGML_TYPES, GGMLType
from mobius_lite.formats.ggml.weight import GGMLWeight, exact_layout_parameters
from mobius_lite.formats.weight import FusedExperts, WeightFormat


def qmoe_refusal(type_name: str, int8: bool) -> str | None:
    """Why experts of this type cannot run on QMoE exactly (None when they can)."""
    form = code_form(type_name)
    if form is None:
        return f"ggml {type_name} experts have no exact QMoE layout"
    if form.has_mins:
        return f"ggml {type_name} experts have a min term QMoE cannot hold"
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
class QMoEExperts:
    """One stacked expert slot ([E, N, K]) as QMoE's fc1 (up, rows twice) or fc2 (down)."""

    type: GGMLType
    dtype: ir.DataType
    shape: tuple[int, ...]
    kind: str  # FC1_KIND or FC2_KIND
    exact: GGMLWeight  # the slot's exact format, if the layer falls back to it

    @property
    def name(self) -> str:
        return f"ggml {self.type.name} (QMoE {self.kind}, {self.bits}-bit)"

    @property
    def bits(self) -> int:
        form = code_form(self.type.name)
        assert form is not None
        return form.bits

    @property
    def block_size(self) -> int:
        form = code_form(self.type.name)
        assert form is not None
        return form.block_size

    @property
    def stored_type(self) -> str:
        return self.type.name

    def layer_byte_cost(self, down: FusedExperts) -> float:
        """This fc1 and `down` (fc2) together: package bytes over the GGUF experts' bytes."""
        return experts_byte_cost(self.type.name, down.stored_type)

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        return exact_layout_parameters(self.type.name, self.kind, shape)

    def operands(self, params: dict[str, ir.Value]) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        """(weights, scales, zero points or None) for QMoE's fc1 / fc2 inputs."""
        parts = {p: params[part_suffix(self.kind, p)] for p in layout_parts(self.type.name)}
        return parts["b"], parts["scales"], parts.get("zero_points")

    def matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value], bias=None):
        raise NotImplementedError("QMoE experts compute inside the QMoE node (moe_fused.py)")

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value):
        raise NotImplementedError("QMoE experts compute inside the QMoE node (moe_fused.py)")

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        return f"{self.name}: stacked experts, not a linear layer"

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        return self if kind == self.kind else self.exact.on_fused_experts(kind, int8)


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


__all__ = ["FC1_KIND", "FC2_KIND", "QMoEExperts", "emit_qmoe", "experts_byte_cost", "qmoe_refusal"]
