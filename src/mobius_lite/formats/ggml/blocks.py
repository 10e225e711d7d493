"""Shared pieces of ggml block decoding, in numpy and as standard-ONNX graph fragments.

A codec module writes each type's decode one block at a time (`BlockDecode`). Both of its
sides see every block of the input flattened to uint8 [B, block_bytes] (B = all blocks of all
rows): the numpy side as an array, the graph side as a value, so each fragment has a known
rank. A type's row (types.py) wraps its `BlockDecode` into the `BlockCodec` that takes and
returns whole rows, reading the block geometry from that row.

Every helper here is exact: byte fields, bit fields, little-endian integers and fp16 / int8
reinterpretation never round. Decoders stay bit-exact with ggml as long as they then apply
the format's float32 arithmetic in ggml's order (the order fixes the sign of zero results).

Graph integers are uint8 (block bytes and the codes cut from them) or INT64 (codes that take
part in index arithmetic or become Gather indices). ONNX's BitShift takes unsigned types only,
so on INT64 the shift helpers multiply or divide by powers of two, which is exact for the
non-negative values they see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx_ir as ir
from onnxscript import OpBuilder

if TYPE_CHECKING:  # the rows are made of codecs, so the type table imports this module
    from mobius_lite.formats.ggml.types import GGMLType

FLOAT = ir.DataType.FLOAT
UINT8 = ir.DataType.UINT8
INT64 = ir.DataType.INT64

BlockDecoder = Callable[[OpBuilder, ir.Value], ir.Value]
"""(op, uint8 [B, block_bytes]) -> FLOAT [B, ...] holding block_elements values per block."""

NumpyBlockDecoder = Callable[[np.ndarray], np.ndarray]
"""uint8 [B, block_bytes] -> float32 [B, ...] holding block_elements values per block."""


# ----------------------------------------------------------------------------------------
# numpy
# ----------------------------------------------------------------------------------------


def n_blocks_of(ggml_type: GGMLType, row_bytes: int) -> int:
    """Blocks in a row of `row_bytes` bytes; a row holds whole blocks."""
    if row_bytes % ggml_type.block_bytes:
        raise ValueError(
            f"a {ggml_type.name} row holds whole blocks of {ggml_type.block_bytes} bytes; "
            f"{row_bytes} bytes is not a multiple"
        )
    return row_bytes // ggml_type.block_bytes


def as_blocks(data: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    """View uint8 [..., row_bytes] as uint8 [..., n_blocks, block_bytes] (no copy if possible)."""
    if data.dtype != np.uint8:
        raise TypeError(f"{ggml_type.name} data must be uint8 bytes, got {data.dtype}")
    if data.ndim < 1:
        raise ValueError(f"{ggml_type.name} data needs a row axis, got a scalar")
    n_blocks = n_blocks_of(ggml_type, data.shape[-1])
    return data.reshape(*data.shape[:-1], n_blocks, ggml_type.block_bytes)


def le_uint(fields: np.ndarray, dtype: type[np.integer], keepdims: bool = True) -> np.ndarray:
    """Little-endian unsigned integers from uint8 [..., k] bytes -> dtype [..., 1] (or [...])."""
    out = np.zeros(fields.shape[:-1] + (1,), dtype=dtype)
    for i in range(fields.shape[-1]):
        out |= fields[..., i : i + 1].astype(dtype) << dtype(8 * i)
    return out if keepdims else out[..., 0]


def f16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    """Integer fp16 bit patterns (any integer dtype, values < 2**16) -> float32 (exact)."""
    return bits.astype(np.uint16).view(np.float16).astype(np.float32)


def f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """The little-endian fp16 at byte `offset` of each block as float32 [..., 1] (exact)."""
    return f16_bits_to_float(le_uint(blocks[..., offset : offset + 2], np.uint16))


def as_int8(fields: np.ndarray) -> np.ndarray:
    """Reinterpret uint8 bytes as int8 (two's complement), e.g. Q8_0 codes, Q6_K scales."""
    return np.ascontiguousarray(fields).view(np.int8)


def merge_last(a: np.ndarray, count: int) -> np.ndarray:
    """Merge the last `count` axes of `a` into one (row-major), e.g. after `bit_fields`."""
    return a.reshape(*a.shape[: a.ndim - count], -1)


def bit_fields(q: np.ndarray, width: int, count: int, axis: int = -1) -> np.ndarray:
    """Split each integer of `q` into `count` fields of `width` bits, low bits first.

    The fields go on a new axis inserted at `axis` (negative, counted in the result), in q's
    dtype: result[..., k, ...] = (q >> (k * width)) & (2**width - 1).
    """
    if axis >= 0:
        raise ValueError("axis counts from the end of the result (negative)")
    shifts = (np.arange(count, dtype=q.dtype) * width).reshape((count,) + (1,) * (-axis - 1))
    return (np.expand_dims(q, axis) >> shifts) & q.dtype.type((1 << width) - 1)


def nibble_pairs(blocks: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Packed 4-bit fields in bytes [start, stop) of each block -> uint8 [..., 2 (stop - start)]:
    each byte's low nibble, then its high nibble (ggml's packed sub-block scales)."""
    return merge_last(bit_fields(blocks[..., start:stop], 4, 2), 2)


def nibble_lookup(table: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """table[code] for the 4-bit codes of bytes qs [..., n] -> [..., 2 n]: the low nibbles of
    the n bytes, then their high nibbles (ggml's 4-bit element order: IQ4, MXFP4, NVFP4)."""
    return table[merge_last(bit_fields(qs, 4, 2, axis=-2), 2)]


def sign_bits(sign_bytes: np.ndarray) -> np.ndarray:
    """Sign bytes [...] -> float32 [..., 8]: -1 where bit j is set, +1 elsewhere (kmask_iq2xs)."""
    return np.where(bit_fields(sign_bytes, 1, 8) != 0, np.float32(-1.0), np.float32(1.0))


def codebook_values(
    scale: np.ndarray, grid: np.ndarray, index: np.ndarray, signs: np.ndarray
) -> np.ndarray:
    """scale * grid[index] * signs in float32, in ggml's order: the last step of a signed
    codebook decode (IQ2, IQ3); the caller shapes the three to broadcast."""
    return scale * grid[index].astype(np.float32) * signs


# ----------------------------------------------------------------------------------------
# graph: constants, shapes, byte fields
# ----------------------------------------------------------------------------------------


def const(op: OpBuilder, array: np.ndarray | Sequence[int] | int, dtype: type) -> ir.Value:
    """A constant tensor of an explicit numpy dtype (no reliance on constant promotion)."""
    return op.Constant(value=ir.tensor(np.asarray(array, dtype=dtype)))


def emit_reshape(op: OpBuilder, value: ir.Value, dims: Sequence[int]) -> ir.Value:
    """Reshape to constant dims (use -1 for the block axis B)."""
    return op.Reshape(value, op.Constant(value_ints=list(dims)))


def emit_bytes(op: OpBuilder, blocks: ir.Value, start: int, stop: int) -> ir.Value:
    """Entries [start, stop) of the last axis, e.g. one byte field of every block:
    [B, stop - start]."""
    return op.Slice(
        blocks,
        op.Constant(value_ints=[start]),
        op.Constant(value_ints=[stop]),
        op.Constant(value_ints=[-1]),
    )


def emit_int64_bytes(
    op: OpBuilder, blocks: ir.Value, start: int, stop: int, dims: Sequence[int]
) -> ir.Value:
    """Bytes [start, stop) of every block reshaped to `dims` (first -1) and widened to INT64,
    ready for index arithmetic and Gather."""
    return op.Cast(emit_reshape(op, emit_bytes(op, blocks, start, stop), dims), to=INT64)


# ----------------------------------------------------------------------------------------
# graph: integers
# ----------------------------------------------------------------------------------------


def _int_dtype(value: ir.Value) -> ir.DataType:
    # an untyped value is taken as uint8 bytes; inside a codec every value is typed, since
    # emit_as_blocks types the blocks
    return value.dtype if value.dtype is not None else UINT8


def emit_shift(
    op: OpBuilder, value: ir.Value, shifts: Sequence[int] | np.ndarray | int, direction: str
) -> ir.Value:
    """value << shifts or value >> shifts (direction "LEFT" / "RIGHT"), broadcast over the
    shape of `shifts`: BitShift on unsigned values, * or / 2**shifts on non-negative INT64."""
    if direction not in ("LEFT", "RIGHT"):
        raise ValueError(f'direction is "LEFT" or "RIGHT", got {direction!r}')
    dtype = _int_dtype(value)
    shifts = np.atleast_1d(np.asarray(shifts, dtype=np.int64))
    if dtype == INT64:
        factors = const(op, np.left_shift(1, shifts), np.int64)
        return op.Mul(value, factors) if direction == "LEFT" else op.Div(value, factors)
    return op.BitShift(value, const(op, shifts, dtype.numpy()), direction=direction)


def emit_mask(op: OpBuilder, value: ir.Value, width: int) -> ir.Value:
    """value & (2**width - 1): the low `width` bits, in value's integer type."""
    return op.BitwiseAnd(value, const(op, [(1 << width) - 1], _int_dtype(value).numpy()))


def emit_le_uint(
    op: OpBuilder, fields: ir.Value, width: int, dtype: ir.DataType, keepdims: bool = True
) -> ir.Value:
    """Little-endian unsigned integers from bytes [..., width] (uint8 or INT64) -> dtype
    [..., 1] (or [...]); summed in INT64, so `width` is at most 7."""
    if not 1 <= width <= 7:
        raise ValueError(f"a little-endian integer of {width} bytes does not fit INT64")
    wide = fields if fields.dtype == INT64 else op.Cast(fields, to=INT64)
    weights = const(op, [1 << (8 * i) for i in range(width)], np.int64)
    total = op.ReduceSum(
        op.Mul(wide, weights), op.Constant(value_ints=[-1]), keepdims=int(keepdims)
    )
    return total if dtype == INT64 else op.Cast(total, to=dtype)


def emit_int8(op: OpBuilder, fields: ir.Value) -> ir.Value:
    """Reinterpret uint8 bytes as INT8 (two's complement)."""
    return op.BitCast(fields, to=ir.DataType.INT8)


def emit_bit_fields(
    op: OpBuilder, q: ir.Value, width: int, count: int, axis: int = -1, *, new_axis: bool = True
) -> ir.Value:
    """Graph form of `bit_fields` for uint8 or INT64 `q`: fields of `width` bits on a new axis
    at `axis`; with new_axis=False `q` already holds a size-1 axis there (no Unsqueeze)."""
    if axis >= 0:
        raise ValueError("axis counts from the end of the result (negative)")
    shifts = (np.arange(count) * width).reshape((count,) + (1,) * (-axis - 1))
    expanded = op.Unsqueeze(q, op.Constant(value_ints=[axis])) if new_axis else q
    return emit_mask(op, emit_shift(op, expanded, shifts, "RIGHT"), width)


def emit_nibble_pairs(op: OpBuilder, blocks: ir.Value, start: int, stop: int) -> ir.Value:
    """Graph form of `nibble_pairs`: bytes [start, stop) of every block -> INT64
    [B, 2 (stop - start)], each byte's low nibble, then its high nibble."""
    n = stop - start
    packed = emit_int64_bytes(op, blocks, start, stop, [-1, n, 1])
    return emit_reshape(op, emit_bit_fields(op, packed, 4, 2, new_axis=False), [-1, 2 * n])


def emit_or_high(op: OpBuilder, low: ir.Value, high: ir.Value, shift: int) -> ir.Value:
    """low | (high << shift): joins a code's low bits with its separately stored high bits."""
    return op.BitwiseOr(low, emit_shift(op, high, shift, "LEFT"))


# ----------------------------------------------------------------------------------------
# graph: floats and tables
# ----------------------------------------------------------------------------------------


def emit_float(op: OpBuilder, value: ir.Value) -> ir.Value:
    """Integer codes -> FLOAT (exact for every 8- and 16-bit integer)."""
    return op.Cast(value, to=FLOAT)


def emit_f16_bits_to_float(op: OpBuilder, bits: ir.Value) -> ir.Value:
    """uint16 fp16 bit patterns -> FLOAT values (BitCast, then the exact f16 -> f32 Cast)."""
    return op.Cast(op.BitCast(bits, to=ir.DataType.FLOAT16), to=FLOAT)


def emit_f16_at(
    op: OpBuilder, blocks: ir.Value, offset: int, dims: Sequence[int] | None = None
) -> ir.Value:
    """The little-endian fp16 at byte `offset` of every block as FLOAT [B, 1] (exact),
    or reshaped to `dims` (e.g. [-1, 1, 1, 1] to broadcast over a block's sub-axes)."""
    bits = emit_le_uint(op, emit_bytes(op, blocks, offset, offset + 2), 2, ir.DataType.UINT16)
    value = emit_f16_bits_to_float(op, bits)
    return value if dims is None else emit_reshape(op, value, dims)


def emit_table_lookup(op: OpBuilder, table: np.ndarray, codes: ir.Value) -> ir.Value:
    """table[codes] for integer codes of any shape: Gather from a constant table (axis 0),
    e.g. a codebook grid; the result has shape codes.shape + table.shape[1:]."""
    indices = codes if codes.dtype == INT64 else op.Cast(codes, to=INT64)
    return op.Gather(op.Constant(value=ir.tensor(np.ascontiguousarray(table))), indices, axis=0)


def emit_scaled_lookup(
    op: OpBuilder, scale: ir.Value, table: np.ndarray, codes: ir.Value
) -> ir.Value:
    """scale * table[codes]: a block's float scale times a per-sub-block factor from a float32
    table, shaped by the caller so that the product broadcasts over the sub-block's values."""
    return op.Mul(scale, emit_table_lookup(op, table, codes))


def emit_nibble_lookup(
    op: OpBuilder, table: np.ndarray, blocks: ir.Value, start: int, stop: int, dims: Sequence[int]
) -> ir.Value:
    """Graph form of `nibble_lookup`: bytes [start, stop) of every block viewed as `dims`
    [..., 1, n] -> table values [..., 2, n] (low nibbles of the n bytes, then high ones)."""
    qs = emit_int64_bytes(op, blocks, start, stop, dims)
    return emit_table_lookup(op, table, emit_bit_fields(op, qs, 4, 2, -2, new_axis=False))


def emit_codebook_values(
    op: OpBuilder, scale: ir.Value, grid: np.ndarray, index: ir.Value, signs: ir.Value
) -> ir.Value:
    """Graph form of `codebook_values`: scale * grid[index] * signs, grid as a float32 table."""
    values = emit_table_lookup(op, grid.astype(np.float32), index)
    return op.Mul(op.Mul(scale, values), signs)


# ----------------------------------------------------------------------------------------
# rows <-> blocks, codecs
# ----------------------------------------------------------------------------------------


def emit_as_blocks(op: OpBuilder, data: ir.Value, ggml_type: GGMLType) -> ir.Value:
    """uint8 [..., row_bytes] -> uint8 [B, block_bytes], every block of every row."""
    blocks = emit_reshape(op, data, [-1, ggml_type.block_bytes])
    if blocks.dtype is None:
        # untyped data (check_row admits it) is uint8 by contract; saying so lets type
        # inference reach the fragments below, whose integer helpers read their operand types
        blocks.dtype = UINT8
    return blocks


def emit_as_rows(op: OpBuilder, data: ir.Value, decoded: ir.Value, row_elements: int) -> ir.Value:
    """Decoded values (row-major, block by block) -> FLOAT [..., row_elements], with the
    leading dims of `data` read at run time (any rank, dynamic sizes)."""
    lead = op.Shape(data, start=0, end=-1)
    target = op.Concat(lead, op.Constant(value_ints=[row_elements]), axis=0)
    return op.Reshape(decoded, target)


def check_row(ggml_type: GGMLType, data: ir.Value, row_elements: int) -> None:
    """Fail at build time when `row_elements` or a statically known row width do not fit."""
    row_bytes = ggml_type.row_bytes(row_elements)
    if data.dtype is not None and data.dtype != UINT8:
        raise TypeError(f"{ggml_type.name} data must be uint8, got {data.dtype}")
    shape = data.shape
    known = shape is not None and len(shape) >= 1 and isinstance(shape[-1], int)
    if known and shape[-1] != row_bytes:
        raise ValueError(
            f"a {ggml_type.name} row of {row_elements} elements is {row_bytes} bytes; "
            f"the value's last axis is {shape[-1]}"
        )


@dataclass(frozen=True)
class BlockDecode:
    """One ggml type's decode of single blocks, as its codec module writes it; the block
    geometry it decodes is its row's (types.py).

    numpy: uint8 [B, block_bytes] -> float32 [B, ...], written from the format's definition
        (the oracle the graph is tested against; gguf-py is its oracle).
    graph: (op, uint8 [B, block_bytes]) -> FLOAT [B, ...] with standard opset-27 ops only,
        bit-exact with `numpy`.
    """

    numpy: NumpyBlockDecoder
    graph: BlockDecoder


@dataclass(frozen=True)
class BlockCodec:
    """A ggml type's codec on whole rows: its `BlockDecode` over the blocks of its row's
    geometry. The row makes it (GGMLType.codec), so `codec.type` is that row."""

    type: GGMLType
    decode: BlockDecode

    def dequantize(self, data: np.ndarray) -> np.ndarray:
        """uint8 [..., row_bytes] -> float32 [..., row_elements], the numpy reference."""
        ggml_type = self.type
        blocks = as_blocks(np.asarray(data), ggml_type)
        values = self.decode.numpy(blocks.reshape(-1, ggml_type.block_bytes))
        if values.dtype != np.float32:  # a decoder bug (a float64 promotion), not bad data
            raise TypeError(f"{ggml_type.name} decode returned {values.dtype}, not float32")
        return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * ggml_type.block_elements)

    def emit(self, op: OpBuilder, data: ir.Value, row_elements: int) -> ir.Value:
        """uint8 value [..., row_bytes] -> FLOAT value [..., row_elements] with standard ops,
        bit-exact with `dequantize`."""
        check_row(self.type, data, row_elements)
        decoded = self.decode.graph(op, emit_as_blocks(op, data, self.type))
        return emit_as_rows(op, data, decoded, row_elements)
