"""Per-layer specs: the resolved topology of one block, with that block's own sizes.

Everything downstream (components, cache contract, genai_config, tests) reads sizes from
these; nothing re-derives them from the raw config.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from mobius_lite.enums import LayerKind, Precision


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba2 mixer: in_proj, causal conv, SSD recurrence, gated group RMSNorm, out_proj."""

    num_heads: int
    head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int
    use_conv_bias: bool
    use_bias: bool
    chunk_size: int
    time_step_limit: tuple[float, float]
    norm_epsilon: float
    ssm_cache_dtype: str

    @property
    def ssm_cache_ir_dtype(self) -> ir.DataType:
        """Element type of the recurrent state (FP32 unless the config says otherwise)."""
        return Precision.from_numpy_name(self.ssm_cache_dtype).ir_dtype

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.ssm_state_size

    @property
    def in_proj_size(self) -> int:
        return self.intermediate_size + self.conv_dim + self.num_heads


@dataclass(frozen=True)
class AttentionSpec:
    """Causal GQA self-attention without positional embedding."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MLPSpec:
    """up_proj -> ReLU^2 -> down_proj."""

    intermediate_size: int
    bias: bool


@dataclass(frozen=True)
class MoESpec:
    """Sigmoid-routed ReLU^2 experts with optional latent projections and a shared expert."""

    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_intermediate_size: int
    n_shared_experts: int
    latent_size: int | None
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    bias: bool

    @property
    def has_shared_expert(self) -> bool:
        return self.n_shared_experts > 0


MixerSpec = MambaSpec | AttentionSpec | MLPSpec | MoESpec


# The cache scope of the multi-token-prediction head's blocks: past_key_values.mtp.{i}.key
MTP_SCOPE = "mtp"


@dataclass(frozen=True)
class LayerSpec:
    """One block of the decoder (or of the MTP head, scope "mtp"): pre-norm, one mixer of
    `kind`, residual add."""

    index: int
    kind: LayerKind
    mixer: MixerSpec
    scope: str | None = None  # None: a decoder layer; MTP_SCOPE: the head's block `index`

    @property
    def cache_layer(self) -> int | str:
        """The layer part of this block's cache names: the decoder's global index, or
        "mtp.{index}" for the head's block."""
        return self.index if self.scope is None else f"{self.scope}.{self.index}"

    @property
    def mamba(self) -> MambaSpec:
        assert isinstance(self.mixer, MambaSpec), self
        return self.mixer

    @property
    def attention(self) -> AttentionSpec:
        assert isinstance(self.mixer, AttentionSpec), self
        return self.mixer

    @property
    def mlp(self) -> MLPSpec:
        assert isinstance(self.mixer, MLPSpec), self
        return self.mixer

    @property
    def moe(self) -> MoESpec:
        assert isinstance(self.mixer, MoESpec), self
        return self.mixer
