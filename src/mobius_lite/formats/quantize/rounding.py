"""C's roundf in numpy float32, shared by ggml's quantizers and the MatMulNBits ones: both
round halves away from zero, where numpy's round and rint go to even."""

from __future__ import annotations

import numpy as np


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves go away from zero (numpy's rint goes to even). rint is roundf but at
    exact halves: x - rint(x) is exact in float32 (rint(x) is an integer within 0.5 of x), so
    the halves are found without rounding, and each is replaced by x + 0.5 sign(x), exact
    too, since x is k + 0.5 there."""
    rounded = np.rint(x)
    half = np.flatnonzero(np.abs(x - rounded) == np.float32(0.5))
    if half.size:
        flat, values = rounded.reshape(-1), x.reshape(-1)[half]
        flat[half] = values + np.copysign(np.float32(0.5), values)
    return rounded
