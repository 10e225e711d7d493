"""round_half_away is C's roundf on float32: checked against roundf's definition computed in
float64 (sign(x) * floor(|x| + 0.5), exact there), at every half k + 0.5 and its float32
neighbours (where ties-to-even and float32 additions go wrong), and on random values."""

from __future__ import annotations

import numpy as np

from mobius_lite.formats.quantize.rounding import round_half_away


def _roundf(x: np.ndarray) -> np.ndarray:
    wide = x.astype(np.float64)
    return (np.sign(wide) * np.floor(np.abs(wide) + 0.5)).astype(np.float32)


def test_halves_and_their_neighbours() -> None:
    halves = np.arange(-300, 300, dtype=np.float32) + np.float32(0.5)
    below = np.nextafter(halves, np.float32(-np.inf))
    above = np.nextafter(halves, np.float32(np.inf))
    tiny = np.array([0.0, -0.0, 0.49999997, -0.49999997, 1e-30, -1e-30], dtype=np.float32)
    x = np.concatenate([halves, below, above, tiny])
    np.testing.assert_array_equal(round_half_away(x), _roundf(x))


def test_random_values_and_shapes() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 3, 32)) * 100).astype(np.float32)
    x[0, 0, :4] = [2.5, -2.5, 3.5, -3.5]  # ties numpy's rint sends to even
    np.testing.assert_array_equal(round_half_away(x), _roundf(x))
    assert round_half_away(x).shape == x.shape
