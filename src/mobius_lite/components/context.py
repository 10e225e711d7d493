"""The build context every weighted component takes, and weight slots whose format it decides.

`BuildContext` carries the activation precision, the weight formats (a resolver from a weight
slot's checkpoint name and logical shape to its format; dense in the activation precision
when it has none), the backend a format may emit for and the activation mode of
onnxruntime's fused CPU kernels (enums.Activations). Components declare weight slots
(`WeightedModule.weight_slot`); after the module tree is built, `apply_weight_formats` gives
each slot the format its full name resolves to, so model code never mentions a format.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import onnx_ir as ir
from onnxscript import OpBuilder, nn

from mobius_lite.enums import Activations, Backend, Precision
from mobius_lite.formats.contrib import is_ort
from mobius_lite.formats.weight import DenseWeight, WeightFormat, WeightFormatResolver


@dataclass(frozen=True)
class BuildContext:
    dtype: ir.DataType
    weight_formats: Mapping[str, WeightFormat] | WeightFormatResolver = field(default_factory=dict)
    backend: Backend = Backend.STANDARD
    # Mamba's A as the source stores it: "A_log" (transformers) or "A" (= -exp(A_log), GGUF).
    mamba_a: str = "A_log"
    activations: Activations = Activations.EXACT
    # > 0: Mamba mixers also return per-position states of calls of up to this many
    # positions (components/state_window.py; the speculative verifying call)
    speculation_window: int = 0
    # the windows from onnxruntime's state_window attribute (CUDA only) instead of the scan
    window_kernel: bool = False
    # build-time lines already said (each route notice once per build)
    notices: set[str] = field(default_factory=set, compare=False)

    @property
    def row_window(self) -> int:
        """Experts computed so that a row does not depend on the call's other rows (fused
        kernels: moe_fused.pairs_apart, in any call; other paths: components/row_by_row.py, in
        calls of up to this many positions, any batch); 0: never. Under int8 activations a
        verifying call must compute each position exactly as a one-position step does, or
        near-tied tokens differ from plain decoding's; elsewhere the expert sums' rounding
        stays within the FP32 gates, and the verifying call keeps its one kernel call."""
        return self.speculation_window if self.activations is Activations.INT8 else 0

    def notice(self, line: str) -> None:
        """Say `line` once per build (a weight kept on the exact route, a byte cost)."""
        if line not in self.notices:
            self.notices.add(line)
            logging.getLogger("mobius_lite.routes").warning(line)

    @classmethod
    def dense(cls, precision: Precision | str = Precision.F32) -> BuildContext:
        """Every weight dense in `precision`, standard ops (graphs built without a source)."""
        return cls(Precision.parse(precision).ir_dtype)

    def weight_format(self, name: str, shape: tuple[int, ...]) -> WeightFormat | None:
        """The format of weight slot `name`, or None when it stays dense."""
        if callable(self.weight_formats):
            return self.weight_formats(name, shape)
        return self.weight_formats.get(name)


class WeightedModule(nn.Module):
    """A module with weight slots: each slot's parameters come from its WeightFormat."""

    def __init__(self, ctx: BuildContext) -> None:
        super().__init__()
        self.ctx = ctx
        # attr -> (logical shape, format, parameter name suffixes)
        self._slots: dict[str, tuple[tuple[int, ...], WeightFormat, tuple[str, ...]]] = {}

    def weight_slot(self, attr: str, shape: tuple[int, ...]) -> None:
        """Declare weight `attr` of logical shape [..., out, in], dense until told otherwise."""
        self._install(attr, shape, DenseWeight(self.ctx.dtype))

    def set_weight_format(self, attr: str, fmt: WeightFormat) -> None:
        shape, _, suffixes = self._slots[attr]
        for suffix in suffixes:
            self._parameters.pop(attr + suffix, None)
        self._install(attr, shape, fmt)

    def _install(self, attr: str, shape: tuple[int, ...], fmt: WeightFormat) -> None:
        parameters = fmt.parameters(shape)
        for suffix, parameter in parameters.items():
            setattr(self, attr + suffix, parameter)
        self._slots[attr] = (shape, fmt, tuple(parameters))

    def kernel_format(self, attr: str, fmt: WeightFormat) -> WeightFormat:
        """The format slot `attr` computes with under the context's activation mode (the
        resolved `fmt` unless the module moves it onto a fused kernel)."""
        return fmt

    def formats_applied(self) -> None:
        """Called once every slot has its format (a module may reconcile its slots)."""

    def weight_format_of(self, attr: str) -> WeightFormat:
        return self._slots[attr][1]

    def slot_values(self, attr: str) -> dict[str, ir.Value]:
        """The slot's parameters by suffix, as graph values."""
        return {suffix: getattr(self, attr + suffix) for suffix in self._slots[attr][2]}

    def matmul(
        self, op: OpBuilder, attr: str, x: ir.Value, bias: ir.Value | None = None
    ) -> ir.Value:
        return self.weight_format_of(attr).matmul(op, x, self.slot_values(attr), bias)

    def select(self, op: OpBuilder, attr: str, indices: ir.Value) -> ir.Value:
        return self.weight_format_of(attr).select(op, self.slot_values(attr), indices)


def fused_kernels(ctx: BuildContext) -> bool:
    """Whether the context moves packed matmuls and experts onto the fused kernels."""
    return ctx.activations is not Activations.EXACT and is_ort(ctx.backend)


def matmul_kernel_format(ctx: BuildContext, fmt: WeightFormat) -> WeightFormat:
    """A linear layer's format under the activation mode: MatMulNBits over the exact code
    layout (accuracy 0, or 4 for int8) where the format has one; else `fmt`, said once."""
    if not fused_kernels(ctx) or isinstance(fmt, DenseWeight):
        return fmt
    moved = fmt.on_exact_layout(ctx.activations.accuracy_level)
    if isinstance(moved, str):
        ctx.notice(f"--activations {ctx.activations.value}: {moved}; kept on the exact route")
        return fmt
    return moved


def apply_weight_formats(root: nn.Module, ctx: BuildContext) -> None:
    """Give every weight slot under `root` the format its checkpoint name resolves to."""
    if not ctx.weight_formats:
        return
    for prefix, module in root.named_modules():
        if isinstance(module, WeightedModule):
            for attr, (shape, _, _) in list(module._slots.items()):
                name = f"{prefix}.{attr}" if prefix else attr
                fmt = ctx.weight_format(name, shape)
                if fmt is not None:
                    module.set_weight_format(attr, module.kernel_format(attr, fmt))
            module.formats_applied()
