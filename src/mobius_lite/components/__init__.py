"""onnxscript.nn modules named like the transformers modules, so parameter paths mirror
checkpoint names."""

from mobius_lite.components.attention import Attention
from mobius_lite.components.linear import Embedding, Linear
from mobius_lite.components.mamba2 import Mamba2Mixer
from mobius_lite.components.mlp import ReLU2MLP
from mobius_lite.components.moe import MoE
from mobius_lite.components.norms import GatedGroupRMSNorm, RMSNorm

__all__ = [
    "Attention",
    "Embedding",
    "GatedGroupRMSNorm",
    "Linear",
    "Mamba2Mixer",
    "MoE",
    "RMSNorm",
    "ReLU2MLP",
]
