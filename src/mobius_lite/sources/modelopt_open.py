"""ModelOpt checkpoints: a safetensors checkpoint whose quantization config says which linear is
stored as NVFP4, FP8 or left dense.

`open_modelopt` parses and validates the quantization (config.json `quantization_config`
and/or hf_quant_config.json; both must agree) from the config files alone. The tensor index
(`ModelOptCheckpoint`) then checks every linear's stored tensors against it from the
safetensors headers (dtypes, shapes, missing / stray scales) and gives each quantized weight
the storage that proposes its weight format; no tensor data is read. Activation and KV-cache
scales are recorded as deliberately unused: the export is weight-only.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from mobius_lite.errors import ConfigError
from mobius_lite.formats.modelopt.quant_config import (
    E4M3,
    HF_QUANT_CONFIG,
    U8,
    ModelOptQuantization,
    QuantAlgo,
    check_tensors,
    module_aliases,
    parse_quantization,
)
from mobius_lite.formats.modelopt.storage import (
    dequantize_refusal,
    e4m3_scales,
    fp8_weights,
    nvfp4_codes,
    output_quantize_refusal,
)
from mobius_lite.formats.storage import Storage
from mobius_lite.sources.base import TensorInfo
from mobius_lite.sources.open import OpenedCheckpoint
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

MODELOPT = "modelopt"  # the source kind
WEIGHT = ".weight"
# tensor suffixes that only exist beside a quantized linear (longest first)
COMPANIONS = (".weight_scale_2", ".weight_scale", ".input_scale", ".k_scale", ".v_scale")
UNUSED_RULES = {
    r"\.input_scale$": "ModelOpt activation scale (W4A4 / W8A8 recipes): the export is "
    "weight-only, activations stay in the build's precision",
    r"\.[kv]_scale$": "ModelOpt KV-cache scale: the export is weight-only, the KV cache stays "
    "in the build's precision",
}


def is_modelopt(raw_config: dict[str, Any], directory: Path) -> bool:
    """config.json's quantization_config says quant_method "modelopt", or the directory has
    ModelOpt's hf_quant_config.json."""
    quant = raw_config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method == MODELOPT or (directory / HF_QUANT_CONFIG).is_file()


def open_modelopt(opened: OpenedCheckpoint, scopes: tuple[str, ...] = ()) -> OpenedCheckpoint:
    """The checkpoint as kind "modelopt": quantization validated now (config files only), the
    tensor index checked against it when opened (headers only); whether `--dequantize` can
    export it (FP8 and dense layers only) and whether `--quantize-output` alone can (a dense
    lm_head) are known now too. `scopes`: the prefixes a model holds its decoder under (an
    Omni checkpoint's `language_model.`), which the config's module names may leave off."""
    quantization = parse_quantization(opened.raw_config, _read_hf_quant_config(opened), scopes)
    if quantization is None:
        raise ConfigError(
            f"{opened.resolved.path}: looks like a ModelOpt checkpoint but neither config.json "
            f"nor {HF_QUANT_CONFIG} describes its quantization"
        )
    return replace(
        opened,
        kind=MODELOPT,
        open_tensors=partial(ModelOptCheckpoint, quantization=quantization),
        unused_rules={**opened.unused_rules, **UNUSED_RULES},
        dequantize_refusal=dequantize_refusal(quantization),
        output_quantize_refusal=output_quantize_refusal(quantization),
    )


def _read_hf_quant_config(opened: OpenedCheckpoint) -> dict[str, Any] | None:
    path = Path(opened.resolved.path) / HF_QUANT_CONFIG
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None


def linear_modules(
    source: SafetensorsCheckpoint, quantization: ModelOptQuantization
) -> dict[str, tuple[int, int]]:
    """Module -> logical (out, in) of every linear the checkpoint stores quantized or that the
    config names: packed weights (U8 / F8_E4M3), modules with scale tensors beside them, and
    MIXED_PRECISION's quantized_layers. Other linears are dense and need no check."""
    names = set(source.names())
    modules: set[str] = set()
    for name in names:
        suffix = next((s for s in COMPANIONS if name.endswith(s)), None)
        if suffix is not None:
            modules.add(name[: -len(suffix)])
        elif name.endswith(WEIGHT) and source.info(name).dtype in (U8, E4M3):
            modules.add(name[: -len(WEIGHT)])
    for module in quantization.layers:
        modules.update(
            a for a in module_aliases(module, quantization.scopes) if a + WEIGHT in names
        )
    return {m: _logical_shape(source, names, m) for m in sorted(modules)}


def _logical_shape(source: SafetensorsCheckpoint, names: set[str], module: str) -> tuple[int, int]:
    weight, scale = module + WEIGHT, module + ".weight_scale"
    if weight in names and len(shape := source.info(weight).shape) == 2:
        packed = source.info(weight).dtype == U8  # two E2M1 codes per byte
        return (shape[0], shape[1] * 2 if packed else shape[1])
    if scale in names and len(shape := source.info(scale).shape) == 2:  # the weight is missing
        return (shape[0], shape[1] * 16)
    return (0, 0)  # only its missing tensors will be reported


class ModelOptCheckpoint:
    """A ModelOpt safetensors checkpoint: SafetensorsCheckpoint's index and bytes, with NVFP4
    codes, their block scales and FP8 weights described by their ModelOpt storage."""

    kind = MODELOPT

    def __init__(self, path: str | Path, quantization: ModelOptQuantization) -> None:
        self.inner = SafetensorsCheckpoint(path)
        self.quantization = quantization
        modules = linear_modules(self.inner, quantization)
        check_tensors(quantization, self.inner, modules)  # headers only; one error per kind
        self._storages: dict[str, Storage] = {}
        for module in modules:
            algo = quantization.resolve(module)
            if algo is QuantAlgo.NVFP4:
                scale_2 = self.inner.info(module + ".weight_scale_2").shape
                self._storages[module + WEIGHT] = nvfp4_codes(scale_2)
                self._storages[module + ".weight_scale"] = e4m3_scales()
            elif algo is QuantAlgo.FP8:
                scale = self.inner.info(module + ".weight_scale").shape
                self._storages[module + WEIGHT] = fp8_weights(scale)

    @property
    def files(self) -> list[Path]:
        return self.inner.files

    def names(self) -> list[str]:
        return self.inner.names()

    def info(self, name: str) -> TensorInfo:
        info = self.inner.info(name)
        storage = self._storages.get(name)
        return info if storage is None else replace(info, storage=storage)

    def read(self, name: str) -> Any:
        return self.inner.read(name)

    def byte_range(self, name: str) -> tuple[Path, int, int]:
        return self.inner.byte_range(name)
