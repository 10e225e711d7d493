"""The ggml tensor types, one row each: id, block geometry, codec and the routes the type has.

The figures are ggml's (ggml.h / gguf-py's GGML_QUANT_SIZES). A quantized GGUF tensor is
stored row by row: a row of `n` elements (the fastest axis, ne[0]) is `n / block_elements`
consecutive blocks of `block_bytes` bytes, so its bytes view as uint8 [..., row_bytes(n)].

Every row holds its codec: the per-block decode its codec module writes (dense.py,
legacy.py, kquants.py, iq1.py .. iq4.py, ternary.py, mxfp4.py, nvfp4.py, q1_0.py), made into
whole-row decodes with the row's geometry (`GGMLType.codec`, blocks.BlockCodec). That is the
standard route: decode with standard ops. The rest of a row says which of onnxruntime's routes
fit it (weight.py chooses among them):
- ort select: `gather_packed`, onnxruntime 1.32's CPU GatherPacked accepts it (probed:
  tests/test_gguf_export.py checks each against the numpy decode, and that the others are
  refused), and MatMulPacked (CUDA, bf16 graphs) takes the same contract;
- ort matmul: `blocks`, the lossless MatMulNBits re-layout of its blocks (relayout/
  blocks_matmulnbits.py: Q8_0 / Q4_0);
- exact re-layout: `exact`, its blocks as integer codes with one scale (and one min) per
  block (relayout/exact_codes.py; the row's CodeForm holds its reader, relayout/
  code_readers.py), for MatMulNBits (`--activations`) and for QMoE experts
  (relayout/qmoe_experts.py: 4-bit forms with f32 activations, 8-bit ones with int8; a form
  with mins takes the min-term layout of relayout/qmoe_min_term.py).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field

from mobius_lite.formats.ggml import (
    dense,
    iq1,
    iq2,
    iq3,
    iq4,
    kquants,
    legacy,
    mxfp4,
    nvfp4,
    q1_0,
    ternary,
)
from mobius_lite.formats.ggml.blocks import BlockCodec, BlockDecode
from mobius_lite.formats.ggml.relayout import code_readers
from mobius_lite.formats.ggml.relayout.code_readers import CodeReader


@dataclass(frozen=True)
class CodeForm:
    """A type's exact code form (relayout/exact_codes.py's table): value = (code - zero_point)
    * scale [- min] per block of `block_size` along K, and the reader of its blocks' codes,
    scales and mins (relayout/code_readers.py)."""

    bits: int
    block_size: int
    zero_point: int
    read: CodeReader
    has_mins: bool = False


@dataclass(frozen=True)
class BlocksForm:
    """A type whose blocks are MatMulNBits blocks as they are (one fp16 scale, a constant
    zero point): `bits` per code and MatMulNBits' default zero point 2^(bits - 1)."""

    bits: int
    zero_point: int


@dataclass(frozen=True)
class GGMLType:
    """One ggml tensor type: its geometry, its codec and its routes (module doc). The row is
    given its codec module's per-block decode and makes its whole-row codec from it, so
    `row.codec.type is row`."""

    name: str  # ggml's spelling: "Q8_0", "IQ2_XXS", "F32"
    type_id: int  # ggml_type enum value (also onnxruntime's packed_type attribute)
    block_elements: int
    block_bytes: int
    decode: InitVar[BlockDecode]  # its codec module's per-block decode
    gather_packed: bool = False  # ort select: CPU GatherPacked (and MatMulPacked for bf16)
    blocks: BlocksForm | None = None  # ort matmul: MatMulNBits over its blocks re-laid
    exact: CodeForm | None = None  # exact re-layout: MatMulNBits (`--activations`) and QMoE
    codec: BlockCodec = field(init=False, repr=False, compare=False)  # standard route

    def __post_init__(self, decode: BlockDecode) -> None:
        object.__setattr__(self, "codec", BlockCodec(self, decode))

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
        GGMLType("F32", 0, 1, 4, dense.F32),
        GGMLType("F16", 1, 1, 2, dense.F16),
        GGMLType(
            "Q4_0",
            2,
            32,
            18,
            legacy.Q4_0,
            True,
            BlocksForm(4, 8),
            CodeForm(4, 32, 8, code_readers.q4_0),
        ),
        GGMLType("Q4_1", 3, 32, 20, legacy.Q4_1),
        GGMLType("Q5_0", 6, 32, 22, legacy.Q5_0, **_SELECT),
        GGMLType("Q5_1", 7, 32, 24, legacy.Q5_1),
        GGMLType(
            "Q8_0",
            8,
            32,
            34,
            legacy.Q8_0,
            True,
            BlocksForm(8, 128),
            CodeForm(8, 32, 128, code_readers.q8_0),
        ),
        GGMLType("Q2_K", 10, 256, 84, kquants.Q2_K),
        GGMLType("Q3_K", 11, 256, 110, kquants.Q3_K),
        GGMLType(
            "Q4_K",
            12,
            256,
            144,
            kquants.Q4_K,
            exact=CodeForm(4, 32, 0, code_readers.q4_k, has_mins=True),
        ),
        GGMLType("Q5_K", 13, 256, 176, kquants.Q5_K, **_SELECT),
        GGMLType(
            "Q6_K", 14, 256, 210, kquants.Q6_K, True, exact=CodeForm(8, 16, 128, code_readers.q6_k)
        ),
        GGMLType(
            "IQ2_XXS",
            16,
            256,
            66,
            iq2.IQ2_XXS,
            True,
            exact=CodeForm(8, 32, 128, code_readers.iq2_xxs),
        ),
        GGMLType("IQ2_XS", 17, 256, 74, iq2.IQ2_XS, **_SELECT),
        GGMLType("IQ3_XXS", 18, 256, 98, iq3.IQ3_XXS, **_SELECT),
        GGMLType("IQ1_S", 19, 256, 50, iq1.IQ1_S),
        GGMLType("IQ4_NL", 20, 32, 18, iq4.IQ4_NL, **_SELECT),
        GGMLType("IQ3_S", 21, 256, 110, iq3.IQ3_S),
        GGMLType("IQ2_S", 22, 256, 82, iq2.IQ2_S, **_SELECT),
        GGMLType("IQ4_XS", 23, 256, 136, iq4.IQ4_XS, **_SELECT),
        GGMLType("IQ1_M", 29, 256, 56, iq1.IQ1_M),
        GGMLType("BF16", 30, 1, 2, dense.BF16),
        GGMLType("TQ1_0", 34, 256, 54, ternary.TQ1_0),
        GGMLType("TQ2_0", 35, 256, 66, ternary.TQ2_0),
        GGMLType("MXFP4", 39, 32, 17, mxfp4.MXFP4, exact=CodeForm(8, 32, 128, code_readers.mxfp4)),
        GGMLType("NVFP4", 40, 64, 36, nvfp4.NVFP4, exact=CodeForm(8, 16, 128, code_readers.nvfp4)),
        GGMLType("Q1_0", 41, 128, 18, q1_0.Q1_0),
    )
}
GGML_TYPES_BY_ID: dict[int, GGMLType] = {t.type_id: t for t in GGML_TYPES.values()}
