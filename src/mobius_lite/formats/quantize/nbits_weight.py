"""How a layer computes with an int4 / int8 weight quantized at export (nbits.py).

Parameters beside the slot: `<slot>_q_b` (uint8 [..., N, K / block, block * bits / 8]),
`<slot>_q_scales` ([..., N, K / block], the activations' type) and, asymmetric only,
`<slot>_q_zero_points` (uint8 [..., N, ceil(K / block * bits / 8)]).

| backend  | matmul (2-D)                          | select (embedding rows, experts)        |
| standard | decode (standard ops) + Gemm(transB)  | Gather codes + decode                   |
| ort      | MatMulNBits (f32 / f16; accuracy 4    | Gather codes + decode; experts on QMoE  |
|          | with --activations int8)              | with --activations (nbits_qmoe.py)      |

Decoding is value = (code - zero point) * scale, the MatMulNBits definition. A decode reads
the codes through a run-time Reshape, so onnxruntime's constant folding keeps them packed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.contrib import is_ort, typed
from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import emit_matmulnbits
from mobius_lite.formats.ggml.weight import runtime_view
from mobius_lite.formats.parts import PartOf, part_parameters
from mobius_lite.formats.quantize.nbits_qmoe import NBitsQMoE, qmoe_refusal
from mobius_lite.formats.quantize.recipe import Recipe
from mobius_lite.formats.weight import FusedExperts, WeightFormat, gemm_transposed

PARTS = ("b", "scales", "zero_points")  # MatMulNBits' inputs, in their order


@dataclass(frozen=True)
class NBitsBlocks:
    """int4 / int8 blocks quantized at export, cut into MatMulNBits' B, scales and zero points:
    a re-layout whose parts (formats/parts.py) are `<slot>_q_b`, `_q_scales`, `_q_zero_points`."""

    @property
    def tag(self) -> str:
        return "q"


Q_BLOCKS = NBitsBlocks()
B_PART, SCALES_PART, ZERO_POINTS_PART = (PartOf(Q_BLOCKS, p) for p in PARTS)
B, SCALES, ZERO_POINTS = B_PART.suffix, SCALES_PART.suffix, ZERO_POINTS_PART.suffix
SCALE_TYPES = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


@dataclass(frozen=True)
class NBitsWeight:
    """A weight [..., N, K] as int4 / int8 MatMulNBits blocks (module doc)."""

    recipe: Recipe
    dtype: ir.DataType  # activation precision
    shape: tuple[int, ...]
    kernel: bool = False  # matmul on MatMulNBits
    accuracy_level: int = 0

    @classmethod
    def choose(
        cls, recipe: Recipe, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...]
    ) -> NBitsWeight:
        if dtype not in SCALE_TYPES:
            raise RouteError(
                f"{recipe.type.value} weights compute with f32 or f16 activations (their scales "
                f"are of that type), not {dtype.name.lower()}"
            )
        return cls(recipe, dtype, shape, kernel=is_ort(backend) and len(shape) == 2)

    @property
    def name(self) -> str:
        kind = "symmetric" if self.recipe.symmetric else "asymmetric"
        route = f"MatMulNBits accuracy {self.accuracy_level}" if self.kernel else "decode"
        return f"{self.recipe.type.value} block {self.recipe.block} {kind} ({route})"

    @property
    def bits(self) -> int:
        return self.recipe.type.bits

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        *lead, n, k = shape
        k_blocks = k // self.recipe.block
        parts = {
            B_PART: ([*lead, n, k_blocks, self.recipe.block * self.bits // 8], ir.DataType.UINT8),
            SCALES_PART: ([*lead, n, k_blocks], self.dtype),
        }
        if not self.recipe.symmetric:
            zp = (k_blocks * self.bits + 7) // 8
            parts[ZERO_POINTS_PART] = ([*lead, n, zp], ir.DataType.UINT8)
        return part_parameters(parts)

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        n, k = self.shape[-2], self.shape[-1]
        if self.kernel:
            if x.dtype is None:  # untyped builder value: activations are in self.dtype
                x.dtype = self.dtype
            y = emit_matmulnbits(
                op,
                x,
                params[B],
                params[SCALES],
                params.get(ZERO_POINTS),
                k,
                n,
                self.bits,
                self.recipe.block,
                bias=bias,
                accuracy_level=self.accuracy_level,
            )
            dims = None if x.shape is None else [*list(x.shape)[:-1], n]
            return typed(y, self.dtype, dims)
        viewed = {name: runtime_view(op, value, x) for name, value in params.items()}
        return gemm_transposed(op, x, self.decode(op, viewed), bias)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        rows = {name: op.Gather(value, indices, axis=0) for name, value in params.items()}
        return self.decode(op, rows)

    def decode(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        """(code - zero point) * scale: [..., N, K] in the activation precision."""
        b, k = params[B], self.shape[-1]
        k_blocks = k // self.recipe.block
        codes = b if self.bits == 8 else _nibbles(op, b, self.recipe.block)
        values = op.Cast(codes, to=ir.DataType.FLOAT)
        if ZERO_POINTS in params:
            zero = params[ZERO_POINTS]
            if self.bits == 4:
                zero = _nibbles(op, zero, -1)
            zero = op.Slice(zero, _ints(op, [0]), _ints(op, [k_blocks]), _ints(op, [-1]))
            zero = op.Unsqueeze(op.Cast(zero, to=ir.DataType.FLOAT), _ints(op, [-1]))
        else:
            zero = op.Constant(value_float=float(1 << (self.bits - 1)))
        scales = op.Cast(params[SCALES], to=ir.DataType.FLOAT)
        values = op.Mul(op.Sub(values, zero), op.Unsqueeze(scales, _ints(op, [-1])))
        lead = op.Shape(b, start=0, end=-2)
        values = op.Reshape(values, op.Concat(lead, _ints(op, [k]), axis=0))
        return values if self.dtype == ir.DataType.FLOAT else op.Cast(values, to=self.dtype)

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        if len(self.shape) != 2 or self.dtype != ir.DataType.FLOAT:
            return f"{self.recipe.type.value} weights take MatMulNBits as 2-D f32 weights only"
        return replace(self, kernel=True, accuracy_level=accuracy_level)

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        refusal = qmoe_refusal(self.recipe, self.dtype, self.shape, int8)
        return refusal or NBitsQMoE(self.recipe, self.dtype, self.shape, kind, self)


def _ints(op: OpBuilder, values: list[int]) -> Any:
    return op.Constant(value_ints=values)


def _nibbles(op: OpBuilder, packed: ir.Value, group: int) -> ir.Value:
    """uint8 [..., m] -> [..., m * 2] (low nibble first) reshaped to [..., group] blocks when
    `group` > 0, else kept flat along the last axis."""
    low = op.BitwiseAnd(packed, op.Constant(value=ir.tensor(15, dtype=ir.DataType.UINT8)))
    high = op.BitShift(
        packed, op.Constant(value=ir.tensor(4, dtype=ir.DataType.UINT8)), direction="RIGHT"
    )
    last = _ints(op, [-1])
    pairs = op.Concat(op.Unsqueeze(low, last), op.Unsqueeze(high, last), axis=-1)
    lead = op.Shape(packed, start=0, end=-1)
    return op.Reshape(pairs, op.Concat(lead, _ints(op, [group if group > 0 else -1]), axis=0))
