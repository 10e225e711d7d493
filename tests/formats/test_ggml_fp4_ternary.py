"""llama.cpp's FP4, ternary and 1-bit block types: NVFP4, MXFP4, TQ1_0, TQ2_0, Q1_0.

Oracles: gguf-py's `gguf.quants.dequantize` for the numpy decode, bit for bit (Q1_0, which
gguf-py 0.19 cannot decode: ggml's definition, written out as q1_0_by_definition in
reference_fixtures/gguf_fixtures.py); the numpy decode for the graph decode and for the weight
routes (matmul, embedding rows, stacked experts) run in onnxruntime CPU, bit for bit. Blocks are
random bytes in which every scale byte and every code byte value occurs; the scale edge codes
are checked one by one against their definitions, written out here.
"""

from __future__ import annotations

import gguf
import gguf.quants
import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from onnxscript import OpBuilder

from mobius_lite.formats.dense import DenseStorage
from mobius_lite.formats.ggml import mxfp4, nvfp4
from mobius_lite.formats.ggml.storage import Dequantize, GGMLStorage
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.ggml.weight import DECODE, GGMLWeight
from mobius_lite.formats.modelopt.nvfp4 import E2M1_VALUES
from mobius_lite.formats.weight import gemm_transposed
from reference_fixtures.gguf_fixtures import q1_0_by_definition

from .emit_harness import run_emitter
from .ggml_data import random_finite_f16_bits

CODECS = {name: t.codec for name, t in GGML_TYPES.items()}
FP4 = ("MXFP4", "NVFP4")
FP16_SCALED = ("TQ1_0", "TQ2_0", "Q1_0")
GGUF_PY = (*FP4, "TQ1_0", "TQ2_0")  # the types gguf-py 0.19 dequantizes
NEW_TYPES = (*FP4, *FP16_SCALED)
# Scale bytes per block: their offsets (every byte value is a valid scale for these types).
SCALE_BYTES = {"MXFP4": (0,), "NVFP4": (0, 1, 2, 3)}
# Byte offset of the fp16 scale d (ggml-common.h).
F16_AT = {"TQ1_0": 52, "TQ2_0": 64, "Q1_0": 0}
# fp16 bit patterns that are not finite: quiet NaN, signalling NaN, negative NaN, +-inf.
NONFINITE_F16 = (0x7E00, 0x7C01, 0xFE00, 0x7C00, 0xFC00)


def bits32(a: np.ndarray) -> np.ndarray:
    assert a.dtype == np.float32
    return a.view(np.uint32)


def random_rows(type_name: str, lead: tuple[int, ...], n_blocks: int, seed: int) -> np.ndarray:
    """uint8 [*lead, n_blocks * block_bytes]: scale bytes and code bytes each a shuffled tiling
    of 0..255, so that every value occurs once there are 256 of them; fp16 scales finite, the
    special ones (+-0, subnormals, +-65504) first."""
    rng = np.random.default_rng(seed)
    t = GGML_TYPES[type_name]
    blocks = np.zeros((int(np.prod(lead, dtype=np.int64)) * n_blocks, t.block_bytes), np.uint8)
    is_scale = np.zeros(t.block_bytes, dtype=bool)
    is_scale[list(SCALE_BYTES.get(type_name, ()))] = True
    at = F16_AT.get(type_name)
    is_code = ~is_scale
    if at is not None:
        is_code[at : at + 2] = False
    for mask in (m for m in (is_scale, is_code) if m.any()):
        count = blocks[:, mask].size
        tiled = np.resize(np.arange(256, dtype=np.uint8), count)
        blocks[:, mask] = rng.permutation(tiled).reshape(-1, int(mask.sum()))
    if at is not None:
        d = random_finite_f16_bits(rng, len(blocks))
        blocks[:, at : at + 2] = d.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(*lead, n_blocks * t.block_bytes)


def reference(data: np.ndarray, type_name: str) -> np.ndarray:
    return q1_0_by_definition(data) if type_name == "Q1_0" else gguf_py(data, type_name)


def gguf_py(data: np.ndarray, type_name: str) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # 12 * 2^127 = inf, 0 * inf = NaN
        return gguf_dequantize(data, GGMLQuantizationType[type_name])


