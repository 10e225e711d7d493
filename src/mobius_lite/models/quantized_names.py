"""The name map of a source quantized at export: its own, plus the re-layout parts.

A quantized tensor computes with its type's routes, some of which split it into several
parameters: MatMulNBits' `<slot>_nbits_b` / `_nbits_scales` and the exact code layouts' parts
for `--activations` (formats/ggml/weight.py, relayout_part.py) for q8_0 / q4_0, and always
`<slot>_q_b`, `_q_scales`, `_q_zero_points` for int4 / int8 (formats/quantize/nbits.py). Each
such parameter is fed by the slot's own source tensor through its quantization followed by
that part's lossless re-layout, as a GGUF tensor of the same type feeds it through the
re-layout alone.
"""

from __future__ import annotations

from collections.abc import Callable

from mobius_lite.errors import CheckpointError
from mobius_lite.formats.ggml.relayout_part import ROW_REPEAT, exact_relayout, split_suffix
from mobius_lite.formats.ggml.storage import RelayoutPart
from mobius_lite.formats.ggml.weight import NBITS_PARTS
from mobius_lite.formats.quantize.conversion import ThenPart
from mobius_lite.formats.quantize.nbits import NBitsQuantize, NBitsStorage
from mobius_lite.formats.quantize.nbits_weight import PART_SUFFIXES
from mobius_lite.formats.quantize.storage import QuantizedStorage
from mobius_lite.formats.storage import Conversion
from mobius_lite.sources.base import TensorInfo
from mobius_lite.sources.names import Candidate, NameMap, SourceRef, as_ref

Layout = Callable[[Conversion, TensorInfo], Conversion]


def quantized_part(part: str, kind: str | None) -> Layout:
    """The conversion of one re-layout part of a quantized tensor: quantize, then cut."""

    def layout(conversion: Conversion, info: TensorInfo) -> Conversion:
        storage = info.storage
        if isinstance(storage, NBitsStorage) and isinstance(conversion, NBitsQuantize):
            if kind is None:  # MatMulNBits' own parts
                return conversion.with_part(part)
            return conversion.with_part(part, ROW_REPEAT[kind], flat=True)  # a QMoE operand
        if not isinstance(storage, QuantizedStorage):
            raise CheckpointError(f"{info.name} is not quantized at export; it has no {part}")
        ggml = storage.recipe.ggml
        if kind is None:
            return ThenPart(storage.quantize(), RelayoutPart(ggml, part))
        row_bytes = ggml.row_bytes(info.shape[-1])
        relayout = exact_relayout(ggml, kind, part, row_bytes, tuple(info.shape))
        return ThenPart(storage.quantize(), relayout)

    return layout


def split_part(target: str) -> tuple[str, str, str | None] | None:
    """(slot, part, kind) of a re-layout part's parameter name; None for any other."""
    for suffix, part in {**NBITS_PARTS, **PART_SUFFIXES}.items():
        if target.endswith(suffix):
            return target.removesuffix(suffix), part, None
    exact = split_suffix(target)
    if exact is not None:
        slot, kind, part = exact
        return slot, part, kind
    return None


class QuantizedNames:
    """`base` (the source's own name map), with each re-layout part of a slot mapped to the
    slot's source tensor through `quantized_part`."""

    def __init__(self, base: NameMap) -> None:
        self.base = base

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        split = split_part(target)
        if split is None:
            return self.base.alternatives(target, shape)
        slot, part, kind = split
        out: list[Candidate] = []
        for candidate in self.base.alternatives(slot, shape):
            ref = as_ref(candidate)
            out.append(SourceRef(ref.names, ref.reshape, ref.concat, quantized_part(part, kind)))
        return out
