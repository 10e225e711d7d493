"""ggml blocks as integer codes with one scale (and one min) per sub-block, exactly.

onnxruntime's block-wise kernels (MatMulNBits, QMoE) compute with (code - zero_point) * scale
per block along K, the code an unsigned 4- or 8-bit integer. Seven ggml types fit that form
without changing one decoded value (every product below is exact in float32, so
(code - zero_point) * scale is the very float32 ggml's dequantize gives):

| type    | bits | block | code          | zero point | scale             | min       |
| Q4_0    | 4    | 32    | q             | 8          | d                 | -         |
| Q8_0    | 8    | 32    | q + 128       | 128        | d                 | -         |
| Q4_K    | 4    | 32    | q             | 0          | d * sc            | dmin * m  |
| Q6_K    | 8    | 16    | q + 96        | 128        | d * sc            | -         |
| IQ2_XXS | 8    | 32    | 128 + g       | 128        | d * (0.5+ls) / 4  | -         |
| MXFP4   | 8    | 32    | 128 + 2 e2m1  | 128        | 2^(e - 128)       | -         |
| NVFP4   | 8    | 16    | 128 + 2 e2m1  | 128        | ue4m3(d) / 2      | -         |

Q4_K's value is d*sc*q - dmin*m: the min is not a zero point (a block with sc = 0 still has
one), so it stays a separate per-block term that the graph subtracts (exact_matmulnbits.py). The
MatMulNBits layout of linear layers moves most of it into a per-block zero point z =
round(dmin*m / (d*sc)), keeping the residual dmin*m - d*sc*z as the min (exact_layout.py,
center_mins): the same float32 values, at the same bytes (Q4_K's zero points are stored
anyway), and int8 activations then err as llama.cpp's do. IQ2_XXS's g
is a grid value (8, 25 or 43) with its sign. MXFP4's and NVFP4's code is the E2M1 value
doubled, an integer in [-12, 12] (ggml's kvalues_mxfp4), under the block's E8M0 half-scale
(one per 32) or UE4M3 half-scale (one per 16 of a 64-element superblock); ggml decodes them
as exactly this product. Their `.scale` sidecar (a per-tensor / per-expert output scale)
stays outside the layout (formats/weight.py, OutputScaled). Other types have no exact form
here: their values are not one integer code times one scale per power-of-two block (Q5_K,
Q3_K, IQ3, IQ4: codebooks or two-level scales whose product is not a block scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mobius_lite.formats.ggml.blocks import as_blocks
from mobius_lite.formats.ggml.types import GGML_TYPES, CodeForm


@dataclass(frozen=True)
class ExactCodes:
    """One weight [..., N, K] as codes: codes uint8 [..., N, K / block, block], scales float32
    [..., N, K / block], mins float32 [..., N, K / block] or None; value =
    (code - zero_point) * scale - min."""

    codes: np.ndarray
    scales: np.ndarray
    zero_point: int
    bits: int
    mins: np.ndarray | None = None

    @property
    def block_size(self) -> int:
        return int(self.codes.shape[-1])


# the types with an exact code form (their GGMLType rows' `exact`), in ggml's order
CODE_FORMS: dict[str, CodeForm] = {
    t.name: t.exact for t in GGML_TYPES.values() if t.exact is not None
}
EXACT_CODE_TYPES: tuple[str, ...] = tuple(CODE_FORMS)


def code_form(type_name: str) -> CodeForm | None:
    """The type's exact code form, or None when it has none."""
    return CODE_FORMS.get(type_name)


def exact_codes(type_name: str, data: np.ndarray) -> ExactCodes:
    """ggml rows uint8 [..., row_bytes] -> their exact code form (the row's CodeForm: its
    figures and its reader, code_readers.py).

    ValueError naming the type when it has none.
    """
    form = code_form(type_name)
    if form is None:
        raise ValueError(
            f"ggml {type_name} has no exact integer-code form; types with one: "
            f"{', '.join(EXACT_CODE_TYPES)}"
        )
    blocks = as_blocks(data, GGML_TYPES[type_name])  # [..., n_blocks, block_bytes]
    codes, scales, mins = form.read(blocks)
    lead = blocks.shape[:-2]
    codes = np.ascontiguousarray(codes, dtype=np.uint8).reshape(*lead, -1, form.block_size)
    scales = np.ascontiguousarray(scales, dtype=np.float32).reshape(*lead, -1)
    if mins is not None:
        mins = np.ascontiguousarray(mins, dtype=np.float32).reshape(*lead, -1)
    return ExactCodes(codes, scales, form.zero_point, form.bits, mins)
