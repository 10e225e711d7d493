"""The matmul of an exact block-wise layout (exact_layout.py) as onnxruntime operators.

Y = x @ dequant(B)^T is one com.microsoft MatMulNBits node on the constant B, scales and
uint8 zero points. A layout with mins (Q4_K: value = (code - zero point) * scale - min per
32-block; the min is the residual of a centered zero point, exact_layout.py) also subtracts
sum_j (sum of x over 32-block j) * min[n, j]:
    Y -= ReduceSum(x viewed [rows, K / 32, 32], last axis) @ mins^T
a [rows, K / 32] x [K / 32, N] float32 product (1/32 of the matmul's work), which is exactly
the min term of sum_k x_k * ((code_k - zero point) * scale - min) in real arithmetic.

accuracy_level 0 keeps float32 activations (exact within float32 rounding); 4 lets the kernel
quantize them to int8 per block (the int8-activation route).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import emit_matmulnbits

MIN_BLOCK = 32  # Q4_K's min sub-block


def emit_exact_nbits_matmul(
    op: OpBuilder,
    x: ir.Value,
    params: dict[str, ir.Value],
    K: int,
    N: int,
    bits: int,
    block_size: int,
    *,
    bias: ir.Value | None = None,
    accuracy_level: int = 0,
) -> ir.Value:
    """x [rows, K] @ W^T (+ bias) -> [rows, N] from the layout's parts ("b", "scales",
    optional "zero_points" and "mins")."""
    mins = params.get("mins")
    y = emit_matmulnbits(
        op,
        x,
        params["b"],
        params["scales"],
        params.get("zero_points"),
        K,
        N,
        bits,
        block_size,
        bias=bias if mins is None else None,
        accuracy_level=accuracy_level,
    )
    if mins is None:
        return y
    blocks = op.Reshape(x, op.Constant(value_ints=[-1, K // MIN_BLOCK, MIN_BLOCK]))
    sums = op.ReduceSum(blocks, op.Constant(value_ints=[-1]), keepdims=0)  # [rows, K / 32]
    correction = (
        op.Gemm(sums, mins, transB=1)
        if bias is None
        else op.Gemm(sums, mins, op.Neg(bias), transB=1)
    )
    return op.Sub(y, op.Reshape(correction, op.Shape(y)))
