"""Q4_K blocks of given float values, written here from ggml's block_q4_K layout (gguf-py has
no Q4_K quantizer): realistic scales and mins (a centered weight's min near the middle of
the code range), where random bytes give arbitrary ones."""

from __future__ import annotations

import numpy as np


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def q4_k_quantize(values: np.ndarray) -> np.ndarray:
    """float values [..., K] (K a multiple of 256) -> Q4_K rows uint8 [..., K / 256 * 144].

    Per 32-block: min lo = min(x, 0), scale (max - lo) / 15; per super-block d = max scale /
    63, dmin = max(-lo) / 63 (fp16); sc, m the 6-bit nearest; q = round((x + dmin m) / (d sc))
    in 0..15. A plain min/max quantizer (llama.cpp searches further), the same block format.
    """
    lead, k = values.shape[:-1], values.shape[-1]
    x = values.astype(np.float32).reshape(-1, 8, 32)
    lo = np.minimum(x.min(-1), 0)
    scale = (x.max(-1) - lo) / np.float32(15)
    d = _f16(scale.max(-1) / 63)
    dmin = _f16((-lo).max(-1) / 63)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.clip(np.rint(np.where(d32 > 0, scale / d32, 0)), 0, 63).astype(np.uint8)
        m = np.clip(np.rint(np.where(dmin32 > 0, -lo / dmin32, 0)), 0, 63).astype(np.uint8)
        a, b = d32 * sc, dmin32 * m
        q = np.rint(np.where(a[..., None] > 0, (x + b[..., None]) / a[..., None], 0))
    q = np.clip(q, 0, 15).astype(np.uint8)  # [blocks, 8, 32]
    out = np.zeros((x.shape[0], 144), dtype=np.uint8)
    out[:, 0:2] = d.reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = dmin.reshape(-1, 1).view(np.uint8)
    # 12 scale bytes: sc / m of sub-blocks 0..3 in the low 6 bits of bytes 0..3 / 4..7, those
    # of 4..7 split into the low nibbles of bytes 8..11 and the top 2 bits of bytes 0..7
    out[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 8:12] = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    # 128 code bytes: byte 32c + l holds sub-block 2c's element l low, 2c + 1's high
    pairs = q.reshape(-1, 4, 2, 32)
    out[:, 16:] = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    return out.reshape(*lead, k // 256 * 144)
