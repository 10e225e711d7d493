"""What every task is asked to export with (precision, backend, dequantize, extra unused rules,
activation mode) and what it gives back (the package's graphs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mobius_lite.components.context import BuildContext
from mobius_lite.components.state_window import DEFAULT_WINDOW
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import Activations, Backend, DraftHead, Precision
from mobius_lite.formats.weight import WeightFormatResolver
from mobius_lite.package import GraphRecord
from mobius_lite.sources.base import TensorSource
from mobius_lite.sources.names import NameMap
from mobius_lite.weights.binding import CONFIG_JSON_HINT, source_weight_formats


@dataclass(frozen=True)
class ExportOptions:
    """precision: weights and activations; backend: what packed formats emit; dequantize:
    every weight dense in `precision` instead; unused_rules: the source kind's deliberately
    unused tensors (name regex -> reason), beyond the model's own; activations: how packed
    matmuls and experts compute on onnxruntime's CPU kernels; binding_hint: what a binding
    error tells the user to check for this source."""

    precision: Precision = Precision.F32
    backend: Backend = Backend.STANDARD
    dequantize: bool = False
    unused_rules: Mapping[str, str] = field(default_factory=dict)
    activations: Activations = Activations.EXACT  # the CPU kernel mode (--activations)
    binding_hint: str = CONFIG_JSON_HINT  # the last sentence of a binding error
    quantized: bool = False  # the source quantizes tensors at export (sources/quantized.py)
    # per-position Mamba states of short calls (components/state_window.py): None gives
    # packages with an MTP head the default window and others none; 0 turns it off
    state_window: int | None = None
    draft_head: DraftHead = DraftHead.EXACT  # the MTP head's route (--draft-head)
    # the decoder's windows from onnxruntime's state_window attribute (ort backend, CUDA)
    state_window_kernel: bool = False

    def speculation_window(self, head: bool) -> int:
        """The decoder's speculation window: the options' own, or the default when the
        package has a head to draft with (0 without one)."""
        if self.state_window is not None:
            return self.state_window
        return DEFAULT_WINDOW if head else 0

    def weight_formats(self, source: TensorSource, names: NameMap) -> WeightFormatResolver:
        """The weight-format resolver for graphs bound through `names`: packed formats unless
        dequantizing (output scales stay either way, see formats.weight.OutputScaled)."""
        return source_weight_formats(
            source, names, self.precision.ir_dtype, self.backend, packed=not self.dequantize
        )

    def build_context(
        self, source: TensorSource, names: NameMap, mamba_a: str = "A_log"
    ) -> BuildContext:
        """The BuildContext of graphs bound to `source` through `names`: the options'
        precision, backend and activation mode, each weight in the format its source tensor
        proposes."""
        formats = self.weight_formats(source, names)
        return BuildContext(
            self.precision.ir_dtype, formats, self.backend, mamba_a, self.activations
        )


@dataclass(frozen=True)
class TaskGraphs:
    """A task's export: the decoder's config, the graphs bound to the source, the source
    tensors several graphs share, and the config.json the package carries (None: the
    decoder config's own)."""

    decoder: NemotronHConfig
    graphs: list[GraphRecord]
    shared: dict[str, list[str]] = field(default_factory=dict)
    config_json: dict[str, Any] | None = None
