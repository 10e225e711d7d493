"""IQ codebook tables: grids, sign patterns and non-linear values (ggml's IQ lookup tables).

The tables are ggml's (ggml-common.h: iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid,
iq3s_grid, iq1s_grid, ksigns_iq2xs, kvalues_iq4nl). They are read at import time from the
installed gguf package (gguf.quants keeps them as packed hex strings that unpack to the same
bytes); the two float32 sign tables are derived here for the graph decodes, which look them
up with Gather.
"""

from __future__ import annotations

import gguf.quants
import numpy as np

from mobius_lite.formats.ggml.blocks import sign_bits


def _readonly(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


def _gguf_grid(class_name: str, dtype: type[np.generic]) -> np.ndarray:
    """One grid as gguf-py unpacks it ([entries, values] float32), as ggml's element type."""
    cls = getattr(gguf.quants, class_name)
    cls.init_grid()
    grid = np.asarray(cls.grid).reshape(cls.grid_shape)
    out = grid.astype(dtype)
    if not np.array_equal(out.astype(np.float32), grid):
        raise ValueError(f"gguf's {class_name} grid does not hold {np.dtype(dtype).name} values")
    return _readonly(out)


# Each row is one grid entry: the 8 (IQ2, IQ1) or 4 (IQ3) values a grid index stands for.
IQ2XXS_GRID: np.ndarray = _gguf_grid("IQ2_XXS", np.uint8)  # [256, 8], values 8, 25, 43
IQ2XS_GRID: np.ndarray = _gguf_grid("IQ2_XS", np.uint8)  # [512, 8]
IQ2S_GRID: np.ndarray = _gguf_grid("IQ2_S", np.uint8)  # [1024, 8]
IQ3XXS_GRID: np.ndarray = _gguf_grid("IQ3_XXS", np.uint8)  # [256, 4], values 4 ... 62
IQ3S_GRID: np.ndarray = _gguf_grid("IQ3_S", np.uint8)  # [512, 4], values 1, 3, ..., 15
IQ1S_GRID: np.ndarray = _gguf_grid("IQ1_S", np.int8)  # [2048, 8], values -1, 0, 1 (also IQ1_M)

# ksigns_iq2xs: a 7-bit index -> 8 sign bits (bit j set: value j is negative); the eighth bit
# makes the number of negatives even.
KSIGNS_IQ2XS: np.ndarray = _readonly(np.frombuffer(gguf.quants.IQ2_XXS.ksigns, dtype=np.uint8))
KVALUES_IQ4NL: np.ndarray = _readonly(np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.int8))
IQ1S_DELTA = 0.125  # IQ1S_DELTA: the shift added to every IQ1_S / IQ1_M grid value


# Graph tables (+1 / -1 float32 rows): the sign pattern of a 7-bit ksigns index, and of a raw
# sign byte (IQ2_S, IQ3_S).
KSIGNS_F32: np.ndarray = _readonly(sign_bits(KSIGNS_IQ2XS))  # [128, 8]
SIGN_BYTE_F32: np.ndarray = _readonly(sign_bits(np.arange(256, dtype=np.uint8)))  # [256, 8]
