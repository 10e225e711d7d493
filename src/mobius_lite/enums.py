"""The one vocabulary of layer kinds, state roles, graphs, tasks, dtypes, backends and
activation modes, shared across the package."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from mobius_lite import io_contract


class LayerKind(str, enum.Enum):
    """What a Nemotron-H block mixes with. Values are the transformers 5.x spellings."""

    MAMBA = "mamba"
    ATTENTION = "attention"
    MLP = "mlp"
    MOE = "moe"

    @property
    def pattern_char(self) -> str:
        """The character hybrid_override_pattern uses for this kind."""
        return {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}[self.value]

    @property
    def states(self) -> tuple[StateRole, ...]:
        """The cache tensors a layer of this kind carries between decode steps."""
        if self is LayerKind.MAMBA:
            return (StateRole.CONV, StateRole.RECURRENT)
        if self is LayerKind.ATTENTION:
            return (StateRole.KEY, StateRole.VALUE)
        return ()


class StateRole(str, enum.Enum):
    """One cache tensor of a layer; the value is the suffix in past_key_values.{i}.<suffix>."""

    KEY = "key"
    VALUE = "value"
    CONV = "conv_state"
    RECURRENT = "recurrent_state"

    def past_name(self, layer: int | str) -> str:
        return io_contract.past_name(layer, self.value)

    def present_name(self, layer: int | str) -> str:
        return io_contract.present_name(layer, self.value)

    def window_name(self, layer: int | str) -> str:
        """The decoder output holding this state after each position of a short call
        (Mamba states of a speculative verifying call, components/state_window.py)."""
        return io_contract.window_name(layer, self.value)


class RecurrenceInput(str, enum.Enum):
    """What a Mamba layer's verifying call returns per position so that the runtime can
    re-derive its states after any prefix (components/state_window.py, run/state_rewind.py):
    the conv's input channels and the SSD recurrence's key, value and decay. The value is the
    suffix in window_input.{layer}.<suffix>."""

    CONV_INPUT = "conv_input"
    KEY = "key"
    VALUE = "value"
    DECAY = "decay"

    def window_name(self, layer: int | str) -> str:
        """The decoder output holding this input at each position of a short call."""
        return io_contract.window_input_name(layer, self.value)


class GraphRole(str, enum.Enum):
    """One graph of a package; the value is its key in manifest.json and genai_config.json."""

    DECODER = "decoder"
    EMBEDDING = "embedding"
    VISION_ENCODER = "vision_encoder"
    VIDEO_ENCODER = "video_encoder"
    AUDIO_ENCODER = "audio_encoder"
    MTP = "mtp"  # the multi-token-prediction draft head (docs/decoder_contract.md)

    @property
    def file_name(self) -> str:
        """The graph's file in the package: the one place these names are written."""
        # The decoder keeps onnxruntime-genai's default name.
        return "model.onnx" if self is GraphRole.DECODER else f"{self.value}.onnx"


@dataclass(frozen=True)
class GraphId:
    """Which graph of a package: its role, and for the MTP head of distinct depths
    (mtp_use_repeated_layer false) which depth. Depth 0 is the role's own graph (mtp.onnx,
    the one onnxruntime-genai runs); depth j >= 1 of the head is `mtp_depth{j}`
    (mtp_depth{j}.onnx). Names are only ever made from this object, never read back."""

    role: GraphRole
    depth: int = 0

    def __post_init__(self) -> None:
        if self.depth < 0 or (self.depth and self.role is not GraphRole.MTP):
            raise ValueError(f"{self.role.value} has no depth {self.depth}")

    @property
    def key(self) -> str:
        """The graph's key in manifest.json."""
        return self.role.value if not self.depth else f"{self.role.value}_depth{self.depth}"

    @property
    def file_name(self) -> str:
        """The graph's file in the package."""
        return self.role.file_name if not self.depth else f"{self.key}.onnx"


class Backend(str, enum.Enum):
    """Which operators the graphs may emit: packed formats' kernels, and the Mamba mixer's."""

    STANDARD = "standard"  # standard ONNX ops only: runs on any execution provider
    # onnxruntime's com.microsoft contrib ops where they fit: packed-weight kernels, and the
    # native CPU kernels of the Mamba conv and SSD recurrence (components/mamba2.py)
    ORT = "ort"


class Activations(str, enum.Enum):
    """How packed matmuls and experts compute on onnxruntime's CPU kernels (`--activations`).

    EXACT keeps today's routes. EXACT_FUSED moves them onto the fused kernels where the result
    stays exact within f32 rounding: MatMulNBits at accuracy 0 over the exact code layouts
    (formats/ggml/relayout/exact_codes.py), experts on the com.microsoft MoE (f32) / QMoE (4-bit,
    accuracy 0) kernels in their SwiGLU form of ReLU^2. INT8 puts every packed matmul on
    MatMulNBits at accuracy 4 and every packed MoE on QMoE: the kernels quantize the
    activations to int8 per block, as llama.cpp does for these types (not exact; gated by
    evaluation.metrics.int8_activation_gate).
    """

    EXACT = "exact"
    EXACT_FUSED = "exact-fused"
    INT8 = "int8"

    @property
    def accuracy_level(self) -> int:
        """MatMulNBits' / QMoE's accuracy_level: 4 (int8 activations) or 0 (f32)."""
        return 4 if self is Activations.INT8 else 0


class DraftHead(str, enum.Enum):
    """How the MTP head (the speculative draft model) computes (`--draft-head`).

    EXACT builds it on the decoder's routes. FAST computes its projections (the lm_head among
    them) with int8 activations (MatMulNBits accuracy_level 4): packed ones over the same
    stored weights, dense ones over int8 blocks made when the head's session is created
    (graphs/draft_int8.py). Drafts are cheaper and may differ, which changes how many are
    accepted, never the tokens (the decoder verifies every one).
    """

    EXACT = "exact"
    FAST = "fast"


class Task(str, enum.Enum):
    """What a package is for; each model type exports exactly one (configs/model_types.py)."""

    TEXT_GENERATION = "text-generation"
    IMAGE_TEXT_TO_TEXT = "image-text-to-text"


class Precision(str, enum.Enum):
    """Element type of the exported weights and activations."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"

    @property
    def ir_dtype(self) -> ir.DataType:
        return {
            "f32": ir.DataType.FLOAT,
            "f16": ir.DataType.FLOAT16,
            "bf16": ir.DataType.BFLOAT16,
        }[self.value]

    @property
    def numpy_dtype(self) -> np.dtype:
        return self.ir_dtype.numpy()

    @property
    def numpy_name(self) -> str:
        """numpy / torch spelling (float32, float16, bfloat16), as configs write dtypes."""
        return self.numpy_dtype.name

    @classmethod
    def from_numpy_name(cls, name: str) -> Precision:
        """float32 / float16 / bfloat16 -> Precision (KeyError for anything else)."""
        return {p.numpy_name: p for p in cls}[name]

    @classmethod
    def parse(cls, value: str | Precision) -> Precision:
        """Accept f32/f16/bf16 and the common long spellings (float32, float16, bfloat16)."""
        if isinstance(value, Precision):
            return value
        aliases = {
            "float32": "f32",
            "fp32": "f32",
            "float": "f32",
            "float16": "f16",
            "fp16": "f16",
            "half": "f16",
            "bfloat16": "bf16",
        }
        key = aliases.get(str(value).lower(), str(value).lower())
        try:
            return cls(key)
        except ValueError:
            from mobius_lite.errors import RouteError

            raise RouteError(
                f"dtype {value!r} is not supported; choose one of f32, f16, bf16."
            ) from None
