"""The quantizing conversions: dense source bytes -> ggml blocks, while the writer streams.

`QuantizeBlocks` turns any whole number of 32-element blocks of a dense float tensor (float32,
float16, bfloat16) into Q8_0 / Q4_0 blocks with ggml's reference quantizer (ggml_rows.py);
`verify` recomputes them with gguf-py's own `gguf.quants.quantize`, written independently.
`ThenPart` follows it with one part of a lossless re-layout of those blocks (MatMulNBits B or
scales, an exact code layout's part), so a quantized tensor takes every route its ggml type
has, exactly as a GGUF tensor of that type does.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from mobius_lite.formats.ggml.types import GGMLType
from mobius_lite.formats.quantize.ggml_rows import QUANTIZERS
from mobius_lite.formats.storage import Bytes, Conversion


@cache
def _gguf_type(type_id: int) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType(type_id)


@dataclass(frozen=True)
class QuantizeBlocks:
    """Dense `source` elements, row-major, -> `type` blocks (rows of whole blocks)."""

    source: np.dtype
    type: GGMLType
    name: str = "quantize"

    @property
    def unit_bytes(self) -> int:
        return self.type.block_elements * self.source.itemsize

    @property
    def verbatim(self) -> bool:
        return False

    @property
    def part(self) -> str | None:
        return None

    def _values(self, raw: Bytes) -> np.ndarray:
        values = np.frombuffer(raw, dtype=self.source).astype(np.float32)
        return values.reshape(-1, self.type.block_elements)

    def convert(self, raw: Bytes) -> Bytes:
        blocks = QUANTIZERS[self.type.name](self._values(raw))
        return memoryview(np.ascontiguousarray(blocks).reshape(-1))

    def recompute(self, raw: Bytes) -> bytes:
        from gguf.quants import quantize  # gguf-py's quantizer: independent of ggml_rows.py

        values = np.array(np.frombuffer(bytes(raw), dtype=self.source), dtype=np.float32)
        return np.asarray(quantize(values.reshape(1, -1), _gguf_type(self.type.type_id))).tobytes()

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return (*stored[:-1], self.type.row_bytes(stored[-1]))


@dataclass(frozen=True)
class ThenPart:
    """`first` (a quantization), then `second` (a conversion of its blocks: one part of a
    re-layout). Units are whole units of `second`, counted in source bytes."""

    first: QuantizeBlocks
    second: Conversion

    @property
    def name(self) -> str:
        return f"{self.first.name}+{self.second.name}"

    @property
    def unit_bytes(self) -> int:
        blocks = self.second.unit_bytes // self.first.type.block_bytes
        return max(blocks, 1) * self.first.unit_bytes

    @property
    def verbatim(self) -> bool:
        return False

    @property
    def part(self) -> str | None:
        return self.second.part

    def convert(self, raw: Bytes) -> Bytes:
        return self.second.convert(self.first.convert(raw))

    def recompute(self, raw: Bytes) -> bytes:
        return self.second.recompute(self.first.recompute(raw))

    def converted_shape(self, stored: tuple[int, ...]) -> tuple[int, ...]:
        return self.second.converted_shape(self.first.converted_shape(stored))
