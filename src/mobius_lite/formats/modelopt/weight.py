"""NVFP4 and FP8 weight formats: the parameters of a ModelOpt linear (or of stacked experts)
and the math that computes with them, weight-only.

Activations stay in the build's precision. The weight is decoded to float32 exactly as the
numpy reference does ((e2m1 x e4m3) x weight_scale_2 for NVFP4, e4m3 x weight_scale for FP8)
and multiplied with float32 accumulation (Gemm in float32; 16-bit activations are widened for
it and the result rounded once). ModelOpt's W4A4 / W8A8 deployments also quantize the
activations with `input_scale`; this export does not (input_scale is recorded as unused).

Routes: standard ONNX ops (the "standard" backend; onnxruntime CPU today), or, for a single
linear on the "ort" backend, onnxruntime's CUDA kernels MatMulBlockQuantizedFp4Weight /
MatMulBlockQuantizedFp8Weight (16-bit activations only). Stacked experts decode with standard
ops, after gathering only the selected experts' packed bytes and scales. Under
`--activations exact-fused | int8` (f32, CPU) NVFP4 moves onto the 8-bit block-16 layout of
nvfp4_nbits.py: MatMulNBits for a linear (`on_exact_layout`), QMoE for stacked experts
(`on_fused_experts`, int8 only: QMoE has no f32 kernel for 8-bit experts). FP8 has no exact
integer layout (an E4M3 value is not one 8-bit integer times a block scale); there its linears
keep the standard decode.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.errors import RouteError
from mobius_lite.formats.contrib import typed
from mobius_lite.formats.modelopt import fp8, nvfp4, nvfp4_nbits
from mobius_lite.formats.weight import FusedExperts, InsideQMoE, WeightFormat, gemm_transposed

FLOAT = ir.DataType.FLOAT
SIXTEEN_BIT = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# the parameter beside a weight slot holding its `weight_scale` (FP8: per tensor; NVFP4: per
# 16-element block): `<slot>_scale`
SCALE = "_scale"


def _check_kernel_dtype(dtype: ir.DataType, kernel: str) -> None:
    if dtype not in SIXTEEN_BIT:
        raise RouteError(
            f"--weights-backend ort computes with onnxruntime's {kernel}, which takes float16 or "
            f"bfloat16 activations, not {dtype.name.lower()}; use --dtype f16 / dtype='f16' "
            "(or bf16 with --ep cuda), or --weights-backend standard / weights_backend='standard'"
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
            # checked here, when the graph is built (before any tensor is read): under
            # --activations (f32, CPU) a linear leaves the CUDA kernel first (on_exact_layout)
            _check_kernel_dtype(self.dtype, self.KERNEL)
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
    # MatMulNBits' accuracy level on the 8-bit layout (nvfp4_nbits.py); None: not on it
    nbits_accuracy: int | None = None

    @property
    def name(self) -> str:
        if self.nbits_accuracy is not None:
            return f"nvfp4 (MatMulNBits 8-bit block 16, accuracy {self.nbits_accuracy})"
        return super().name

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        """A linear's matmul on MatMulNBits over the exact 8-bit layout (nvfp4_nbits.py)."""
        if self.stacked or self.dtype != FLOAT:
            return f"{self.name}: the 8-bit MatMulNBits layout needs a 2-D f32 weight"
        return replace(self, kernel=False, nbits_accuracy=accuracy_level)

    def on_fused_experts(self, kind: str, int8: bool) -> FusedExperts | str:
        """Stacked experts as a QMoE operand over the exact 8-bit layout (nvfp4_nbits.py)."""
        if not self.stacked or self.dtype != FLOAT:
            return f"{self.name}: QMoE needs stacked f32-activation experts"
        if not int8:
            return f"{self.name} experts are 8-bit on QMoE: int8 activations only"
        return NVFP4QMoEExperts(self, kind)

    def matmul(
        self,
        op: OpBuilder,
        x: ir.Value,
        params: dict[str, ir.Value],
        bias: ir.Value | None = None,
    ) -> ir.Value:
        if self.nbits_accuracy is None:
            return super().matmul(op, x, params, bias)
        if x.dtype is None:  # an untyped builder value: activations are FLOAT here
            x.dtype = FLOAT
        y = nvfp4_nbits.emit_matmul(
            op, x, params[""], params[SCALE], self._scale_2(op, params), self.nbits_accuracy
        )
        return y if bias is None else op.Add(y, bias)

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        lead, n, k = _split(shape, nvfp4.GROUP_SIZE, "NVFP4 weight")
        scale_type = ir.DataType.UINT8 if self.kernel else ir.DataType.FLOAT8E4M3FN
        return {
            "": nn.Parameter([*lead, n, k // 2], dtype=ir.DataType.UINT8),
            SCALE: nn.Parameter([*lead, n, k // nvfp4.GROUP_SIZE], dtype=scale_type),
            "_scale_2": nn.Parameter([*lead, *self.scale_2_shape], dtype=FLOAT),
        }

    def _scale_2(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        return _plain_scale(op, params["_scale_2"], self.scale_2_shape, self.stacked)

    def _kernel_matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value]) -> ir.Value:
        scale_2 = self._scale_2(op, params)
        return nvfp4.emit_matmul_ort(op, x, params[""], params[SCALE], scale_2)

    def _dense(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        scale_2 = self._scale_2(op, params)
        return nvfp4.emit_dense_at_run_time(op, params[""], params[SCALE], scale_2)

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        rows = nvfp4.emit_rows(
            op,
            params[""],
            params[SCALE],
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

    def on_exact_layout(self, accuracy_level: int) -> WeightFormat | str:
        """FP8 has no exact integer layout; on the fused CPU routes a linear leaves the CUDA
        kernel for the standard decode (exact), elsewhere it stays as it is (a sentence)."""
        if self.kernel:
            return replace(self, kernel=False)
        return super().on_exact_layout(accuracy_level)

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        lead, n, k = _split(shape, 1, "FP8 weight")
        return {
            "": nn.Parameter([*lead, n, k], dtype=ir.DataType.FLOAT8E4M3FN),
            SCALE: nn.Parameter([*lead, *self.scale_shape], dtype=FLOAT),
        }

    def _scale(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        return _plain_scale(op, params[SCALE], self.scale_shape, False)

    def _kernel_matmul(self, op: OpBuilder, x: ir.Value, params: dict[str, ir.Value]) -> ir.Value:
        weight = params[""]
        scale = self._scale(op, params)
        return fp8.emit_matmul_ort(op, x, weight, scale, in_features=int(weight.shape[-1]))

    def _dense(self, op: OpBuilder, params: dict[str, ir.Value]) -> ir.Value:
        # e4m3 * scale, one float32 rounding like the reference. DequantizeLinear rather than
        # Cast + Mul: onnxruntime does not constant-fold it, so the session keeps FP8 bytes.
        return op.DequantizeLinear(params[""], self._scale(op, params))

    def select(self, op: OpBuilder, params: dict[str, ir.Value], indices: ir.Value) -> ir.Value:
        scale = _plain_scale(op, params[SCALE], self.scale_shape, self.stacked)
        if self.stacked:
            rows = fp8.emit_rows(op, params[""], scale, indices)
        else:  # rows of one table (e.g. an embedding): one scale for all
            rows = op.Mul(fp8.gather_widened(op, params[""], indices), scale)
        return _to(op, rows, self.dtype)


@dataclass(frozen=True)
class NVFP4QMoEExperts(InsideQMoE):
    """Stacked ModelOpt NVFP4 experts as QMoE's fc1 (up: rows twice, the SwiGLU form of
    ReLU^2) or fc2 (down) operand: 8-bit codes, block 16, folded at session creation from the
    verbatim parameters (nvfp4_nbits.py); each expert's weight_scale_2 / 2 multiplies its block
    scales in the same folded expression (formats/weight.py, ScaledExperts, says why there)."""

    exact: NVFP4Weight
    kind: str  # "fc1" or "fc2"

    bits: ClassVar[int] = nvfp4_nbits.BITS
    block_size: ClassVar[int] = nvfp4.GROUP_SIZE
    stored_type: ClassVar[str] = "NVFP4"

    @property
    def name(self) -> str:
        return f"nvfp4 (QMoE {self.kind}, 8-bit block 16)"

    @property
    def _repeat(self) -> int:
        return 2 if self.kind == "fc1" else 1

    def parameters(self, shape: tuple[int, ...]) -> dict[str, nn.Parameter]:
        return self.exact.parameters(shape)

    def operands(
        self, op: OpBuilder, params: dict[str, ir.Value]
    ) -> tuple[ir.Value, ir.Value, ir.Value | None]:
        codes = nvfp4_nbits.emit_codes(op, params[""], self._repeat)  # [E, N', K/16, 16]
        lead = [int(d) for d in params[""].shape[:-2]]
        rows = int(params[""].shape[-2]) * self._repeat
        k = int(params[""].shape[-1]) * 2
        flat = op.Reshape(codes, op.Constant(value_ints=[*lead, rows, k]))  # QMoE: [E, N', K]
        scales = nvfp4_nbits.emit_scales(op, params[SCALE], self._repeat)
        scale_2 = op.Reshape(params["_scale_2"], op.Constant(value_ints=[-1, 1, 1]))  # [E, 1, 1]
        scales = op.Mul(scales, nvfp4_nbits.half_scale_2(op, scale_2))
        return typed(flat, ir.DataType.UINT8, None), scales, None

    def layer_byte_cost(self, down: FusedExperts) -> float:
        """The package keeps the checkpoint's bytes (1.0); memory: layer_layout says it."""
        return 1.0

    def layer_layout(self, down: FusedExperts) -> str:
        stored = 0.5 + 1 / nvfp4.GROUP_SIZE  # bytes per weight: codes + E4M3 scales
        session = (1 + 4 / nvfp4.GROUP_SIZE) * 1.5  # fc1 twice: (2 + 1) / 2 per weight
        return (
            "re-laid as 8-bit codes when the session is created (fc1 rows twice, the SwiGLU "
            f"form): {session / stored:.2f}x the stored bytes in memory; in the package"
        )

    def kernel_input(self, op: OpBuilder, x: ir.Value) -> ir.Value:
        return x

    def paired_with(self, down: FusedExperts) -> tuple[FusedExperts, FusedExperts] | str:
        if (down.bits, down.block_size) != (self.bits, self.block_size):
            return "do not both fit one QMoE layout (one bit width and block size)"
        return self, down