def emit_rows(type_name: str, data: np.ndarray, *, as_initializers: bool) -> np.ndarray:
    codec = CODECS[type_name]
    n = data.shape[-1] // codec.type.block_bytes * codec.type.block_elements
    (out,) = run_emitter(
        lambda op, v: codec.emit(op, v, n), [data], as_initializers=as_initializers
    )
    return out


# ----------------------------------------------------------------------------- types


def test_type_ids_and_block_sizes_are_ggml_s() -> None:
    """The figures of the issue / ggml.h, and gguf-py's own table."""
    for name in NEW_TYPES:
        t, qtype = GGML_TYPES[name], GGMLQuantizationType[name]
        assert t.type_id == qtype.value
        assert (t.block_elements, t.block_bytes) == gguf.GGML_QUANT_SIZES[qtype]
        assert CODECS[name].type is t
    assert (GGML_TYPES["NVFP4"].block_elements, GGML_TYPES["NVFP4"].block_bytes) == (64, 36)
    assert (GGML_TYPES["MXFP4"].block_elements, GGML_TYPES["MXFP4"].block_bytes) == (32, 17)
    assert [(GGML_TYPES[n].block_elements, GGML_TYPES[n].block_bytes) for n in FP16_SCALED] == [
        (256, 48 + 4 + 2),
        (256, 64 + 2),
        (128, 2 + 16),
    ]


# ----------------------------------------------------------------------------- numpy vs gguf-py


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_dequantize_matches_gguf_py(type_name: str) -> None:
    """gguf-py for all but Q1_0, whose reference is ggml's definition (q1_0_by_definition)."""
    codec = CODECS[type_name]
    for seed, (lead, n_blocks) in enumerate([((8,), 32), ((2, 3), 4), ((), 3)]):
        data = random_rows(type_name, lead, n_blocks, seed)
        got = codec.dequantize(data)
        assert got.shape == (*lead, n_blocks * codec.type.block_elements)
        np.testing.assert_array_equal(bits32(got), bits32(reference(data, type_name)))


@pytest.mark.parametrize("type_name", FP16_SCALED)
def test_nonfinite_fp16_scales_decode_as_ggml_does(type_name: str) -> None:
    """NaN / inf scales are not refused by the decode: they give what ggml computes (NaN,
    +-inf, and NaN for 0 * inf), on both sides bit for bit, NaN payloads included. A package
    that dequantizes them is then refused by the writer's non-finite check (docs/gguf.md)."""
    data = random_rows(type_name, (len(NONFINITE_F16),), 1, 5)
    at = F16_AT[type_name]
    data[:, at : at + 2] = np.array(NONFINITE_F16, "<u2").view(np.uint8).reshape(-1, 2)
    got = CODECS[type_name].dequantize(data)
    expected = reference(data, type_name)
    assert not np.isfinite(expected).any() if type_name == "Q1_0" else np.isnan(expected).any()
    np.testing.assert_array_equal(bits32(got), bits32(expected))
    graph = emit_rows(type_name, data, as_initializers=False)
    np.testing.assert_array_equal(bits32(graph), bits32(got))


@pytest.mark.parametrize("type_name", ["TQ1_0", "TQ2_0"])
def test_ternary_values_survive_gguf_py_s_quantizer(type_name: str) -> None:
    """gguf-py's TQ quantizers (a separate encoding of the same layout) of values in
    {-1, 0, 1} (d = 1 per block) decode back to the same values."""
    rng = np.random.default_rng(11)
    values = rng.integers(-1, 2, size=(4, 512)).astype(np.float32)
    values[:, ::256] = 1.0  # max |x| = 1 per block: d = 1
    packed = gguf.quants.quantize(values, GGMLQuantizationType[type_name])
    np.testing.assert_array_equal(CODECS[type_name].dequantize(packed), values)


