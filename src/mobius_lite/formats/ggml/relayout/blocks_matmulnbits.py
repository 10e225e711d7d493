"""Lossless re-layouts of ggml Q8_0 / Q4_0 weights for onnxruntime's com.microsoft MatMulNBits.

MatMulNBits (CPU) computes Y = A @ dequant(B)^T with dequant = (code - zero_point) * scale per
block along K. Both ggml types are symmetric 32-element blocks with one fp16 scale, so they
map onto it without loss:
  Q8_0 -> bits 8, block_size 32: code = int8 + 128 (uint8), zero point 128.
  Q4_0 -> bits 4, block_size 32: code = the nibble, zero point 8. ggml keeps elements 0..15
          in the low nibbles of qs[0..15] and 16..31 in the high ones; MatMulNBits packs
          element 2i in the low nibble of byte i and 2i + 1 in the high one.
The fp16 scale bits are kept as float16; MatMulNBits wants scales of A's type, so
`emit_matmulnbits` casts them to float32 for float32 activations (exact).
Zero points may be omitted: the schema's default is 2^(bits - 1), which is exactly ggml's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

from mobius_lite.formats.contrib import contrib_op
from mobius_lite.formats.ggml.blocks import as_blocks
from mobius_lite.formats.ggml.relayout.exact_codes import exact_codes
from mobius_lite.formats.ggml.relayout.exact_layout import pack_codes, packed_zero_points
from mobius_lite.formats.ggml.types import GGML_TYPES, BlocksForm

# the types whose blocks are MatMulNBits blocks (their GGMLType rows' `blocks`)
_LAYOUTS: dict[str, BlocksForm] = {
    t.name: t.blocks for t in GGML_TYPES.values() if t.blocks is not None
}
RELAYOUT_TYPES: tuple[str, ...] = tuple(_LAYOUTS)
BLOCK_SIZE = 32  # both types' block; MatMulNBits accepts powers of two >= 16


@dataclass(frozen=True)
class MatMulNBitsBlocks:
    """The re-layout of Q8_0 / Q4_0 blocks into MatMulNBits' B and fp16 scales (this module),
    whose parts (formats/parts.py) are `<slot>_nbits_b` and `<slot>_nbits_scales`."""

    @property
    def tag(self) -> str:
        return "nbits"


NBITS_BLOCKS = MatMulNBitsBlocks()


@dataclass(frozen=True)
class MatMulNBitsWeights:
    """MatMulNBits inputs for one [N, K] weight.

    b: uint8 [N, k_blocks, block_size * bits / 8]; scales: float16 [N, k_blocks] (ggml's
    scale bits); zero_points: packed uint8 [N, ceil(k_blocks * bits / 8)] or None for the
    schema default 2^(bits - 1).
    """

    b: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    bits: int
    block_size: int


def _layout(type_name: str) -> BlocksForm:
    if type_name not in _LAYOUTS:
        raise ValueError(
            f"no lossless MatMulNBits layout for {type_name}; supported: {RELAYOUT_TYPES}"
        )
    return _LAYOUTS[type_name]


def _packed_zero_points(n: int, k_blocks: int, layout: BlocksForm) -> np.ndarray:
    """The constant ggml zero point in MatMulNBits' packed uint8 form."""
    return packed_zero_points((n,), k_blocks, layout.zero_point, layout.bits)


def to_matmulnbits(
    type_name: str, data: np.ndarray, K: int, *, explicit_zero_points: bool = False
) -> MatMulNBitsWeights:
    """Re-lay ggml rows uint8 [N, row_bytes(K)] as MatMulNBits weights, losslessly.

    With explicit_zero_points the (constant) zero points are materialised; otherwise they
    are left to the schema default, which equals ggml's.
    """
    layout = _layout(type_name)
    ggml_type = GGML_TYPES[type_name]
    if data.ndim != 2 or data.shape[1] != ggml_type.row_bytes(K):
        raise ValueError(
            f"{type_name} weight for K={K} must be uint8 [N, {ggml_type.row_bytes(K)}], "
            f"got {data.dtype} {list(data.shape)}"
        )
    blocks = as_blocks(data, ggml_type)  # [N, k_blocks, block_bytes]
    n, k_blocks = blocks.shape[:2]
    scales = np.ascontiguousarray(blocks[..., 0:2]).view(np.dtype("<f2"))[..., 0]
    b = pack_codes(exact_codes(type_name, data).codes, layout.bits)  # int8 v -> v + 128
    zero_points = _packed_zero_points(n, k_blocks, layout) if explicit_zero_points else None
    return MatMulNBitsWeights(
        b=np.ascontiguousarray(b, dtype=np.uint8),
        scales=np.ascontiguousarray(scales, dtype=np.float16),
        zero_points=zero_points,
        bits=layout.bits,
        block_size=BLOCK_SIZE,
    )


