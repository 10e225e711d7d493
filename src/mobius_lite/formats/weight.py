"""How a layer computes with a weight stored in some format: the WeightFormat protocol and its
first member, dense float weights.

A layer (Linear, Embedding, the experts) never branches on formats: it declares a weight slot
and asks the slot's format to create the parameters and to emit the math. Packed formats
(GGUF blocks, NVFP4, FP8) implement the same three methods with their own parameters and
decode.
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


def gemm_transposed(
    op: OpBuilder, x: ir.Value, weight: ir.Value, bias: ir.Value | None = None
) -> ir.Value:
    """x @ weight^T (+ bias): Gemm(transB=1) reads the weight in its stored [out, in] layout."""
    if bias is not None:
        return op.Gemm(x, weight, bias, transB=1)
    return op.Gemm(x, weight, transB=1)
