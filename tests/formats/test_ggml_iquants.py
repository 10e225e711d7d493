"""The IQ block codecs against gguf-py's dequantize (numpy) and their own numpy decode (graph).

Blocks are built field by field from ggml's block layouts (ggml-common.h) so that every grid
index, sign pattern, scale and delta value occurs; that they really do is checked on gguf-py's
decode of them, not on ours. fp16 scales are drawn finite: zero, negative, subnormal, largest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gguf.quants
import numpy as np
import onnx_ir as ir
import pytest
from gguf import GGMLQuantizationType
from onnxscript import GraphBuilder

from mobius_lite.formats.ggml import grids, iq1, iq2, iq3, iq4
from mobius_lite.formats.ggml.blocks import BlockCodec
from mobius_lite.formats.ggml.types import GGML_TYPES

from .emit_harness import run_emitter

IQ_DECODES = iq1.DECODES + iq2.DECODES + iq3.DECODES + iq4.DECODES
CODECS: dict[str, BlockCodec] = {
    t.name: t.codec for t in GGML_TYPES.values() if t.codec.decode in IQ_DECODES
}
NAMES = sorted(CODECS)
ONE_F16 = 0x3C00


@dataclass(frozen=True)
class Part:
    """Bits [offset, offset + width) of a block hold bits [shift, shift + width) of a field slot."""

    name: str
    offsets: np.ndarray  # [k] bit offsets in the block
    width: int
    shift: np.ndarray | int = 0  # per offset, or one for all
    slots: np.ndarray | None = None  # field slot of each offset (default 0..k-1)

    def slot_index(self) -> np.ndarray:
        return np.arange(len(self.offsets)) if self.slots is None else self.slots


def _p(name: str, offsets: np.ndarray, width: int, **kw: object) -> Part:
    return Part(name, np.asarray(offsets).ravel(), width, **kw)  # type: ignore[arg-type]


def _layouts() -> dict[str, list[Part]]:
    """ggml's block_iq* structs as bit fields (little-endian integers, low nibble first)."""
    e32, q16, ib8 = np.arange(32), np.arange(16), np.arange(8)
    k64, l4 = np.arange(64), np.arange(4)
    d = _p("d", [0], 16)
    g8 = np.arange(8)[:, None]
    xxs_word = 8 * (6 + 8 * g8)  # IQ2_XXS: the uint32 after each group's 4 grid bytes
    w3 = 8 * (66 + 4 * g8)  # IQ3_XXS: scales_and_signs words
    j256 = np.arange(256)
    return {
        "IQ2_XXS": [
            d,
            _p("grid", 8 * (2 + 8 * g8 + l4), 8),
            _p("sign", xxs_word + 7 * l4, 7),
            _p("scale", xxs_word + 28, 4),
        ],
        "IQ2_XS": [
            d,
            _p("grid", 8 * (2 + 2 * e32), 9),
            _p("sign", 8 * (2 + 2 * e32) + 9, 7),
            _p("scale", 8 * (66 + q16 // 2) + 4 * (q16 % 2), 4),
        ],
        "IQ2_S": [
            d,
            _p("grid", 8 * (2 + e32), 8),
            _p("grid", 8 * (66 + e32 // 4) + 2 * (e32 % 4), 2, shift=8),
            _p("sign", 8 * (34 + e32), 8),
            _p("scale", 8 * (74 + q16 // 2) + 4 * (q16 % 2), 4),
        ],
        "IQ3_XXS": [
            d,
            _p("grid", 8 * (2 + k64), 8),
            _p("sign", w3 + 7 * l4, 7),
            _p("scale", w3 + 28, 4),
        ],
        "IQ3_S": [
            d,
            _p("grid", 8 * (2 + k64), 8),
            _p("grid", 8 * (66 + k64 // 8) + k64 % 8, 1, shift=8),
            _p("sign", 8 * (74 + e32), 8),
            _p("scale", 8 * (106 + ib8 // 2) + 4 * (ib8 % 2), 4),
        ],
        "IQ1_S": [
            d,
            _p("grid", 8 * (2 + e32), 8),
            _p("grid", 8 * (34 + 2 * (e32 // 4)) + 3 * (e32 % 4), 3, shift=8),
            _p("scale", 8 * (34 + 2 * ib8) + 12, 3),
            _p("delta", 8 * (34 + 2 * ib8) + 15, 1),
        ],
        "IQ1_M": [
            _p("d", 8 * (48 + 2 * l4) + 12, 4, shift=4 * l4, slots=np.zeros(4, dtype=np.int64)),
            _p("grid", 8 * e32, 8),
            _p("grid", 8 * (32 + e32 // 2) + 4 * (e32 % 2), 3, shift=8),
            _p("delta", 8 * (32 + e32 // 2) + 4 * (e32 % 2) + 3, 1),
            _p("scale", 8 * (48 + 2 * (q16 // 4)) + 3 * (q16 % 4), 3),
        ],
        "IQ4_NL": [d, _p("q", 8 * (2 + e32 % 16) + 4 * (e32 // 16), 4)],
        "IQ4_XS": [
            d,
            _p("scale", 8 * (4 + ib8 // 2) + 4 * (ib8 % 2), 4),
            _p("scale", 16 + 2 * ib8, 2, shift=4),
            _p("q", 8 * (8 + 16 * (j256 // 32) + j256 % 16) + 4 * (j256 % 32 // 16), 4),
        ],
    }


LAYOUTS = _layouts()
# How many values each field takes: grid entries, sign patterns (7-bit ksigns index or a raw
# sign byte), scales, delta signs, IQ4 indices.
RANGES: dict[str, dict[str, int]] = {
    "IQ2_XXS": {"grid": 256, "sign": 128, "scale": 16},
    "IQ2_XS": {"grid": 512, "sign": 128, "scale": 16},
    "IQ2_S": {"grid": 1024, "sign": 256, "scale": 16},
    "IQ3_XXS": {"grid": 256, "sign": 128, "scale": 16},
    "IQ3_S": {"grid": 512, "sign": 256, "scale": 16},
    "IQ1_S": {"grid": 2048, "scale": 8, "delta": 2},
    "IQ1_M": {"grid": 2048, "scale": 8, "delta": 2},
    "IQ4_NL": {"q": 16},
    "IQ4_XS": {"scale": 64, "q": 16},
}
# With d = 1 and this scale, y is grid * sign * UNIT (IQ2, IQ3), grid + delta (IQ1), or the
# kvalue (IQ4): (scale field value, UNIT, gguf-py grid class, values per grid entry).
UNIT = {
    "IQ2_XXS": (0, 0.125, "IQ2_XXS", 8),
    "IQ2_XS": (0, 0.125, "IQ2_XS", 8),
    "IQ2_S": (0, 0.125, "IQ2_S", 8),
    "IQ3_XXS": (0, 0.25, "IQ3_XXS", 4),
    "IQ3_S": (0, 1.0, "IQ3_S", 4),
    "IQ1_S": (0, 1.0, "IQ1_S", 8),
    "IQ1_M": (0, 1.0, "IQ1_M", 8),
    "IQ4_NL": (0, 1.0, None, 1),
    "IQ4_XS": (33, 1.0, None, 1),
}


def _slots(name: str, field: str) -> int:
    return max(int(p.slot_index().max()) + 1 for p in LAYOUTS[name] if p.name == field)


def _pack(name: str, base: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    """Overwrite the named fields of blocks `base` [n, block_bytes] with values [n, slots]."""
    bits = np.unpackbits(base, axis=-1, bitorder="little")
    for part in LAYOUTS[name]:
        if part.name not in values:
            continue
        v = values[part.name].astype(np.int64)[:, part.slot_index()]
        for b in range(part.width):
            bits[:, part.offsets + b] = (v >> (np.asarray(part.shift) + b)) & 1
    return np.packbits(bits, axis=-1, bitorder="little")


def _finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """n finite fp16 bit patterns, starting with zeros, subnormals, negatives and the largest."""
    special = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x3C00, 0xBC00]
    special += [0x7BFF, 0xFBFF, 0x3555, 0xC001]
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.int64)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits)  # no inf / nan exponent
    bits[: min(n, len(special))] = special[:n]
    return bits


def _tiled(rng: np.random.Generator, count: int, n: int, slots: int) -> np.ndarray:
    """[n, slots] holding every value in [0, count) at least once, in random order."""
    perms = np.concatenate([rng.permutation(count) for _ in range(math.ceil(n * slots / count))])
    return perms[: n * slots].reshape(n, slots)


def _n_blocks(name: str, fields: list[str]) -> int:
    n = max(math.ceil(RANGES[name][f] / _slots(name, f)) for f in fields)
    return -(-n // 4) * 4  # a multiple of 4 so the blocks reshape to [2, 2, n / 4 blocks]


def _enumerated(name: str, rng: np.random.Generator, mode: str) -> np.ndarray:
    """Blocks [n, block_bytes] enumerating fields.

    mode "index": grid / sign / delta / q enumerated, d = 1 and the unit scale;
    mode "scale": scales enumerated, grid entry 0, no signs or deltas, d = 1 (IQ4: kvalue 1);
    mode "mixed": every field enumerated and d finite random.
    """
    gtype = CODECS[name].type
    ranges = RANGES[name]
    index_fields = [f for f in ranges if f != "scale"]
    enum = {"index": index_fields, "scale": ["scale"], "mixed": list(ranges)}[mode]
    enum = [f for f in enum if f in ranges]
    n = _n_blocks(name, enum)
    values = {f: _tiled(rng, ranges[f], n, _slots(name, f)) for f in enum}
    for f in ranges:
        if f not in values:
            fill = UNIT[name][0] if f == "scale" else (8 if f == "q" else 0)
            values[f] = np.full((n, _slots(name, f)), fill, dtype=np.int64)
    d = _finite_f16_bits(rng, n) if mode == "mixed" else np.full(n, ONE_F16)
    values["d"] = d[:, None]
    base = rng.integers(0, 256, size=(n, gtype.block_bytes), dtype=np.uint8)
    return _pack(name, base, values)


def _random_rows(name: str, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random blocks with finite fp16 d: uint8 [*shape[:-1], shape[-1] blocks' bytes]."""
    gtype = CODECS[name].type
    n = math.prod(shape)
    base = rng.integers(0, 256, size=(n, gtype.block_bytes), dtype=np.uint8)
    blocks = _pack(name, base, {"d": _finite_f16_bits(rng, n)[:, None]})
    return blocks.reshape(*shape[:-1], shape[-1] * gtype.block_bytes)


def _gguf(name: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, GGMLQuantizationType[name])


def _assert_bits_equal(actual: np.ndarray, expected: np.ndarray) -> None:
    assert actual.dtype == np.float32 and expected.dtype == np.float32
    assert actual.shape == expected.shape
    mismatch = actual.view(np.uint32) != expected.view(np.uint32)
    assert not mismatch.any(), f"{mismatch.sum()} of {mismatch.size} values differ in bits"


def _unique_rows(a: np.ndarray) -> int:
    return int(np.unique(a, axis=0).shape[0])


def _emit(name: str, data: np.ndarray, *, as_initializers: bool, to_f16: bool = False):
    codec = CODECS[name]
    row_elements = data.shape[-1] // codec.type.block_bytes * codec.type.block_elements

    def build(op, value):
        out = codec.emit(op, value, row_elements)
        return op.Cast(out, to=ir.DataType.FLOAT16) if to_f16 else out

    return run_emitter(build, [data], as_initializers=as_initializers)[0]


@pytest.mark.parametrize("name", NAMES)
def test_enumerated_blocks_cover_every_index_sign_and_scale(name: str) -> None:
    rng = np.random.default_rng(1)
    decode = CODECS[name].dequantize
    scale, unit, grid_class, entry = UNIT[name]

    blocks = _enumerated(name, rng, "index")
    ref = _gguf(name, blocks)
    _assert_bits_equal(decode(blocks), ref)
    if name.startswith("IQ4"):
        assert sorted(set(ref.ravel().tolist())) == sorted(grids.KVALUES_IQ4NL.tolist())
    else:
        cls = getattr(gguf.quants, grid_class)
        cls.init_grid()
        table = np.asarray(cls.grid).reshape(cls.grid_shape)
        if name.startswith("IQ1"):
            grid_rows = np.round(ref).reshape(-1, entry)
            assert set(np.unique(ref - np.round(ref)).tolist()) == {-0.125, 0.125}
        else:
            grid_rows = (np.abs(ref) / np.float32(unit)).reshape(-1, entry)
            n_signs = RANGES[name]["sign"]
            assert _unique_rows(ref.reshape(-1, 8) < 0) == n_signs  # every sign pattern
        assert _unique_rows(grid_rows) == table.shape[0]  # every grid entry ...
        assert _unique_rows(np.concatenate([grid_rows, table])) == table.shape[0]  # ... only

    if "scale" in RANGES[name]:
        blocks = _enumerated(name, rng, "scale")
        ref = _gguf(name, blocks)
        _assert_bits_equal(decode(blocks), ref)
        assert np.unique(ref).size == RANGES[name]["scale"]  # every scale value


@pytest.mark.parametrize("name", NAMES)
def test_dequantize_matches_gguf_bit_for_bit(name: str) -> None:
    rng = np.random.default_rng(2)
    decode = CODECS[name].dequantize
    cases = [
        _enumerated(name, rng, "mixed"),  # [n, block_bytes], finite random d
        _random_rows(name, rng, (5, 3)),  # 5 rows of 3 blocks
        _random_rows(name, rng, (2, 3, 2)),  # stacked experts [E, N, row_bytes]
        _random_rows(name, rng, (1,)),  # one row of one block, no leading dims
    ]
    gtype = CODECS[name].type
    for data in cases:
        out = decode(data)
        row_elements = data.shape[-1] // gtype.block_bytes * gtype.block_elements
        assert out.shape == (*data.shape[:-1], row_elements)
        _assert_bits_equal(out, _gguf(name, data))


def _emit_cases(name: str) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    gtype = CODECS[name].type
    mixed = _enumerated(name, rng, "mixed")
    per_row = mixed.shape[0] // 4
    return [
        mixed.reshape(2, 2, per_row * gtype.block_bytes),  # [E, N, row_bytes]
        _random_rows(name, rng, (3, 2)),  # [N, row_bytes]
        _random_rows(name, rng, (1,)),  # [row_bytes]
    ]


@pytest.mark.parametrize("as_initializers", [False, True], ids=["input", "initializer"])
@pytest.mark.parametrize("name", NAMES)
def test_emit_matches_numpy_bit_for_bit(name: str, as_initializers: bool) -> None:
    for data in _emit_cases(name):
        out = _emit(name, data, as_initializers=as_initializers)
        _assert_bits_equal(out, CODECS[name].dequantize(data))


@pytest.mark.parametrize("name", NAMES)
def test_emit_decodes_gathered_rows(name: str) -> None:
    """Rows picked by a Gather (as selected experts' or tokens' rows are) keep its index shape."""
    codec = CODECS[name]
    data = _random_rows(name, np.random.default_rng(4), (5, 2))
    rows = np.array([[4, 0], [2, 2]], dtype=np.int64)
    row_elements = 2 * codec.type.block_elements

    def build(op, value, index):
        return codec.emit(op, op.Gather(value, index, axis=0), row_elements)

    out = run_emitter(build, [data, rows], as_initializers=True)[0]
    _assert_bits_equal(out, codec.dequantize(data[rows]))


@pytest.mark.parametrize("name", NAMES)
def test_emit_cast_to_f16_is_one_rounding_of_the_decode(name: str) -> None:
    for data in _emit_cases(name):
        out = _emit(name, data, as_initializers=False, to_f16=True)
        ref = CODECS[name].dequantize(data)
        assert out.dtype == np.float16 and out.shape == ref.shape
        # The f16 neighbours bracketing each f32 value; a single rounding lands on one of them.
        with np.errstate(over="ignore"):  # beyond 65504 the neighbours are 65504 and inf
            near = ref.astype(np.float16)
            wide = near.astype(np.float32)
            below = np.where(wide > ref, np.nextafter(near, np.float16(-np.inf)), near)
            above = np.where(wide < ref, np.nextafter(near, np.float16(np.inf)), near)
        ok = (out == below) | (out == above)
        assert ok.all(), f"{(~ok).sum()} values are not one f16 rounding of the f32 decode"


@pytest.mark.parametrize("name", NAMES)
def test_emit_is_a_small_vectorised_graph(name: str) -> None:
    codec = CODECS[name]
    x = ir.Value(
        name="x",
        type=ir.TensorType(ir.DataType.UINT8),
        shape=ir.Shape([64, 4 * codec.type.block_bytes]),
    )
    graph = ir.Graph(inputs=[x], outputs=[], nodes=[], opset_imports={"": 27}, name="g")
    codec.emit(GraphBuilder(graph).op, x, 4 * codec.type.block_elements)
    ops = [node.op_type for node in graph if node.op_type != "Constant"]
    assert len(ops) <= 40, ops
    assert not {"Loop", "Scan", "If"} & set(ops)
    assert all(node.domain == "" for node in graph)


@pytest.mark.parametrize("name", NAMES)
def test_rows_must_hold_whole_blocks(name: str) -> None:
    codec = CODECS[name]
    bad = np.zeros((2, codec.type.block_bytes + 1), dtype=np.uint8)
    with pytest.raises(ValueError):
        codec.dequantize(bad)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.UINT8), shape=ir.Shape([2, 7]))
    graph = ir.Graph(inputs=[x], outputs=[], nodes=[], opset_imports={"": 27}, name="g")
    with pytest.raises(ValueError):
        codec.emit(GraphBuilder(graph).op, x, codec.type.block_elements)


def test_grid_tables_match_ggml_common_h() -> None:
    """A few entries quoted from ggml-common.h (uint64 / uint32 little-endian byte vectors)."""

    def le(words: list[int], width: int) -> np.ndarray:
        return np.array([list(w.to_bytes(width, "little")) for w in words], dtype=np.uint8)

    iq2xxs = [0x0808080808080808, 0x080808080808082B, 0x0808080808081919, 0x0808080808082B08]
    np.testing.assert_array_equal(grids.IQ2XXS_GRID[:4], le(iq2xxs, 8))
    np.testing.assert_array_equal(grids.IQ2XXS_GRID[255], le([0x2B2B2B1908081908], 8)[0])
    np.testing.assert_array_equal(
        grids.IQ3XXS_GRID[:3], le([0x04040404, 0x04040414, 0x04040424], 4)
    )
    np.testing.assert_array_equal(grids.KSIGNS_IQ2XS[:8], [0, 129, 130, 3, 132, 5, 6, 135])
    np.testing.assert_array_equal(grids.KSIGNS_IQ2XS[-4:], [252, 125, 126, 255])
    kvalues = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]
    np.testing.assert_array_equal(grids.KVALUES_IQ4NL, kvalues)
    shapes = {
        "IQ2XXS_GRID": (256, 8),
        "IQ2XS_GRID": (512, 8),
        "IQ2S_GRID": (1024, 8),
        "IQ3XXS_GRID": (256, 4),
        "IQ3S_GRID": (512, 4),
        "IQ1S_GRID": (2048, 8),
    }
    for attr, shape in shapes.items():
        assert getattr(grids, attr).shape == shape
        assert _unique_rows(getattr(grids, attr)) == shape[0]
    # ksigns: bit 7 makes the number of negative signs even.
    parity = np.unpackbits(grids.KSIGNS_IQ2XS[:, None], axis=1).sum(axis=1) % 2
    assert not parity.any() and (np.arange(128) == (grids.KSIGNS_IQ2XS & 127)).all()
