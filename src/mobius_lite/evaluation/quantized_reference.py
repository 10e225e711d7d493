"""qualify's reference for a package quantized at export (`--quantize`, docs/quantize.md).

The graph is held to transformers running the weights its blocks stand for: the source
checkpoint with every tensor the manifest records as quantized replaced by its dequantized
value, computed apart from the export's own code:
- q8_0 / q4_0: gguf-py's `gguf.quants.quantize`, then `gguf.quants.dequantize`;
- int4 / int8: onnxruntime's `quantize_matmul_4bits` / `_8bits` (the quantizer onnxruntime-
  genai's builder calls), decoded as MatMulNBits defines it, (code - zero point) * scale.
The copy is written as one FP32 safetensors file beside the config (as GGUF sources are,
dense_reference.py), and removed afterwards. The quantization's own error is then the package
against the unquantized source, which qualify reports as a separate, ungated figure.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.formats.quantize.recipe import QuantType, Recipe
from mobius_lite.layout import CONFIG_FILE
from mobius_lite.source_kinds import local_tensors

# the file name of a reference checkpoint written for the transformers reference
DENSE_FILE = "model.safetensors"


def dequantized(values: np.ndarray, recipe: Recipe) -> np.ndarray:
    """float32 [..., K] -> the values `recipe`'s quantization of it stands for."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    if recipe.type.is_ggml:
        import gguf

        qtype = gguf.GGMLQuantizationType[recipe.type.value.upper()]
        blocks = gguf.quants.quantize(x, qtype)
        return np.asarray(gguf.quants.dequantize(blocks, qtype), np.float32).reshape(x.shape)
    rows = x.reshape(-1, x.shape[-1])
    return _nbits_dequantized(rows, recipe).reshape(x.shape)


def _nbits_dequantized(rows: np.ndarray, recipe: Recipe) -> np.ndarray:
    from onnxruntime.capi import _pybind_state as ort_c

    n, k = rows.shape
    bits, block = recipe.type.bits, recipe.block
    k_blocks = k // block
    b = np.zeros((n, k_blocks, block * bits // 8), np.uint8)
    zero = np.zeros((n, (k_blocks * bits + 7) // 8), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    quantize = (
        ort_c.quantize_matmul_8bits
        if recipe.type is QuantType.INT8
        else (ort_c.quantize_matmul_4bits)
    )
    quantize(b, np.ascontiguousarray(rows.T), scales, zero, block, n, k, recipe.symmetric)
    if bits == 4:
        codes = np.stack([b & 15, b >> 4], axis=-1).reshape(n, k_blocks, block)
        zp = np.stack([zero & 15, zero >> 4], axis=-1).reshape(n, -1)[:, :k_blocks]
    else:
        codes, zp = b, zero
    if recipe.symmetric:
        zp = np.full((n, k_blocks), 1 << (bits - 1))
    return ((codes.astype(np.float32) - zp[..., None]) * scales[..., None]).reshape(n, k)


def write_dequantized_checkpoint(
    source: Path,
    recipes: dict[str, Recipe],
    raw_config: dict[str, Any],
    workdir: Path,
    keep: Callable[[str], bool] | None = None,
) -> Path:
    """`source` with each tensor of `recipes` dequantized, as an FP32 checkpoint in `workdir`
    (`keep`: only the tensors whose name it accepts)."""
    from safetensors.numpy import save_file

    tensors = local_tensors(source)
    out: dict[str, np.ndarray] = {}
    for name in tensors.names():
        if keep is not None and not keep(name):
            continue
        values = np.asarray(tensors.read(name), dtype=np.float32)
        recipe = recipes.get(name)
        out[name] = dequantized(values, recipe) if recipe is not None else values
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / CONFIG_FILE).write_text(json.dumps(raw_config, indent=2))
    save_file(out, str(workdir / DENSE_FILE))
    return workdir
