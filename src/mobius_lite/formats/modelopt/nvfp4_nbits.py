"""ModelOpt NVFP4 on onnxruntime's 8-bit block-wise CPU kernels (MatMulNBits, QMoE), exactly.

Each E2M1 value doubled is an integer in [-12, 12], so an NVFP4 weight is an 8-bit block-wise
weight of block 16 (one E4M3 scale per 16 inputs):
    W[n, k] = e2m1 * e4m3 * s2 = (code - 128) * e4m3 * (s2 / 2),   code = 2 e2m1 + 128
(every factor exact; (2 e2m1) * (s2 / 2) = e2m1 * s2). The kernels' scale is the E4M3 value
(widened to FLOAT, exact); the per-tensor s2 / 2 multiplies the linear's output, or for
stacked experts each expert's block scales (one float32 rounding per scale;
formats/weight.py, ScaledExperts, says why not its output).

The package keeps ModelOpt's bytes verbatim (codes uint8 [..., N, K/2], low nibble = even k;
scales FLOAT8E4M3FN). The 8-bit operands are a constant expression of them (a [256, 2] byte
table, a Cast) that onnxruntime folds once at session creation, before MatMulNBits prepacks:
the package costs the checkpoint's bytes, the session 1.25 bytes per weight (2.5 for QMoE's
fc1, whose rows the SwiGLU form of ReLU^2 gives twice). `verify` compares the verbatim bytes;
tests/test_modelopt_int8_route.py holds the folded operands to the format's definition.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.contrib import contrib_op, typed
from mobius_lite.formats.modelopt.nvfp4 import E2M1_VALUES, GROUP_SIZE, unpack_codes

BITS = 8
ZERO_POINT = 128  # MatMulNBits' / QMoE's default for 8 bits: no zero-point input
FLOAT = ir.DataType.FLOAT


def _code_pairs() -> np.ndarray:
    """uint8 [256, 2]: the two 8-bit codes 2 e2m1 + 128 of every byte, low nibble first."""
    doubled = np.rint(2 * E2M1_VALUES).astype(np.int16) + ZERO_POINT  # E2M1's -0 -> 128
    return doubled[unpack_codes(np.arange(256, dtype=np.uint8)[:, None])].astype(np.uint8)


CODE_PAIRS: np.ndarray = _code_pairs()
CODE_PAIRS.setflags(write=False)


def emit_codes(op: OpBuilder, weight: ir.Value, repeat: int = 1) -> ir.Value:
    """uint8 codes [..., N, K/2] -> uint8 [..., N * repeat, K/16, 16]: each byte's two codes,
    every row `repeat` times in a row ([r0, r0, r1, r1, ...] for repeat 2)."""
    *lead, n, half = (int(d) for d in weight.shape)
    table = op.Constant(value=ir.tensor(CODE_PAIRS))
    codes = op.Gather(table, op.Cast(weight, to=ir.DataType.INT64), axis=0)  # [..., N, K/2, 2]
    blocks = [*lead, n, 1, half * 2 // GROUP_SIZE, GROUP_SIZE]
    codes = op.Reshape(codes, op.Constant(value_ints=blocks))
    if repeat > 1:
        codes = op.Concat(*([codes] * repeat), axis=-3)  # [..., N, repeat, K/16, 16]
    out = [*lead, n * repeat, half * 2 // GROUP_SIZE, GROUP_SIZE]
    return op.Reshape(codes, op.Constant(value_ints=out))


def emit_scales(op: OpBuilder, weight_scale: ir.Value, repeat: int = 1) -> ir.Value:
    """E4M3 block scales [..., N, K/16] -> FLOAT [..., N * repeat, K/16] (exact widening)."""
    scales = op.Cast(weight_scale, to=FLOAT)
    if repeat == 1:
        return scales
    *lead, n, groups = (int(d) for d in weight_scale.shape)
    twice = op.Concat(*([op.Unsqueeze(scales, [-2])] * repeat), axis=-2)  # [..., N, r, K/16]
    return op.Reshape(twice, op.Constant(value_ints=[*lead, n * repeat, groups]))


def half_scale_2(op: OpBuilder, scale_2: ir.Value) -> ir.Value:
    """s2 / 2, the output factor of the doubled codes (exact: a power-of-two step)."""
    return op.Mul(scale_2, op.Constant(value=ir.tensor(np.float32(0.5))))


def emit_matmul(
    op: OpBuilder,
    x: ir.Value,
    weight: ir.Value,
    weight_scale: ir.Value,
    scale_2: ir.Value,
    accuracy_level: int,
) -> ir.Value:
    """x [rows, K] (FLOAT) @ W^T -> FLOAT [rows, N]: one MatMulNBits (bits 8, block 16) over
    the folded operands, times s2 / 2."""
    n, k = int(weight.shape[-2]), int(weight.shape[-1]) * 2
    codes = emit_codes(op, weight)
    y = op.MatMulNBits(
        x,
        codes,
        emit_scales(op, weight_scale),
        K=k,
        N=n,
        bits=BITS,
        block_size=GROUP_SIZE,
        accuracy_level=accuracy_level,
        **contrib_op(op),
    )
    y = typed(y, FLOAT, None)
    return op.Mul(y, half_scale_2(op, scale_2))
