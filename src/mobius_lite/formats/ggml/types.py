"""The ggml tensor types: id, elements per block and bytes per block.

The figures are ggml's (ggml.h / gguf-py's GGML_QUANT_SIZES). A quantized GGUF tensor is
stored row by row: a row of `n` elements (the fastest axis, ne[0]) is `n / block_elements`
consecutive blocks of `block_bytes` bytes, so its bytes view as uint8 [..., row_bytes(n)].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type."""

    name: str  # ggml's spelling: "Q8_0", "IQ2_XXS", "F32"
    type_id: int  # ggml_type enum value (also onnxruntime's packed_type attribute)
    block_elements: int
    block_bytes: int

    @property
    def quantized(self) -> bool:
        return self.block_elements > 1

    def row_bytes(self, elements: int) -> int:
        """Bytes of one row of `elements` values; the row must hold whole blocks."""
        if elements % self.block_elements:
            raise ValueError(
                f"a {self.name} row holds whole blocks of {self.block_elements} elements; "
                f"{elements} is not a multiple"
            )
        return elements // self.block_elements * self.block_bytes


GGML_TYPES: dict[str, GGMLType] = {
    t.name: t
    for t in (
        GGMLType("F32", 0, 1, 4),
        GGMLType("F16", 1, 1, 2),
        GGMLType("Q4_0", 2, 32, 18),
        GGMLType("Q4_1", 3, 32, 20),
        GGMLType("Q5_0", 6, 32, 22),
        GGMLType("Q5_1", 7, 32, 24),
        GGMLType("Q8_0", 8, 32, 34),
        GGMLType("Q2_K", 10, 256, 84),
        GGMLType("Q3_K", 11, 256, 110),
        GGMLType("Q4_K", 12, 256, 144),
        GGMLType("Q5_K", 13, 256, 176),
        GGMLType("Q6_K", 14, 256, 210),
        GGMLType("IQ2_XXS", 16, 256, 66),
        GGMLType("IQ2_XS", 17, 256, 74),
        GGMLType("IQ3_XXS", 18, 256, 98),
        GGMLType("IQ1_S", 19, 256, 50),
        GGMLType("IQ4_NL", 20, 32, 18),
        GGMLType("IQ3_S", 21, 256, 110),
        GGMLType("IQ2_S", 22, 256, 82),
        GGMLType("IQ4_XS", 23, 256, 136),
        GGMLType("IQ1_M", 29, 256, 56),
        GGMLType("BF16", 30, 1, 2),
        GGMLType("TQ1_0", 34, 256, 54),
        GGMLType("TQ2_0", 35, 256, 66),
        GGMLType("MXFP4", 39, 32, 17),
        GGMLType("NVFP4", 40, 64, 36),
        GGMLType("Q1_0", 41, 128, 18),
    )
}
GGML_TYPES_BY_ID: dict[int, GGMLType] = {t.type_id: t for t in GGML_TYPES.values()}


@dataclass(frozen=True)
class BlockCodec:
    """A quantized type's numpy reference decode and its standard-ONNX graph decode.

    dequantize: uint8 [..., row_bytes] -> float32 [..., row_elements], written from the
        format's definition (the oracle the graph is tested against; gguf-py is its oracle).
    emit: (op, uint8 value [..., row_bytes], row_elements) -> FLOAT value [..., row_elements]
        with standard opset-27 ops only, bit-exact with `dequantize`.
    """

    type: GGMLType
    dequantize: Callable[[np.ndarray], np.ndarray]
    emit: Callable[[OpBuilder, ir.Value, int], ir.Value]