def from_matmulnbits(type_name: str, weights: MatMulNBitsWeights, K: int) -> np.ndarray:
    """The exact inverse of `to_matmulnbits`: MatMulNBits weights -> ggml rows [N, row_bytes]."""
    layout = _layout(type_name)
    ggml_type = GGML_TYPES[type_name]
    k_blocks = ggml_type.row_bytes(K) // ggml_type.block_bytes
    if weights.bits != layout.bits or weights.block_size != BLOCK_SIZE:
        raise ValueError(
            f"{type_name} needs bits={layout.bits}, block_size={BLOCK_SIZE}; got "
            f"bits={weights.bits}, block_size={weights.block_size}"
        )
    b, scales = weights.b, weights.scales
    blob = BLOCK_SIZE * layout.bits // 8
    if b.dtype != np.uint8 or b.ndim != 3 or b.shape[1:] != (k_blocks, blob):
        raise ValueError(f"b must be uint8 [N, {k_blocks}, {blob}], got {b.dtype} {b.shape}")
    n = b.shape[0]
    if scales.dtype != np.float16 or scales.shape != (n, k_blocks):
        raise ValueError(
            f"scales must be float16 [{n}, {k_blocks}] (ggml's fp16 bits), "
            f"got {scales.dtype} {scales.shape}"
        )
    zp = weights.zero_points
    if zp is not None and not np.array_equal(zp, _packed_zero_points(n, k_blocks, layout)):
        raise ValueError(f"{type_name} has the constant zero point {layout.zero_point}")
    if layout.bits == 8:
        qs = b ^ np.uint8(0x80)
    else:
        codes = np.stack([b & np.uint8(0xF), b >> np.uint8(4)], axis=-1).reshape(n, k_blocks, 32)
        qs = codes[..., :16] | (codes[..., 16:] << np.uint8(4))
    d = np.ascontiguousarray(scales, dtype=np.dtype("<f2")).view(np.uint8).reshape(n, k_blocks, 2)
    return np.concatenate([d, qs], axis=-1).reshape(n, k_blocks * ggml_type.block_bytes)


def emit_matmulnbits(
    op: OpBuilder,
    x: ir.Value,
    b: ir.Value,
    scales: ir.Value,
    zero_points: ir.Value | None,
    K: int,
    N: int,
    bits: int,
    block_size: int,
    *,
    bias: ir.Value | None = None,
    accuracy_level: int = 0,
) -> ir.Value:
    """Y [..., N] = x [..., K] @ dequant(b)^T as one com.microsoft MatMulNBits node.

    float16 scales are cast to x's float32 (exact); the com.microsoft opset import is added
    to the root graph.
    """
    if x.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        raise TypeError(f"MatMulNBits activations must be FLOAT or FLOAT16, got {x.dtype}")
    if scales.dtype != x.dtype:
        if not (scales.dtype == ir.DataType.FLOAT16 and x.dtype == ir.DataType.FLOAT):
            raise TypeError(
                f"scales {scales.dtype} cannot be widened exactly to activations {x.dtype}"
            )
        scales = op.Cast(scales, to=x.dtype)
    inputs: list[ir.Value | None] = [x, b, scales, zero_points, None, bias]
    while inputs[-1] is None:
        inputs.pop()
    return op.MatMulNBits(
        *inputs,
        K=K,
        N=N,
        bits=bits,
        block_size=block_size,
        accuracy_level=accuracy_level,
        **contrib_op(op),
    )
