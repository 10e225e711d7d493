"""ggml legacy (Q4_0..Q8_0), K-quant (Q2_K..Q6_K) and dense (F32/F16/BF16) codecs.

Oracles: gguf-py's `gguf.quants.dequantize` for the numpy decode (bit for bit), and that
numpy decode for the ONNX graph decode run in onnxruntime CPU (bit for bit).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from onnxscript import OpBuilder

from mobius_lite.formats.ggml import dense, kquants, legacy
from mobius_lite.formats.ggml.blocks import BlockCodec
from mobius_lite.formats.ggml.types import GGML_TYPES

from .emit_harness import run_emitter
from .ggml_data import F16_FIELDS, code_bytes_cover_all_values, random_rows

QUANT_DECODES = legacy.DECODES + kquants.DECODES
QUANT_CODECS: dict[str, BlockCodec] = {
    t.name: t.codec for t in GGML_TYPES.values() if t.codec.decode in QUANT_DECODES
}
DENSE_CODECS: dict[str, BlockCodec] = {
    t.name: t.codec for t in GGML_TYPES.values() if t.codec.decode in dense.DECODES
}

# (lead dims, blocks per row): a weight [N, row_bytes], stacked experts [E, N, row_bytes],
# a single row.
SHAPES = [((4,), 4), ((2, 3), 2), ((), 3)]


def bits32(a: np.ndarray) -> np.ndarray:
    assert a.dtype == np.float32
    return a.view(np.uint32)


def rows_for(type_name: str, lead: tuple[int, ...], n_blocks: int, seed: int) -> np.ndarray:
    return random_rows(np.random.default_rng(seed), type_name, lead, n_blocks)


def emit_rows(codec: BlockCodec, data: np.ndarray, *, as_initializers: bool) -> np.ndarray:
    n = data.shape[-1] // codec.type.block_bytes * codec.type.block_elements
    (out,) = run_emitter(
        lambda op, v: codec.emit(op, v, n), [data], as_initializers=as_initializers
    )
    return out


def test_codec_sets_cover_their_types() -> None:
    assert set(QUANT_CODECS) == set(F16_FIELDS)
    assert set(DENSE_CODECS) == {"F32", "F16", "BF16"}
    for name, codec in {**QUANT_CODECS, **DENSE_CODECS}.items():
        assert codec.type is GGML_TYPES[name]


@pytest.mark.parametrize("type_name", sorted(QUANT_CODECS))
def test_dequantize_matches_gguf_py(type_name: str) -> None:
    codec = QUANT_CODECS[type_name]
    qtype = GGMLQuantizationType[type_name]
    for seed, (lead, n_blocks) in enumerate(SHAPES):
        data = rows_for(type_name, lead, n_blocks, seed)
        if seed == 0:
            assert code_bytes_cover_all_values(type_name, data)
        expected = gguf_dequantize(data, qtype)
        got = codec.dequantize(data)
        assert got.shape == (*lead, n_blocks * codec.type.block_elements)
        assert expected.shape == got.shape
        assert np.isfinite(expected).all()
        np.testing.assert_array_equal(bits32(got), bits32(expected))


@pytest.mark.parametrize("as_initializers", [False, True], ids=["input", "initializer"])
@pytest.mark.parametrize("type_name", sorted(QUANT_CODECS))
def test_emit_matches_numpy_decode(type_name: str, as_initializers: bool) -> None:
    codec = QUANT_CODECS[type_name]
    for seed, (lead, n_blocks) in enumerate(SHAPES[:2]):
        data = rows_for(type_name, lead, n_blocks, 100 + seed)
        got = emit_rows(codec, data, as_initializers=as_initializers)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(bits32(got), bits32(codec.dequantize(data)))


@pytest.mark.parametrize("type_name", sorted(QUANT_CODECS))
def test_emit_cast_to_f16_is_one_rounding(type_name: str) -> None:
    codec = QUANT_CODECS[type_name]
    data = rows_for(type_name, (3,), 2, 7)
    n = 2 * codec.type.block_elements

    def emit(op: OpBuilder, v: ir.Value) -> ir.Value:
        return op.Cast(codec.emit(op, v, n), to=ir.DataType.FLOAT16)

    (got,) = run_emitter(emit, [data])
    with np.errstate(over="ignore"):  # beyond 65504 rounds to inf, as Cast does
        expected = codec.dequantize(data).astype(np.float16)  # one round-to-nearest-even
    np.testing.assert_array_equal(got.view(np.uint16), expected.view(np.uint16))


# --------------------------------------------------------------------------- dense types


def dense_data(type_name: str) -> np.ndarray:
    """F16 / BF16: all 65536 bit patterns (zeros, subnormals, infinities, NaN payloads);
    F32: random bytes (every class, NaNs included)."""
    if type_name in ("F16", "BF16"):
        return np.arange(1 << 16, dtype="<u2").view(np.uint8).reshape(8, 1 << 14)
    return np.random.default_rng(3).integers(0, 256, size=(2, 3, 1024), dtype=np.uint8)


@pytest.mark.parametrize("type_name", sorted(DENSE_CODECS))
def test_dense_dequantize_matches_gguf_py(type_name: str) -> None:
    codec = DENSE_CODECS[type_name]
    data = dense_data(type_name)
    expected = gguf_dequantize(data, GGMLQuantizationType[type_name])
    got = codec.dequantize(data)
    assert (
        got.shape == expected.shape == (*data.shape[:-1], data.shape[-1] // codec.type.block_bytes)
    )
    np.testing.assert_array_equal(bits32(got), bits32(expected))


@pytest.mark.parametrize("as_initializers", [False, True], ids=["input", "initializer"])
@pytest.mark.parametrize("type_name", sorted(DENSE_CODECS))
def test_dense_emit_matches_numpy_decode(type_name: str, as_initializers: bool) -> None:
    codec = DENSE_CODECS[type_name]
    data = dense_data(type_name)
    got = emit_rows(codec, data, as_initializers=as_initializers)
    np.testing.assert_array_equal(bits32(got), bits32(codec.dequantize(data)))


# --------------------------------------------------------------------------- contracts


def test_dequantize_rejects_partial_blocks() -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        QUANT_CODECS["Q8_0"].dequantize(np.zeros((2, 35), dtype=np.uint8))
    with pytest.raises(TypeError, match="uint8"):
        QUANT_CODECS["Q8_0"].dequantize(np.zeros((2, 34), dtype=np.int8))


def test_emit_rejects_a_row_that_does_not_fit() -> None:
    data = rows_for("Q4_K", (2,), 1, 0)
    with pytest.raises(ValueError, match="whole blocks"):
        run_emitter(lambda op, v: QUANT_CODECS["Q4_K"].emit(op, v, 100), [data])
    with pytest.raises(ValueError, match="last axis"):
        run_emitter(lambda op, v: QUANT_CODECS["Q4_K"].emit(op, v, 512), [data])