def test_tq1_0_base3_digits_of_every_byte() -> None:
    """Digit n of byte q is ((uint8)(q * 3^n) * 3) >> 8: the base-3 fraction ceil(v 256 / 243)
    holds v's digits most significant first. Every byte value in every digit position."""
    block = np.zeros((256, 54), np.uint8)
    block[:, 52:54] = np.array([0x3C00], "<u2").view(np.uint8)  # d = 1
    block[:, :52] = np.arange(256, dtype=np.uint8)[:, None]
    got = CODECS["TQ1_0"].dequantize(block)
    q = np.arange(256)
    for n in range(5):
        digit = (((q * 3**n) % 256) * 3) >> 8
        np.testing.assert_array_equal(got[:, 32 * n], digit - 1)  # byte 0, digit n
        np.testing.assert_array_equal(got[:, 160 + 16 * n], digit - 1)  # byte 32, digit n
    for n in range(4):
        digit = (((q * 3**n) % 256) * 3) >> 8
        np.testing.assert_array_equal(got[:, 240 + 4 * n], digit - 1)  # qh byte 0, digit n


def test_ue4m3_every_byte_against_its_definition() -> None:
    """UE4M3 = E4M3 without its sign bit (ml_dtypes' float8_e4m3fn of the low 7 bits), halved
    for the doubled E2M1 codes; 0x00 and 0x7F (E4M3's NaN) are 0; bit 7 is ignored except that
    ggml's zero test compares the whole byte, so 0xFF is exponent 15, mantissa 7: 480 / 2."""
    x = np.arange(256)
    e4m3 = (x & 0x7F).astype(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    expected = np.where((x == 0) | (x == 0x7F), np.float32(0), e4m3 / np.float32(2))
    expected[0xFF] = 240.0
    np.testing.assert_array_equal(bits32(nvfp4.UE4M3_HALF), bits32(expected.astype(np.float32)))
    assert bits32(nvfp4.UE4M3_HALF[[0x00, 0x7F, 0x80]]).tolist() == [0, 0, 0]  # +0, not NaN
    assert nvfp4.UE4M3_HALF[0x01] == 2.0**-10  # smallest subnormal 2^-9, halved
    assert nvfp4.UE4M3_HALF[0x7E] == 224.0  # largest finite E4M3 448, halved
    # gguf-py's own UE4M3 decode agrees on every byte
    np.testing.assert_array_equal(
        bits32(nvfp4.UE4M3_HALF),
        bits32(np.asarray(gguf.quants.NVFP4.ue4m3_to_fp32(x.astype(np.uint8)), np.float32)),
    )


def test_e2m1_code_8_is_plus_zero_in_ggml_and_minus_zero_in_modelopt() -> None:
    """The same value with different bits: ggml's kvalues_mxfp4[8] is the integer 0, ModelOpt's
    (and E2M1's) code 8 is -0.0. Every other code is 2 x E2M1."""
    kvalues = mxfp4.KVALUES_MXFP4.astype(np.float32)
    assert bits32(kvalues[8:9]).tolist() == [0x00000000]
    assert bits32(E2M1_VALUES[8:9]).tolist() == [0x80000000]
    others = np.arange(16) != 8
    np.testing.assert_array_equal(bits32(kvalues[others]), bits32(2 * E2M1_VALUES[others]))
    # decoded: code 8 under a non-zero scale is +0 (bits 0) in both decodes, code 0 too
    block = np.zeros((1, 36), np.uint8)
    block[0, :4] = 0x38  # 1.0
    block[0, 4:] = 0x08  # element j = code 8, element j + 8 = code 0
    got = CODECS["NVFP4"].dequantize(block)
    assert not bits32(got).any()
    assert not bits32(emit_rows("NVFP4", block, as_initializers=False)).any()
    assert not bits32(gguf_py(block, "NVFP4")).any()


def test_nvfp4_nibble_order_low_is_first_half_of_each_group() -> None:
    block = np.zeros((1, 36), np.uint8)
    block[0, :4] = [0x38, 0x40, 0x48, 0x30]  # 1, 2, 4, 0.5
    block[0, 4 + 8 * 2 + 3] = 0x71  # group 2, byte 3: low code 1 (0.5), high code 7 (6)
    got = CODECS["NVFP4"].dequantize(block)[0]
    expected = np.zeros(64, np.float32)
    expected[32 + 3], expected[32 + 8 + 3] = 4 * 0.5, 4 * 6.0
    np.testing.assert_array_equal(got, expected)


def test_e8m0_edge_codes() -> None:
    """2^(e - 128) for every byte: subnormal below e = 2, 0xFF is 2^127 (not NaN)."""
    e = np.arange(256)
    expected = np.ldexp(np.float64(1.0), e - 128).astype(np.float32)
    np.testing.assert_array_equal(bits32(mxfp4.E8M0_HALF), bits32(expected))
    assert bits32(mxfp4.E8M0_HALF[[0, 1, 2]]).tolist() == [0x00200000, 0x00400000, 0x00800000]
    assert mxfp4.E8M0_HALF[0xFF] == np.float32(2.0**127)
    # extremes in blocks: smallest and largest scales with every code; 12 * 2^127 is +-inf
    blocks = np.zeros((4, 17), np.uint8)
    blocks[:, 0] = [0x00, 0x01, 0xFE, 0xFF]
    blocks[:, 1:] = np.arange(16, dtype=np.uint8) * 0x11  # codes 0..15, twice
    got = CODECS["MXFP4"].dequantize(blocks)
    np.testing.assert_array_equal(bits32(got), bits32(gguf_py(blocks, "MXFP4")))
    np.testing.assert_array_equal(
        bits32(emit_rows("MXFP4", blocks, as_initializers=True)), bits32(got)
    )
    assert got[0, 1] == np.float32(2.0**-128) and got[0, 9] == -np.float32(2.0**-128)
    assert got[3, 1] == np.float32(2.0**127) and got[3, 9] == -np.float32(2.0**127)
    assert np.isposinf(got[3, 2]) and np.isneginf(got[3, 15])  # 2 * 2^127 = 2^128 overflows


# ----------------------------------------------------------------------------- graph vs numpy


@pytest.mark.parametrize("as_initializers", [False, True], ids=["input", "initializer"])
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_emit_matches_numpy_decode(type_name: str, as_initializers: bool) -> None:
    for seed, (lead, n_blocks) in enumerate([((8,), 32), ((2, 3), 2)]):
        data = random_rows(type_name, lead, n_blocks, 100 + seed)
        got = emit_rows(type_name, data, as_initializers=as_initializers)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(bits32(got), bits32(CODECS[type_name].dequantize(data)))


# ----------------------------------------------------------------------------- weight routes

K = 256  # whole blocks of every type


@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_routes_decode_on_both_backends(type_name: str, backend: str) -> None:
    """onnxruntime 1.32 has no CPU kernel for these types (GatherPacked refuses them,
    MatMulPacked has no CPU kernel): both backends decode with standard ops."""
    ggml = GGML_TYPES[type_name]
    for dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        for shape in ((16, K), (3, 16, K)):
            fmt = GGMLWeight.choose(ggml, dtype, backend, shape)
            assert (fmt.matmul_route, fmt.select_route) == (DECODE, DECODE)
            assert fmt.name == f"ggml {type_name} (decode / decode)"


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_onnxruntime_cpu_gather_packed_refuses_the_type(type_name: str) -> None:
    """Why the ort route decodes these: onnxruntime 1.32's CPU GatherPacked (the only packed
    ggml kernel it has on CPU) refuses their packed_type at session creation."""
    data = random_rows(type_name, (4,), K // GGML_TYPES[type_name].block_elements, 3)

    def emit(op: OpBuilder, table: ir.Value, index: ir.Value) -> ir.Value:
        return op.GatherPacked(
            table,
            index,
            packed_type=GGML_TYPES[type_name].type_id,
            K=K,
            output_dtype=1,
            _domain="com.microsoft",
        )

    ids = np.array([1, 0], dtype=np.int64)
    with pytest.raises(Exception, match=f"unsupported packed_type={GGML_TYPES[type_name].type_id}"):
        run_emitter(emit, [data, ids], opset_imports={"com.microsoft": 1})


def _finite_rows(type_name: str, lead: tuple[int, ...], seed: int) -> np.ndarray:
    """Random rows whose values are finite and moderate (a Gemm of them stays finite)."""
    data = random_rows(type_name, lead, K // GGML_TYPES[type_name].block_elements, seed)
    blocks = data.reshape(-1, GGML_TYPES[type_name].block_bytes)  # a view: edits reach data
    for offset in SCALE_BYTES.get(type_name, ()):  # E8M0 near 2^0, UE4M3 exponents 5..8
        byte = blocks[:, offset]
        blocks[:, offset] = (120 + byte % 16) if type_name == "MXFP4" else (0x28 + byte % 32)
    if type_name in F16_AT:
        d = np.random.default_rng(seed).uniform(-2, 2, len(blocks)).astype("<f2")
        blocks[:, F16_AT[type_name] : F16_AT[type_name] + 2] = d.view(np.uint8).reshape(-1, 2)
    return data


@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_matmul_is_gemm_of_the_numpy_decode(type_name: str, backend: str) -> None:
    """x @ W^T + b through the weight's matmul equals onnxruntime's Gemm over the numpy
    decode of W, bit for bit (the same Gemm, the same weight values)."""
    packed = _finite_rows(type_name, (16,), 1)
    x = np.random.default_rng(2).standard_normal((3, K)).astype(np.float32)
    bias = np.random.default_rng(3).standard_normal(16).astype(np.float32)
    fmt = GGMLWeight.choose(GGML_TYPES[type_name], ir.DataType.FLOAT, backend, (16, K))
    assert fmt.parameters((16, K))[""].shape == packed.shape

    def emit(op: OpBuilder, xv: ir.Value, w: ir.Value, b: ir.Value) -> ir.Value:
        return fmt.matmul(op, xv, {"": w}, b)

    def reference(op: OpBuilder, xv: ir.Value, w: ir.Value, b: ir.Value) -> ir.Value:
        return gemm_transposed(op, xv, w, b)

    (got,) = run_emitter(emit, [x], initializers=[packed, bias])
    dense = CODECS[type_name].dequantize(packed)
    (expected,) = run_emitter(reference, [x], initializers=[dense, bias])
    assert np.isfinite(expected).all()
    np.testing.assert_array_equal(bits32(got), bits32(expected))


@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("type_name", NEW_TYPES)
@pytest.mark.parametrize("lead", [(10,), (4, 6)], ids=["embedding", "experts"])
def test_select_rows_match_numpy_decode(
    type_name: str, backend: str, lead: tuple[int, ...]
) -> None:
    """Embedding rows (a [V, K] table) and stacked experts ([E, N, K], experts picked by id)
    decode to the numpy decode of the same rows, bit for bit; with f16 activations, to that
    decode rounded once to f16."""
    packed = random_rows(type_name, lead, K // GGML_TYPES[type_name].block_elements, 7)
    ids = np.array([[3, 0], [1, 3]], dtype=np.int64)
    expected = CODECS[type_name].dequantize(packed)[ids]
    for dtype in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        fmt = GGMLWeight.choose(GGML_TYPES[type_name], dtype, backend, (*lead, K))

        def emit(op: OpBuilder, index: ir.Value, table: ir.Value, fmt=fmt) -> ir.Value:
            return fmt.select(op, {"": table}, index)

        (got,) = run_emitter(emit, [ids], initializers=[packed])
        assert got.shape == (*ids.shape, *lead[1:], K)
        if dtype == ir.DataType.FLOAT:
            np.testing.assert_array_equal(bits32(got), bits32(expected))
        else:
            with np.errstate(over="ignore"):  # past 65504 rounds to inf, as Cast does
                rounded = expected.astype(np.float16)
            np.testing.assert_array_equal(got.view(np.uint16), rounded.view(np.uint16))


# ----------------------------------------------------------------------------- storage


@pytest.mark.parametrize("type_name", NEW_TYPES)
def test_storage_is_verbatim_and_dequantize_is_recomputed_independently(type_name: str) -> None:
    """Packed routes keep the bytes as they are; --dequantize writes the numpy decode, and
    verify's recomputation (gguf-py; Q1_0: the definition, apart from the codec) agrees."""
    storage = GGMLStorage(GGML_TYPES[type_name])
    verbatim = storage.conversion_to(DenseStorage(np.dtype(np.uint8)))
    data = random_rows(type_name, (3,), 2, 21)
    raw = memoryview(data.reshape(-1))
    assert verbatim.verbatim and bytes(verbatim.convert(raw)) == data.tobytes()
    dequantize = storage.conversion_to(DenseStorage(np.dtype(np.float32)))
    assert isinstance(dequantize, Dequantize)
    written = bytes(dequantize.convert(raw))
    assert written == dequantize.recompute(raw)
    assert written == CODECS[type_name].dequantize(data).tobytes()
    assert dequantize.converted_shape(data.shape) == (3, 2 * GGML_TYPES[type_name].block_elements)
