"""int4 / int8 stacked experts quantized at export as onnxruntime's QMoE operands.

QMoE computes each selected expert from block-wise codes along K, (code - zero point) *
scale with float32 scales and uint8 zero points (omitted: the symmetric default 2^(bits-1)),
which is what int4 / int8 blocks are (nbits.py). fc1 (up) takes SwiGLU's fused form, every
row given twice in a row (components/moe_fused.py: ReLU^2 exactly), so the experts store
1.5x their bytes. Kernel facts as for ggml experts (formats/ggml/relayout/qmoe_experts.py):
4-bit experts keep float32 activations at accuracy 0, 8-bit ones compute with int8 activations
only; fc1 and fc2 share one bit width and block size.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.formats.parts import CodeLayout, Operand, part_parameters
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.formats.weight import FusedExperts, InsideQMoE, WeightFormat

EXPERTS_COST = 1.5  # fc1 rows twice over up and down of equal size: (2 + 1) / 2


def qmoe_refusal(recipe: Recipe, dtype: ir.DataType, shape: tuple[int, ...], int8: bool) -> str:
    """Why these experts cannot be QMoE operands exactly ("" when they can)."""
    if len(shape) != 3 or dtype != ir.DataType.FLOAT:
        return f"{recipe.type.value} experts: QMoE needs stacked f32-activation experts"
    if recipe.type.bits == 8 and not int8:
        return f"{recipe.type.value} experts: QMoE computes 8-bit experts with int8 activations"
    return ""


@dataclass(frozen=True)
class NBitsQMoE(InsideQMoE):
    """One stacked int4 / int8 expert slot ([E, N, K]) as QMoE's fc1 (up) or fc2 (down)."""

    recipe: Recipe
    dtype: ir.DataType
    shape: tuple[int, ...]
    kind: str  # "fc1" or "fc2"
    exact: WeightFormat  # the slot's NBitsWeight, should the layer fall back to it

    @property
    def name(self) -> str:
        return f"{self.recipe.type.value} block {self.recipe.block} (QMoE {self.kind})"

    @property
    def bits(self) -> int:
        return self.recipe.type.bits

    @property
    def block_size(self) -> int:
        return self.recipe.block

    @property
    def stored_type(self) -> str:
        return f"{self.recipe.type.value} block {self.recipe.block}"

    @property
    def layout(self) -> CodeLayout:
        """The slot's code layout for its QMoE operand (fc1: every row twice)."""
        return CodeLayout(Operand.of_experts(self.kind))

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        *lead, n, k = shape
        layout = self.layout
        rows, k_blocks = n * layout.operand.repeat, k // self.recipe.block
        parts = {
            layout.part("b"): (
                [*lead, rows, k_blocks * self.recipe.block * self.bits // 8],
                ir.DataType.UINT8,
            ),
            layout.part("scales"): ([*lead, rows, k_blocks], ir.DataType.FLOAT),
        }
        if not self.recipe.symmetric:
            zp = (k_blocks * self.bits + 7) // 8
            parts[layout.part("zero_points")] = ([*lead, rows, zp], ir.DataType.UINT8)
        return part_parameters(parts)

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        layout = self.layout
        return (
            params[layout.part("b").suffix],
            params[layout.part("scales").suffix],
            params.get(layout.part("zero_points").suffix),
        )

    def layer_byte_cost(self, down: FusedExperts) -> float:
        return EXPERTS_COST

    def layer_layout(self, down: FusedExperts) -> str:
        return "fc1 stores every up row twice (the SwiGLU form of ReLU^2)"

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return x

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        if isinstance(down, NBitsQMoE) and (down.bits, down.block_size) == (
            self.bits,
            self.block_size,
        ):
            return self, down
        return "do not both fit one QMoE layout (one bit width and block size)"
