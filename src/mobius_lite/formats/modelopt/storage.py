"""How ModelOpt's packed tensors are stored, and which weight format each proposes.

The checkpoint keeps NVFP4 codes as safetensors U8 [N, K/2] and FP8 weights / NVFP4 block
scales as F8_E4M3; these storages are those dense element types (same name, same bytes, so the
manifest and `verify` see exactly the safetensors dtype and shape) plus what the graph needs to
know: the weight format a weight slot fed by the tensor computes with. Conversions are
verbatim: the bytes are written unchanged, into an initializer of the same element type (UINT8
codes, FLOAT8E4M3FN weights and scales); NVFP4 block scales may also be written as their raw
bytes (UINT8), which onnxruntime's CUDA NVFP4 kernel takes.

`--dequantize`: FP8 weights convert to dense float32 / float16 / bfloat16 by an exact cast of
their E4M3 values (every E4M3 value is one of those floats); their per-tensor weight_scale is
not part of it: the model's dequantize name map binds it as the slot's output scale
(formats/weight.py OutputScaled, models/nemotron_h_names.py). NVFP4 codes and block scales have
no dense conversion (one code decodes with its block scale and the global scale, three
tensors); `dequantize_refusal` says so from the config, before anything is read.
`--quantize-output` alone quantizes a dense lm_head (sources/quantized.py); a config that
stores lm_head packed is refused by `output_quantize_refusal`, from the config too.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.contrib import is_ort
from mobius_lite.formats.dense import DenseStorage, SameShape, Verbatim
from mobius_lite.formats.modelopt.fp8 import E4M3_VALUES
from mobius_lite.formats.modelopt.quant_config import (
    E4M3,
    MIXED_PRECISION,
    U8,
    ModelOptQuantization,
    QuantAlgo,
)
from mobius_lite.formats.modelopt.weight import FP8Weight, NVFP4Weight
from mobius_lite.formats.storage import Bytes, Conversion, Storage

# The dense types holding every E4M3 value exactly (4 exponent bits, 3 mantissa bits).
E4M3_EXACT_IN = frozenset(
    {np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)}
)
# E4M3_VALUES with the sign bit on its NaN patterns too (0xFF: -NaN), as ml_dtypes decodes them
SIGNED_E4M3_VALUES = np.copysign(E4M3_VALUES, np.where(np.arange(256) & 0x80, -1.0, 1.0)).astype(
    np.float32
)
NVFP4_DEQUANTIZE = (
    "NVFP4 weights have no dense conversion (a code decodes with its "
    "16-element block's E4M3 scale and the global weight_scale_2, not one scale per output); "
    "build without --dequantize (the graph decodes the packed weights, see docs/modelopt.md), "
    "or export the BF16 release instead"
)


def _refuse(what: str, target: Storage) -> RouteError:
    return RouteError(
        f"ModelOpt {what} export packed (verbatim bytes); there is no conversion to "
        f"{target.name}. " + NVFP4_DEQUANTIZE
    )


def dequantize_refusal(quantization: ModelOptQuantization) -> str | None:
    """Why `--dequantize` cannot export this checkpoint (one sentence naming what it holds and
    what to do), or None: only FP8 weights (and dense ones) dequantize. From the config alone,
    so the refusal comes before any weight is fetched or read."""
    if QuantAlgo.NVFP4 not in quantization.algorithms():
        return None
    if quantization.quant_algo != MIXED_PRECISION:
        return f"the ModelOpt checkpoint is {quantization.quant_algo}: " + NVFP4_DEQUANTIZE
    nvfp4 = sorted(m for m, s in quantization.layers.items() if s.algo is QuantAlgo.NVFP4)
    return (
        f"the ModelOpt MIXED_PRECISION checkpoint stores {len(nvfp4)} layer(s) as NVFP4 "
        f"(first: {nvfp4[0]}): " + NVFP4_DEQUANTIZE
    )


OUTPUT_MODULE = "lm_head"  # the output projection, as ModelOpt's configs name it


def output_quantize_refusal(quantization: ModelOptQuantization) -> str | None:
    """Why `--quantize-output` alone cannot quantize this checkpoint's lm_head (its config
    stores it as NVFP4 / FP8, so there is no dense lm_head to quantize), or None: the
    releases exclude lm_head, which stays in the checkpoint dtype (by any of its names: a
    multimodal checkpoint's sits under the quantization's scope). From the config alone,
    before any weight is fetched (sources/quantized.py refuses a packed tensor again)."""
    algo = quantization.resolve(OUTPUT_MODULE)
    if algo is QuantAlgo.NONE:
        return None
    return (
        f"the ModelOpt checkpoint stores {OUTPUT_MODULE} as {algo.value} (its quantization "
        "config does not exclude it); only a dense lm_head is quantized at export: build "
        "without --quantize-output"
    )


@dataclass(frozen=True)
class E4M3Cast(SameShape):
    """E4M3 values to a dense float type that holds each exactly (E4M3_EXACT_IN): lossless.

    convert decodes by the table built from the format's definition (fp8.E4M3_VALUES); verify's
    recompute by ml_dtypes' float8_e4m3fn conversion, an independent implementation. NaN bit
    patterns (0x7F / 0xFF) become NaN of that sign, which the writer reports as a non-finite
    weight.
    """

    target: np.dtype
    name: str = "cast"
    unit_bytes: int = 1

    def __post_init__(self) -> None:
        if self.target not in E4M3_EXACT_IN:
            raise RouteError(f"E4M3 values are not exact in {self.target.name}")

    @property
    def verbatim(self) -> bool:
        return False

    def convert(self, raw: Bytes) -> Bytes:
        values = SIGNED_E4M3_VALUES[np.frombuffer(raw, dtype=np.uint8)].astype(self.target)
        return memoryview(values.view(np.uint8))

    def recompute(self, raw: Bytes) -> bytes:
        codes = np.frombuffer(bytes(raw), dtype=ml_dtypes.float8_e4m3fn)
        return codes.astype(self.target).tobytes()


@dataclass(frozen=True)
class NVFP4CodeStorage(DenseStorage):
    """NVFP4 codes: uint8 [..., N, K/2], two E2M1 codes per byte (low nibble = even k).

    `scale_2_shape` is the per-linear shape of weight_scale_2 as stored (() or (1,)).
    """

    scale_2_shape: tuple[int, ...] = ()

    def conversion_to(self, target: Storage) -> Conversion:
        if isinstance(target, DenseStorage) and target.dtype == self.dtype:
            return Verbatim(1)
        raise _refuse("NVFP4 codes", target)

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> NVFP4Weight:
        """The format of a weight slot of logical shape [..., N, K] fed by these codes."""
        return NVFP4Weight(dtype, stacked, is_ort(backend) and not stacked, self.scale_2_shape)


@dataclass(frozen=True)
class FP8WeightStorage(DenseStorage):
    """FP8 weights: float8_e4m3fn [..., N, K]; `scale_shape` is weight_scale's stored shape.

    Written verbatim (packed), or, under --dequantize, cast exactly to a dense float type
    (E4M3Cast): the values before their weight_scale, which the graph applies to the output.
    """

    scale_shape: tuple[int, ...] = ()

    def conversion_to(self, target: Storage) -> Conversion:
        if isinstance(target, DenseStorage) and target.dtype == self.dtype:
            return Verbatim(1)
        if isinstance(target, DenseStorage) and target.dtype in E4M3_EXACT_IN:
            return E4M3Cast(target.dtype)
        raise RouteError(
            f"ModelOpt FP8 weights convert to FLOAT8E4M3FN (packed) or exactly to float32, "
            f"float16 or bfloat16 (--dequantize), not to {target.name}"
        )

    def weight_format(
        self, dtype: ir.DataType, backend: Backend, shape: tuple[int, ...], stacked: bool
    ) -> FP8Weight:
        return FP8Weight(dtype, stacked, is_ort(backend) and not stacked, self.scale_shape)


@dataclass(frozen=True)
class E4M3ScaleStorage(DenseStorage):
    """NVFP4 block scales: float8_e4m3fn [..., N, K/16]; written as FLOAT8E4M3FN, or as the
    same bytes typed UINT8 (the CUDA kernel's input type)."""

    def conversion_to(self, target: Storage) -> Conversion:
        if isinstance(target, DenseStorage) and target.dtype in (self.dtype, U8):
            return Verbatim(1)  # UINT8: the stored bits, reinterpreted, not a value cast
        raise _refuse("NVFP4 block scales", target)


def nvfp4_codes(scale_2_shape: tuple[int, ...]) -> NVFP4CodeStorage:
    return NVFP4CodeStorage(U8, tuple(scale_2_shape))


def fp8_weights(scale_shape: tuple[int, ...]) -> FP8WeightStorage:
    return FP8WeightStorage(E4M3, tuple(scale_shape))


def e4m3_scales() -> E4M3ScaleStorage:
    return E4M3ScaleStorage(E4M3)
