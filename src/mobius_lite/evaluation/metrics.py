"""Array comparison metrics; the gates are constants and nothing loosens them."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

# Release gates for a full model (LESSONS): all finite, NRMSE <= 0.03, cosine >= 0.999.
RELEASE_NRMSE = 0.03
RELEASE_COSINE = 0.999
# Tiny-model FP32 parity gates (foundation issue): NRMSE <= 1e-4, cosine >= 0.99999.
FP32_NRMSE = 1e-4
FP32_COSINE = 0.99999


@dataclass(frozen=True)
class Comparison:
    name: str
    shape: tuple[int, ...]
    finite: bool
    nrmse: float
    cosine: float
    max_abs: float

    def passes(self, nrmse_gate: float, cosine_gate: float) -> bool:
        return self.finite and self.nrmse <= nrmse_gate and self.cosine >= cosine_gate

    def as_dict(self) -> dict:
        return asdict(self)


def compare(name: str, actual: np.ndarray, expected: np.ndarray) -> Comparison:
    """NRMSE = ||a - e|| / ||e|| (relative L2), cosine similarity, max |a - e|; in float64.

    Shapes must match exactly. An all-zero reference compares equal only to all zeros
    (NRMSE 0, cosine 1).
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"{name}: shape {a.shape} vs reference {e.shape}")
    finite = bool(np.isfinite(a).all() and np.isfinite(e).all())
    if not finite:
        return Comparison(name, a.shape, False, float("inf"), -1.0, float("inf"))
    diff = a - e
    ref_norm = float(np.linalg.norm(e))
    act_norm = float(np.linalg.norm(a))
    diff_norm = float(np.linalg.norm(diff))
    if ref_norm > 0.0:
        nrmse = diff_norm / ref_norm
    else:  # an all-zero reference: equal only to all zeros
        nrmse = 0.0 if diff_norm == 0.0 else float("inf")
    if ref_norm == 0.0 and act_norm == 0.0:
        cosine = 1.0
    elif ref_norm == 0.0 or act_norm == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(a.ravel(), e.ravel()) / (act_norm * ref_norm))
    max_abs = float(np.abs(diff).max()) if diff.size else 0.0
    return Comparison(name, a.shape, True, nrmse, cosine, max_abs)


# The int8-activation route (`--activations int8`, issue 22) is not exact, so it has no fixed
# tolerance of its own: on the same (exactly block-quantized) weights, its error against a
# float64 reference must be no larger than llama.cpp's, whose CPU dot products quantize the
# activations to Q8_0 (32-block weight types) or Q8_K (256-block types) first. The allowance
# is the float32 accumulation a kernel adds on top (the FP32 parity gate's NRMSE), since the
# llama.cpp side is emulated with a float64 product.
INT8_FP32_ALLOWANCE = FP32_NRMSE


def int8_activation_gate(package: Comparison, llamacpp: Comparison) -> bool:
    """Whether an int8-activation result is as accurate as llama.cpp's on the same weights:
    both compared with one float64 reference; finite, NRMSE <= llama.cpp's + the float32
    allowance, cosine >= llama.cpp's - the same allowance."""
    return (
        package.finite
        and package.nrmse <= llamacpp.nrmse + INT8_FP32_ALLOWANCE
        and package.cosine >= llamacpp.cosine - INT8_FP32_ALLOWANCE
    )
