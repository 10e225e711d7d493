"""transformers' split Nemotron-H configs: model_type `nemotron_h_dense` (Mamba, attention and
MLP blocks: Nemotron-H, Nemotron-3-Nano-4B) and `nemotron_h_sparse` (Mamba, attention and MoE
blocks: the Nemotron 3 MoE models).

Their fields are NemotronHConfig's with the same names and meanings (read from transformers'
configuration_nemotron_h_dense.py / _sparse.py: the layer list is `hybrid_override_pattern`,
`layers_block_type` is accepted, `num_hidden_layers` is the pattern's length, the legacy
`mamba_*` names are accepted); each type admits only its own block kinds. transformers'
dense config has no multi-token-prediction head; its sparse config drops the head's fields
(the head is not modeled there), which a checkpoint's own config.json may still carry: they
are read as NemotronHConfig reads them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.enums import LayerKind
from mobius_lite.errors import ConfigError

DENSE_MODEL_TYPE = "nemotron_h_dense"
SPARSE_MODEL_TYPE = "nemotron_h_sparse"


@dataclass(frozen=True)
class _SplitConfig(NemotronHConfig):
    """A NemotronHConfig whose model type admits only `kinds`; `other` names the type that
    holds the kinds it refuses."""

    kinds: ClassVar[frozenset[LayerKind]] = frozenset()
    other: ClassVar[str] = ""

    def _validate(self) -> None:
        super()._validate()
        for i, kind in enumerate(self.layers_block_type):
            if kind not in self.kinds:
                allowed = ", ".join(sorted(f"{k.value} ({k.pattern_char})" for k in self.kinds))
                raise ConfigError(
                    f"model_type {self.model_type!r}: layer {i} is {kind.value} "
                    f"({kind.pattern_char}); this type holds only {allowed}. A checkpoint with "
                    f"{kind.value} blocks is model_type {self.other!r} or 'nemotron_h'"
                )

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> NemotronHConfig:
        if not isinstance(raw, dict):
            raise ConfigError(f"config must be a JSON object, found {type(raw).__name__}")
        return super().from_dict({**raw, "model_type": cls.model_type})


@dataclass(frozen=True)
class NemotronHDenseConfig(_SplitConfig):
    """model_type nemotron_h_dense: Mamba, attention and MLP blocks, no MTP head."""

    kinds: ClassVar[frozenset[LayerKind]] = frozenset(
        {LayerKind.MAMBA, LayerKind.ATTENTION, LayerKind.MLP}
    )
    other: ClassVar[str] = SPARSE_MODEL_TYPE
    model_type: str = DENSE_MODEL_TYPE

    def _validate_mtp(self) -> None:
        super()._validate_mtp()
        if self.num_nextn_predict_layers:
            raise ConfigError(
                f"model_type {DENSE_MODEL_TYPE!r} has no multi-token-prediction head "
                f"(transformers' dense config drops it), found num_nextn_predict_layers="
                f"{self.num_nextn_predict_layers}; a checkpoint with a head is "
                f"{SPARSE_MODEL_TYPE!r} or 'nemotron_h'"
            )


@dataclass(frozen=True)
class NemotronHSparseConfig(_SplitConfig):
    """model_type nemotron_h_sparse: Mamba, attention and MoE blocks (latent MoE too)."""

    kinds: ClassVar[frozenset[LayerKind]] = frozenset(
        {LayerKind.MAMBA, LayerKind.ATTENTION, LayerKind.MOE}
    )
    other: ClassVar[str] = DENSE_MODEL_TYPE
    model_type: str = SPARSE_MODEL_TYPE
