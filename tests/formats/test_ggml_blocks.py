"""The shared ggml block helpers: numpy and graph forms agree, and match numpy's own views."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnxscript import OpBuilder

from mobius_lite.formats.ggml import blocks
from mobius_lite.formats.ggml.types import GGML_TYPES

from .emit_harness import run_emitter
from .ggml_data import random_rows


@pytest.mark.parametrize(("width", "count", "axis"), [(1, 8, -1), (2, 4, -2), (4, 2, -3)])
def test_bit_fields_numpy_and_graph(width: int, count: int, axis: int) -> None:
    q = np.arange(256, dtype=np.uint8).reshape(4, 8, 8)
    fields = blocks.bit_fields(q, width, count, axis)
    # definition, independently: field k of byte v is (v // 2**(k*width)) % 2**width
    moved = np.moveaxis(fields, axis, -1)
    k = np.arange(count)
    expected = (q[..., None].astype(np.int64) // (1 << (k * width))) % (1 << width)
    np.testing.assert_array_equal(moved, expected)
    (got,) = run_emitter(lambda op, v: blocks.emit_bit_fields(op, v, width, count, axis), [q])
    np.testing.assert_array_equal(got, fields)


@pytest.mark.parametrize(("width", "np_dtype"), [(2, np.uint16), (4, np.uint32)])
def test_le_uint_numpy_and_graph(width: int, np_dtype: type) -> None:
    fields = np.random.default_rng(0).integers(0, 256, size=(3, 5, width), dtype=np.uint8)
    expected = np.ascontiguousarray(fields).view(np.dtype(np_dtype).newbyteorder("<"))
    np.testing.assert_array_equal(blocks.le_uint(fields, np_dtype), expected)
    dtype = {np.uint16: ir.DataType.UINT16, np.uint32: ir.DataType.UINT32}[np_dtype]
    (got,) = run_emitter(lambda op, v: blocks.emit_le_uint(op, v, width, dtype), [fields])
    np.testing.assert_array_equal(got, expected)


def test_f16_at_is_exact_for_every_non_nan_pattern() -> None:
    patterns = np.arange(1 << 16, dtype="<u2")
    patterns = patterns[~np.isnan(patterns.view(np.float16))]
    data = np.concatenate(
        [np.full((patterns.size, 1), 7, np.uint8), patterns.view(np.uint8).reshape(-1, 2)], axis=1
    )
    expected = patterns.view(np.float16).astype(np.float32)[:, None]
    np.testing.assert_array_equal(blocks.f16_at(data, 1).view(np.uint32), expected.view(np.uint32))
    (got,) = run_emitter(lambda op, v: blocks.emit_f16_at(op, v, 1), [data])
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_table_lookup_gathers_rows() -> None:
    table = np.arange(4 * 8, dtype=np.int8).reshape(4, 8) - 16
    codes = np.array([[3, 0, 1], [2, 2, 3]], dtype=np.uint8)
    (got,) = run_emitter(lambda op, v: blocks.emit_table_lookup(op, table, v), [codes])
    np.testing.assert_array_equal(got, table[codes])


def test_emit_decodes_gathered_rows_of_stacked_experts() -> None:
    """Rows picked at run time (shape unknown to the builder) decode like the same rows in numpy."""
    data = random_rows(np.random.default_rng(5), "Q5_K", (3, 2), 1)  # [E, N, row_bytes]
    picked = np.array([2, 0], dtype=np.int64)

    def emit(op: OpBuilder, v: ir.Value, idx: ir.Value) -> ir.Value:
        return GGML_TYPES["Q5_K"].codec.emit(op, op.Gather(v, idx, axis=0), 256)

    (got,) = run_emitter(emit, [data, picked])
    expected = GGML_TYPES["Q5_K"].codec.dequantize(data[picked])
    assert got.shape == (2, 2, 256)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
