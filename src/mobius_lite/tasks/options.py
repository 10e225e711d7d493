"""What every task is asked to export with: precision, backend, dequantize, extra unused rules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mobius_lite.components.context import Activations, Backend
from mobius_lite.enums import Precision
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import NameMap
from mobius_lite.weights.binding import source_weight_formats


@dataclass(frozen=True)
class ExportOptions:
    """precision: weights and activations; backend: what packed formats emit; dequantize:
    every weight dense in `precision` instead; unused_rules: the source kind's deliberately
    unused tensors (name regex -> reason), beyond the model's own; activations: how packed
    matmuls and experts compute on onnxruntime's CPU kernels."""

    precision: Precision = Precision.F32
    backend: Backend = Backend.STANDARD
    dequantize: bool = False
    unused_rules: Mapping[str, str] = field(default_factory=dict)
    activations: Activations = Activations.EXACT  # the CPU kernel mode (--activations)

    def weight_formats(self, source: TensorSource, names: NameMap) -> Any:
        """The weight-format resolver for graphs bound through `names` (None: all dense)."""
        if self.dequantize:
            return None
        return source_weight_formats(source, names, self.precision.ir_dtype, self.backend)
