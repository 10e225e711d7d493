"""How a layer computes with a GGUF-packed weight: GGMLWeight (a WeightFormat) and its routes.

The parameter is the verbatim packed rows, uint8 [..., out, row_bytes], except for the
MatMulNBits route, whose two parameters are the lossless re-layout of Q8_0 / Q4_0 blocks
(B and scales: parts of relayout.MatMulNBitsBlocks, made by storage.RelayoutPart). Routes,
per weight slot:

| backend  | matmul                                        | select (embedding rows, experts) |
| standard | decode (standard ops) + Gemm(transB)           | Gather packed rows + decode      |
| ort      | MatMulNBits (Q8_0, Q4_0; f32 / f16)            | GatherPacked (CPU-supported      |
|          | MatMulPacked (bf16: CUDA only) else decode     | types, 2-D tables) else decode   |

A decode reads the packed initializer through a Reshape whose shape depends on the
activations at run time: onnxruntime's constant folding would otherwise decode every weight
at session creation and keep the dense result in memory (measured: docs/gguf.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.enums import Backend
from mobius_lite.formats.contrib import contrib_op, is_ort, typed
from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import (
    BLOCK_SIZE,
    NBITS_BLOCKS,
    emit_matmulnbits,
)
from mobius_lite.formats.ggml.relayout.exact_matmulnbits import emit_exact_nbits_matmul
from mobius_lite.formats.ggml.relayout.exact_parts import (
    exact_layout_parameters,
    exact_layout_values,
)
from mobius_lite.formats.ggml.relayout.qmoe_experts import QMoEExperts, qmoe_refusal
from mobius_lite.formats.ggml.types import GGML_TYPES, GGMLType
from mobius_lite.formats.parts import Operand, PartOf, part_parameters
from mobius_lite.formats.weight import FusedExperts, gemm_transposed

# MatMulNBits parameters beside (instead of) the slot's own: "<slot>_nbits_b", "_nbits_scales".
NBITS_B = PartOf(NBITS_BLOCKS, "b")
NBITS_SCALES = PartOf(NBITS_BLOCKS, "scales")

# ggml types onnxruntime 1.32's CPU GatherPacked accepts (their GGMLType rows' `gather_packed`;
# TQ1_0, TQ2_0, MXFP4, NVFP4 and Q1_0 are refused, tests/formats/test_ggml_fp4_ternary.py).
GATHER_PACKED_CPU = frozenset(t.name for t in GGML_TYPES.values() if t.gather_packed)
# MatMulPacked has no CPU kernel and takes f16 / bf16 activations; used for bf16 graphs only
# (bf16 runs on CUDA only, routes.PROVIDER_PRECISIONS), with the types of the same contract.
MATMUL_PACKED = GATHER_PACKED_CPU

DECODE, MATMULNBITS, GATHER_PACKED, MATMUL_PACKED_ROUTE = (
    "decode",
    "matmulnbits",
    "gatherpacked",
    "matmulpacked",
)
# MatMulNBits on an exact code layout (exact_codes.py: Q4_0, Q8_0, Q4_K, Q6_K, IQ2_XXS, MXFP4,
# NVFP4) with uint8 zero points, at the weight's accuracy level (0: f32 activations, 4: int8)
NBITS_EXACT = "nbits-exact"


@dataclass(frozen=True)
class GGMLWeight:
    """A weight of logical shape [..., out, in] kept as ggml blocks; `matmul_route` and
    `select_route` say which operators compute with it (see the module table)."""

    type: GGMLType
    dtype: ir.DataType  # activation precision
    shape: tuple[int, ...]
    matmul_route: str = DECODE
    select_route: str = DECODE
    accuracy_level: int = 0  # MatMulNBits' on the nbits-exact route

    @classmethod
    def choose(
        cls, ggml: GGMLType, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...]
    ) -> GGMLWeight:
        """The routes for one slot, as the type's row has them (types.py): onnxruntime's ops
        where they fit, else standard decode."""
        matmul, select = DECODE, DECODE
        if is_ort(backend) and len(shape) == 2:
            if ggml.blocks is not None and dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
                matmul = MATMULNBITS
            elif ggml.gather_packed and dtype == ir.DataType.BFLOAT16:  # MatMulPacked's contract
                matmul = MATMUL_PACKED_ROUTE
            if ggml.gather_packed and matmul != MATMULNBITS:
                select = GATHER_PACKED
        return cls(ggml, dtype, shape, matmul, select)

    def on_exact_layout(self, accuracy_level: int) -> GGMLWeight | str:
        """This 2-D float32 weight's matmul on MatMulNBits over its exact code layout at
        `accuracy_level`, or why there is none (a sentence naming the type)."""
        if self.type.exact is None:
            return f"ggml {self.type.name} has no exact MatMulNBits layout"
        if len(self.shape) != 2 or self.dtype != ir.DataType.FLOAT:
            return f"ggml {self.type.name}: the exact MatMulNBits layout needs 2-D f32 weights"
        return GGMLWeight(self.type, self.dtype, self.shape, NBITS_EXACT, DECODE, accuracy_level)

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        """This stacked expert slot as QMoE's fc1 ("fc1", up) or fc2 ("fc2", down) operand
        (formats/ggml/relayout/qmoe_experts.py), or why it cannot be one exactly (a sentence)."""
        refusal = qmoe_refusal(self.type.name, int8)
        if refusal is not None:
            return refusal
        if len(self.shape) != 3 or self.dtype != ir.DataType.FLOAT:
            return f"ggml {self.type.name} experts: QMoE needs stacked f32-activation experts"
        return QMoEExperts(self.type, self.dtype, self.shape, kind, self, int8)

    @property
    def name(self) -> str:
        if self.matmul_route == NBITS_EXACT:
            return f"ggml {self.type.name} ({NBITS_EXACT}, accuracy {self.accuracy_level})"
        return f"ggml {self.type.name} ({self.matmul_route} / {self.select_route})"

    @property
    def row_elements(self) -> int:
        return self.shape[-1]

    # ------------------------------------------------------------------ parameters
    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        *lead, k = shape
        if self.matmul_route == NBITS_EXACT:
            return exact_layout_parameters(self.type.name, Operand.MATMUL, shape)
        if self.matmul_route == MATMULNBITS:
            k_blocks = k // BLOCK_SIZE
            blob = self.type.block_bytes - 2
            return part_parameters(
                {
                    NBITS_B: ([*lead, k_blocks, blob], ir.DataType.UINT8),
                    NBITS_SCALES: ([*lead, k_blocks], ir.DataType.FLOAT16),
                }
            )
        return {"": nn.Parameter([*lead, self.type.row_bytes(k)], dtype=ir.DataType.UINT8)}

    # ------------------------------------------------------------------ math
    def _to_activation(self, op: OpBuilder, value: ir.Value) -> ir.Value:
        return value if self.dtype == ir.DataType.FLOAT else op.Cast(value, to=self.dtype)

    def decode(self, op: OpBuilder, packed: ir.Value) -> ir.Value:
        """uint8 [..., row_bytes] -> [..., row_elements] in the activation precision."""
        return self._to_activation(op, self.type.codec.emit(op, packed, self.row_elements))

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        n, k = self.shape[-2], self.shape[-1]
        if self.matmul_route == NBITS_EXACT:
            form = self.type.exact
            assert form is not None
            parts = exact_layout_values(self.type.name, Operand.MATMUL, params)
            y = emit_exact_nbits_matmul(
                op,
                x,
                parts,
                k,
                n,
                form.bits,
                form.block_size,
                bias=bias,
                accuracy_level=self.accuracy_level,
            )
            return typed(y, self.dtype, _with(_dims(x, drop_last=True), n))
        if self.matmul_route == MATMULNBITS:
            form = self.type.blocks
            assert form is not None
            if x.dtype is None:  # untyped builder value: activations are in self.dtype
                x.dtype = self.dtype
            nbits = params[NBITS_B.suffix], params[NBITS_SCALES.suffix]
            y = emit_matmulnbits(op, x, *nbits, None, k, n, form.bits, BLOCK_SIZE, bias=bias)
            return typed(y, self.dtype, _with(_dims(x, drop_last=True), n))
        if self.matmul_route == MATMUL_PACKED_ROUTE:
            y = op.MatMulPacked(
                x,
                params[""],
                packed_type=self.type.type_id,
                N=n,
                K=k,
                **contrib_op(op),
            )
            y = typed(y, self.dtype, _with(_dims(x, drop_last=True), n))
            return y if bias is None else op.Add(y, bias)
        weight = self.decode(op, runtime_view(op, params[""], x))
        return gemm_transposed(op, x, weight, bias)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        if self.select_route == GATHER_PACKED:
            rows = op.GatherPacked(
                params[""],
                indices,
                packed_type=self.type.type_id,
                K=self.row_elements,
                output_dtype=int(self.dtype),
                **contrib_op(op),
            )
            return typed(rows, self.dtype, _with(_dims(indices), self.row_elements))
        if self.matmul_route == MATMULNBITS:
            return self._select_nbits(op, params, indices)
        return self.decode(op, op.Gather(params[""], indices, axis=0))

    def _select_nbits(
        self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value
    ) -> ir.Value:
        """Rows of the MatMulNBits layout decoded: (code - zero point) * scale, as ggml's."""
        b = op.Gather(params[NBITS_B.suffix], indices, axis=0)  # [..., k_blocks, blob]
        scales = op.Cast(
            op.Gather(params[NBITS_SCALES.suffix], indices, axis=0), to=ir.DataType.FLOAT
        )
        form = self.type.blocks
        assert form is not None
        if form.bits == 8:
            codes = b
        else:  # element 2i in the low nibble of byte i, 2i + 1 in the high one
            last = op.Constant(value_ints=[-1])
            low = op.BitwiseAnd(b, op.Constant(value=ir.tensor(15, dtype=ir.DataType.UINT8)))
            four = op.Constant(value=ir.tensor(4, dtype=ir.DataType.UINT8))
            high = op.BitShift(b, four, direction="RIGHT")
            pairs = op.Concat(op.Unsqueeze(low, last), op.Unsqueeze(high, last), axis=-1)
            lead = op.Shape(b, start=0, end=-1)
            codes = op.Reshape(pairs, op.Concat(lead, op.Constant(value_ints=[BLOCK_SIZE]), axis=0))
        values = op.Cast(codes, to=ir.DataType.FLOAT)
        values = op.Sub(values, op.Constant(value_float=float(form.zero_point)))
        values = op.Mul(values, op.Unsqueeze(scales, op.Constant(value_ints=[-1])))
        lead = op.Shape(b, start=0, end=-2)
        rows = op.Reshape(
            values, op.Concat(lead, op.Constant(value_ints=[self.row_elements]), axis=0)
        )
        return self._to_activation(op, rows)


def _dims(value: ir.Value, drop_last: bool = False) -> list[Any] | None:
    """A value's dims (without the last axis when asked), None when unknown."""
    if value.shape is None:
        return None
    dims = list(value.shape)
    return dims[:-1] if drop_last else dims


def _with(dims: list[Any] | None, last: int) -> list[Any] | None:
    return None if dims is None else [*dims, last]


def runtime_view(op: OpBuilder, packed: ir.Value, x: ir.Value) -> ir.Value:
    """`packed` reshaped to its own shape by a shape computed from x at run time: the same
    bytes, but no longer a constant that onnxruntime's constant folding would decode (and keep
    dense) at session creation."""
    shape = [int(d) for d in packed.shape]
    zero = op.Mul(op.Shape(x, start=0, end=1), op.Constant(value_ints=[0]))
    return op.Reshape(packed, op.Add(op.Constant(value_ints=shape), zero))
