"""How ModelOpt's packed tensors are stored, and which weight format each proposes.

The checkpoint keeps NVFP4 codes as safetensors U8 [N, K/2] and FP8 weights / NVFP4 block
scales as F8_E4M3; these storages are those dense element types (same name, same bytes, so the
manifest and `verify` see exactly the safetensors dtype and shape) plus what the graph needs to
know: the weight format a weight slot fed by the tensor computes with. Conversions are
verbatim: the bytes are written unchanged, into an initializer of the same element type (UINT8
codes, FLOAT8E4M3FN weights and scales); NVFP4 block scales may also be written as their raw
bytes (UINT8), which onnxruntime's CUDA NVFP4 kernel takes. Any other target (dense floats:
`--dequantize`) is refused: one tensor of a packed linear cannot be decoded without the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import RouteError
from mobius_lite.formats.contrib import is_ort
from mobius_lite.formats.dense import DenseStorage, Verbatim
from mobius_lite.formats.modelopt.quant_config import E4M3, U8
from mobius_lite.formats.modelopt.weight import FP8Weight, NVFP4Weight
from mobius_lite.formats.storage import Conversion, Storage


def _refuse(what: str, target: Storage) -> RouteError:
    return RouteError(
        f"ModelOpt {what} export packed (verbatim bytes); there is no conversion to dense "
        f"{target.name}: a packed linear decodes from several tensors. Export without "
        "--dequantize (the graph decodes the weights), or export the BF16 release instead"
    )


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
    """FP8 weights: float8_e4m3fn [..., N, K]; `scale_shape` is weight_scale's stored shape."""

    scale_shape: tuple[int, ...] = ()

    def conversion_to(self, target: Storage) -> Conversion:
        if isinstance(target, DenseStorage) and target.dtype == self.dtype:
            return Verbatim(1)
        raise _refuse("FP8 weights", target)

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
