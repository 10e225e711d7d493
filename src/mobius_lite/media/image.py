"""The Omni image processor in numpy: what transformers' NemotronH_Omni image processor computes
(its torchvision backend does not import beside the local torch wheel, and a deployment has no
torch at all).

Steps, as the processor: pick the patch grid (`patch_grid`), resize in float32 with an
antialiased bicubic filter (torch's `interpolate(mode="bicubic", antialias=True)`, the kernel
torchvision uses for tensors: Keys cubic with a = -0.5, support widened by the downscale
factor, weights normalised), rescale by 1/255, normalise with the CLIP mean / std (or the
checkpoint's `norm_mean` / `norm_std`), and cut row-major, channel-major (C, p, p) patches.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import MobiusError
from mobius_lite.optional import require

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
PREPROCESSOR_FILE = "preprocessor_config.json"


@dataclass(frozen=True)
class ImageProcessorConfig:
    """The processor's settings (transformers' defaults; a package's preprocessor_config.json
    overrides them)."""

    patch_size: int = 16
    downsample_ratio: float = 0.5
    min_num_patches: int = 1024
    max_num_patches: int = 13312
    max_model_len: int = 16384
    rescale_factor: float = 1 / 255
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ImageProcessorConfig:
        mean = raw.get("image_mean", raw.get("norm_mean", CLIP_MEAN))
        std = raw.get("image_std", raw.get("norm_std", CLIP_STD))
        known = {f: raw[f] for f in cls.__dataclass_fields__ if f in raw}
        known.update(image_mean=tuple(mean), image_std=tuple(std))
        return cls(**known)

    @classmethod
    def from_package(cls, directory: str | Path) -> ImageProcessorConfig:
        path = Path(directory) / PREPROCESSOR_FILE
        return cls.from_dict(json.loads(path.read_text())) if path.is_file() else cls()

    @property
    def merge_size(self) -> int:
        return round(1 / self.downsample_ratio)


def patch_grid(
    height: int, width: int, config: ImageProcessorConfig, budget: int
) -> tuple[int, int]:
    """The (grid_height, grid_width) an image is resized to: near its own grid, scaled into
    [min_num_patches, budget], both sides multiples of merge_size."""
    p, m = config.patch_size, config.merge_size
    # Python's round(x + 0.5) (half to even) is the processor's own expression
    gh, gw = round(height / p + 0.5), round(width / p + 0.5)
    factor = min(math.sqrt(budget / (gh * gw)), 1.0)
    gh, gw = math.floor(factor * gh), math.floor(factor * gw)
    if budget > config.min_num_patches and gh * gw < config.min_num_patches:
        factor = math.sqrt(config.min_num_patches / (gh * gw))
        gh, gw = math.ceil(factor * gh), math.ceil(factor * gw)
    if remainder := gh % m:
        gh = gh + m - remainder if (gh + m - remainder) * gw <= budget else max(m, gh - remainder)
    if remainder := gw % m:
        gw = gw + m - remainder if gh * (gw + m - remainder) <= budget else max(m, gw - remainder)
    return gh, gw


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


def resize_weights(in_size: int, out_size: int) -> np.ndarray:
    """[out_size, in_size] float32 weights of the antialiased bicubic resize along one axis."""
    scale = in_size / out_size
    support = 2.0 * scale if scale >= 1 else 2.0
    inv = 1.0 / scale if scale >= 1 else 1.0
    weights = np.zeros((out_size, in_size), dtype=np.float64)
    for i in range(out_size):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), in_size)
        w = _cubic((np.arange(lo, hi) - center + 0.5) * inv)
        weights[i, lo:hi] = w / w.sum()
    return weights.astype(np.float32)


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """[C, H, W] float32 -> [C, height, width], separable antialiased bicubic (width first)."""
    rows = resize_weights(image.shape[1], height)
    cols = resize_weights(image.shape[2], width)
    horizontal = np.einsum("chw,xw->chx", image, cols)
    return np.einsum("yh,chx->cyx", rows, horizontal).astype(np.float32)


def to_patches(image: np.ndarray, patch: int) -> np.ndarray:
    """[C, H, W] -> [H/p * W/p, C * p * p], row-major patches, channel-major inside."""
    c, h, w = image.shape
    cut = image.reshape(c, h // patch, patch, w // patch, patch).transpose(1, 3, 0, 2, 4)
    return cut.reshape((h // patch) * (w // patch), c * patch * patch)


def preprocess(
    images: list[np.ndarray], config: ImageProcessorConfig
) -> tuple[np.ndarray, np.ndarray]:
    """RGB uint8 / float [H, W, 3] images -> (pixel_values [patches, 3 p p], image_grid_hw)."""
    m = config.merge_size
    budget = max((config.max_model_len - 4) * m * m, config.min_num_patches * len(images))
    if config.max_num_patches:
        budget = min(budget, config.max_num_patches)
    budget = max(budget, config.min_num_patches)
    mean = np.asarray(config.image_mean, np.float32)[:, None, None]
    std = np.asarray(config.image_std, np.float32)[:, None, None]
    patches, grids = [], []
    for array in images:
        if array.ndim != 3 or array.shape[2] != 3:
            raise MobiusError(f"an image must be [height, width, 3] RGB, found {array.shape}")
        image = np.ascontiguousarray(array.transpose(2, 0, 1), dtype=np.float32)
        gh, gw = patch_grid(image.shape[1], image.shape[2], config, budget)
        size = (gh * config.patch_size, gw * config.patch_size)
        if image.shape[1:] != size:
            image = resize(image, *size)
        image = (image * np.float32(config.rescale_factor) - mean) / std
        patches.append(to_patches(image, config.patch_size))
        grids.append((gh, gw))
    return np.concatenate(patches).astype(np.float32), np.array(grids, dtype=np.int64)


def load_image(path: str | Path) -> np.ndarray:
    """An image file as RGB uint8 [H, W, 3] (needs Pillow: the `runtime` extra)."""
    image_module = require("PIL.Image", "reading image files")
    try:
        with image_module.open(path) as image:
            return np.asarray(image.convert("RGB"))
    except (OSError, ValueError, SyntaxError) as exc:  # Pillow's decoders raise all three
        reason = str(exc) or type(exc).__name__
        raise MobiusError(f"{path}: not a readable image ({reason})") from None
