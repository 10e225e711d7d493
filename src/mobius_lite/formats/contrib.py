"""onnxruntime's com.microsoft operator domain, in one place: whether a backend asks for it,
declaring it on a model, and typing its operators' outputs (ONNX inference knows no contrib
schema). The packed formats' kernels (formats/ggml, formats/modelopt) and the Mamba mixer's
(components/mamba2.py) emit through it."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.enums import Backend

CONTRIB_DOMAIN = "com.microsoft"
CONTRIB_OPSET = 1


def is_ort(backend: Backend) -> bool:
    """Whether `backend` is onnxruntime's own ops (its com.microsoft kernels)."""
    return backend is Backend.ORT


def contrib_op(op: OpBuilder) -> dict[str, str | int]:
    """Keyword arguments that make an op builder call emit the com.microsoft operator of that
    name; declares the domain on the model (idempotent)."""
    op.builder.root.graph.opset_imports.setdefault(CONTRIB_DOMAIN, CONTRIB_OPSET)
    return {"_domain": CONTRIB_DOMAIN, "_version": CONTRIB_OPSET}


def typed(
    value: ir.Value, dtype: ir.DataType, shape: Sequence[int | str | None] | None = None
) -> ir.Value:
    """Give a contrib op's output its element type and shape where the builder left them
    unknown (later casts read the type)."""
    if value.dtype is None:
        value.dtype = dtype
    if value.shape is None and shape is not None:
        value.shape = ir.Shape(shape)
    return value
