"""The ggml tensor types, one row each: id, block geometry and the routes the type has.

The figures are ggml's (ggml.h / gguf-py's GGML_QUANT_SIZES). A quantized GGUF tensor is
stored row by row: a row of `n` elements (the fastest axis, ne[0]) is `n / block_elements`
consecutive blocks of `block_bytes` bytes, so its bytes view as uint8 [..., row_bytes(n)].

Every type with a codec (codecs.py) has the standard route: decode with standard ops. The rest
of a row says which of onnxruntime's routes fit it (weight.py chooses among them):
- ort select: `gather_packed`, onnxruntime 1.32's CPU GatherPacked accepts it (probed:
  tests/test_gguf_export.py checks each against the numpy decode, and that the others are
  refused), and MatMulPacked (CUDA, bf16 graphs) takes the same contract;
- ort matmul: `blocks`, the lossless MatMulNBits re-layout of its blocks (relayout/
  blocks_matmulnbits.py: Q8_0 / Q4_0);
- exact re-layout: `exact`, its blocks as integer codes with one scale (and one min) per
  block (relayout/exact_codes.py), for MatMulNBits (`--activations`) and for QMoE experts
  (relayout/qmoe_experts.py: 4-bit forms with f32 activations, 8-bit ones with int8; a form
  with mins takes the min-term layout of relayout/qmoe_min_term.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder


@dataclass(frozen=True)
class CodeForm:
    """A type's exact code form (relayout/exact_codes.py's table), before any data is read:
    value = (code - zero_point) * scale [- min] per block of `block_size` along K."""

    bits: int
    block_size: int
    zero_point: int
    has_mins: bool = False


@dataclass(frozen=True)
class BlocksForm:
    """A type whose blocks are MatMulNBits blocks as they are (one fp16 scale, a constant
    zero point): `bits` per code and MatMulNBits' default zero point 2^(bits - 1)."""

    bits: int
    zero_point: int


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: its geometry and its routes (module doc)."""

    name: str  # ggml's spelling: "Q8_0", "IQ2_XXS", "F32"
    type_id: int  # ggml_type enum value (also onnxruntime's packed_type attribute)
    block_elements: int
    block_bytes: int
    gather_packed: bool = False  # ort select: CPU GatherPacked (and MatMulPacked for bf16)
    blocks: BlocksForm | None = None  # ort matmul: MatMulNBits over its blocks re-laid
    exact: CodeForm | None = None  # exact re-layout: MatMulNBits (`--activations`) and QMoE

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


_SELECT = {"gather_packed": True}
GGML_TYPES: dict[str, GGMLType] = {
    t.name: t
    for t in (
        GGMLType("F32", 0, 1, 4),
        GGMLType("F16", 1, 1, 2),
        GGMLType("Q4_0", 2, 32, 18, True, BlocksForm(4, 8), CodeForm(4, 32, 8)),
        GGMLType("Q4_1", 3, 32, 20),
        GGMLType("Q5_0", 6, 32, 22, **_SELECT),
        GGMLType("Q5_1", 7, 32, 24),
        GGMLType("Q8_0", 8, 32, 34, True, BlocksForm(8, 128), CodeForm(8, 32, 128)),
        GGMLType("Q2_K", 10, 256, 84),
        GGMLType("Q3_K", 11, 256, 110),
        GGMLType("Q4_K", 12, 256, 144, exact=CodeForm(4, 32, 0, has_mins=True)),
        GGMLType("Q5_K", 13, 256, 176, **_SELECT),
        GGMLType("Q6_K", 14, 256, 210, True, exact=CodeForm(8, 16, 128)),
        GGMLType("IQ2_XXS", 16, 256, 66, True, exact=CodeForm(8, 32, 128)),
        GGMLType("IQ2_XS", 17, 256, 74, **_SELECT),
        GGMLType("IQ3_XXS", 18, 256, 98, **_SELECT),
        GGMLType("IQ1_S", 19, 256, 50),
        GGMLType("IQ4_NL", 20, 32, 18, **_SELECT),
        GGMLType("IQ3_S", 21, 256, 110),
        GGMLType("IQ2_S", 22, 256, 82, **_SELECT),
        GGMLType("IQ4_XS", 23, 256, 136, **_SELECT),
        GGMLType("IQ1_M", 29, 256, 56),
        GGMLType("BF16", 30, 1, 2),
        GGMLType("TQ1_0", 34, 256, 54),
        GGMLType("TQ2_0", 35, 256, 66),
        GGMLType("MXFP4", 39, 32, 17, exact=CodeForm(8, 32, 128)),
        GGMLType("NVFP4", 40, 64, 36, exact=CodeForm(8, 16, 128)),
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
