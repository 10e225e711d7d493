"""NVFP4 and FP8 weight formats: the parameters of a ModelOpt linear (or of stacked experts)
and the math that computes with them, weight-only.

Activations stay in the build's precision. The weight is decoded to float32 exactly as the
numpy reference does ((e2m1 x e4m3) x weight_scale_2 for NVFP4, e4m3 x weight_scale for FP8)
and multiplied with float32 accumulation (Gemm in float32; 16-bit activations are widened for
it and the result rounded once). ModelOpt's W4A4 / W8A8 deployments also quantize the
activations with `input_scale`; this export does not (input_scale is recorded as unused).

Routes: standard ONNX ops (the "standard" backend; onnxruntime CPU today), or, for a single
linear on the "ort" backend, onnxruntime's CUDA kernels MatMulBlockQuantizedFp4Weight /
MatMulBlockQuantizedFp8Weight (16-bit activations only). Stacked experts always decode with
standard ops, after gathering only the selected experts' packed bytes and scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.errors import RouteError
from mobius_lite.formats.modelopt import fp8, nvfp4
from mobius_lite.formats.weight import FusedExperts, WeightFormat, gemm_transposed

FLOAT = ir.DataType.FLOAT
SIXTEEN_BIT = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)


def _check_kernel_dtype(dtype: ir.DataType, kernel: str) -> None:
    if dtype not in SIXTEEN_BIT:
        raise RouteError(
            f"--weights-backend ort computes with onnxruntime's {kernel}, which takes float16 or "
            f"bfloat16 activations, not {dtype.name.lower()}; use --dtype f16 (or bf16 with --ep "
            "cuda), or --weights-backend standard"
        )


def _gemm(
    op: OpBuilder, x: ir.Value, w: ir.Value, bias: ir.Value | None, dtype: ir.DataType
) -> ir.Value:
    """x @ w^T (+ bias) with float32 accumulation; w is FLOAT [N, K], the result in `dtype`."""
    if dtype == FLOAT:
        return gemm_transposed(op, x, w, bias)
    inputs = [op.Cast(x, to=FLOAT), w]
    if bias is not None:
        inputs.append(op.Cast(bias, to=FLOAT))
    return op.Cast(op.Gemm(*inputs, transB=1), to=dtype)


def _to(op: OpBuilder, value: ir.Value, dtype: ir.DataType) -> ir.Value:
    return value if dtype == FLOAT else op.Cast(value, to=dtype)


def _plain_scale(
    op: OpBuilder, scale: ir.Value, stored: tuple[int, ...], stacked: bool
) -> ir.Value:
    """A per-tensor scale as the emitters take it: [] (one linear) or [E] (stacked experts);
    releases store it as [] or [1]."""
    if not stored:
        return scale
    shape = np.array([-1] if stacked else [], dtype=np.int64)  # [] : a scalar
    return op.Reshape(scale, op.Constant(value=ir.tensor(shape)))


def _split(shape: tuple[int, ...], block: int, what: str) -> tuple[list[int], int, int]:
    *lead, n, k = shape
    if k % block:
        raise ValueError(f"{what}: K={k} is not a multiple of {block}")
    return list(lead), n, k


@dataclass(frozen=True)
class _ModelOptWeight:
    """What the ModelOpt formats share: the activation precision, stacking (experts) and the
    ort route's kernel (a single linear only)."""

    KIND: ClassVar[str] = ""
    KERNEL: ClassVar[str] = ""

    dtype: ir.DataType  # the activation precision
    stacked: bool = False
    kernel: bool = False

    def __post_init__(self) -> None:
        if self.kernel:
            _check_kernel_dtype(self.dtype, self.KERNEL)

    @property
    def name(self) -> str:
        return f"{self.KIND} (ort)" if self.kernel else self.KIND

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        if self.stacked:
            raise ValueError(f"stacked {self.KIND} weights compute through select(), not matmul()")
        if self.kernel:
            y = self._kernel_matmul(op, x, params)
            return op.Add(y, bias) if bias is not None else y
        return _gemm(op, x, self._dense(op, params), bias, self.dtype)

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        return f"{self.name} weights have no exact MatMulNBits layout"

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        return f"{self.name} experts have no QMoE layout"

    def _kernel_matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value]) -> ir.Value:
        """x @ W^T with the ort route's kernel."""
        raise NotImplementedError

    def _dense(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        """The whole weight decoded to FLOAT [N, K] at run time (standard ops)."""
        raise NotImplementedError


@dataclass(frozen=True)
class NVFP4Weight(_ModelOptWeight):
    """A ModelOpt NVFP4 weight: codes UINT8 [..., N, K/2], block scales [..., N, K/16]
    (FLOAT8E4M3FN; UINT8 bytes for the ort kernel), weight_scale_2 FLOAT [...] (+ the stored
    scalar shape), per expert when stacked."""

    KIND: ClassVar[str] = "nvfp4"
    KERNEL: ClassVar[str] = "MatMulBlockQuantizedFp4Weight"

    scale_2_shape: tuple[int, ...] = ()

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        lead, n, k = _split(shape, nvfp4.GROUP_SIZE, "NVFP4 weight")
        scale_type = ir.DataType.UINT8 if self.kernel else ir.DataType.FLOAT8E4M3FN
        return {
            "": nn.Parameter([*lead, n, k // 2], dtype=ir.DataType.UINT8),
            "_scale": nn.Parameter([*lead, n, k // nvfp4.GROUP_SIZE], dtype=scale_type),
            "_scale_2": nn.Parameter([*lead, *self.scale_2_shape], dtype=FLOAT),
        }

    def _scale_2(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        return _plain_scale(op, params["_scale_2"], self.scale_2_shape, self.stacked)

    def _kernel_matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value]) -> ir.Value:
        scale_2 = self._scale_2(op, params)
        return nvfp4.emit_matmul_ort(op, x, params[""], params["_scale"], scale_2)

    def _dense(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        scale_2 = self._scale_2(op, params)
        return nvfp4.emit_dense_at_run_time(op, params[""], params["_scale"], scale_2)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        rows = nvfp4.emit_rows(
            op,
            params[""],
            params["_scale"],
            self._scale_2(op, params),
            indices,
            per_row_scale_2=self.stacked,
        )
        return _to(op, rows, self.dtype)


@dataclass(frozen=True)
class FP8Weight(_ModelOptWeight):
    """A ModelOpt FP8 weight: FLOAT8E4M3FN [..., N, K] and its FLOAT per-tensor scale [...]
    (+ the stored scalar shape), per expert when stacked."""

    KIND: ClassVar[str] = "fp8"
    KERNEL: ClassVar[str] = "MatMulBlockQuantizedFp8Weight"

    scale_shape: tuple[int, ...] = ()

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        lead, n, k = _split(shape, 1, "FP8 weight")
        return {
            "": nn.Parameter([*lead, n, k], dtype=ir.DataType.FLOAT8E4M3FN),
            "_scale": nn.Parameter([*lead, *self.scale_shape], dtype=FLOAT),
        }

    def _scale(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        return _plain_scale(op, params["_scale"], self.scale_shape, False)

    def _kernel_matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value]) -> ir.Value:
        weight = params[""]
        scale = self._scale(op, params)
        return fp8.emit_matmul_ort(op, x, weight, scale, in_features=int(weight.shape[-1]))

    def _dense(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        # e4m3 * scale, one float32 rounding like the reference. DequantizeLinear rather than
        # Cast + Mul: onnxruntime does not constant-fold it, so the session keeps FP8 bytes.
        return op.DequantizeLinear(params[""], self._scale(op, params))

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        scale = _plain_scale(op, params["_scale"], self.scale_shape, self.stacked)
        if self.stacked:
            rows = fp8.emit_rows(op, params[""], scale, indices)
        else:  # rows of one table (e.g. an embedding): one scale for all
            rows = op.Mul(fp8.gather_widened(op, params[""], indices), scale)
        return _to(op, rows, self.dtype)
