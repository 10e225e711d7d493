"""Config reading: released and transformers layouts, legacy names, validation errors, and
direct construction giving the same graph and cache ABI as reading config.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx_ir as ir
import pytest
from transformers import NemotronHConfig as HFConfig

from mobius_lite.components.context import BuildContext
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind, StateRole
from mobius_lite.errors import ConfigError
from mobius_lite.graphs.cache import cache_tensors
from mobius_lite.graphs.decoder import build_decoder
from reference_fixtures.nemotron_reference import TINY_BASE

SMALL = TINY_BASE

# A config as NVIDIA released Nemotron-H checkpoints: legacy names, pattern string,
# infinity encoded as an object.
RELEASED = {
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "vocab_size": 64,
    "hidden_size": 32,
    "hybrid_override_pattern": "M-M*E",
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
    "ssm_state_size": 8,
    "mamba_num_heads": 4,
    "mamba_head_dim": 8,
    "mamba_n_groups": 2,
    "mamba_d_conv": 3,
    "mamba_chunk_size": 16,
    "mamba_dt_limit": [0.0, {"__float__": "Infinity"}],
    "mamba_ssm_cache_dtype": "float32",
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 24,
    "time_step_min": 0.001,
    "tie_word_embeddings": False,
    "layer_norm_epsilon": 1e-5,
}


def graph_bytes(config: NemotronHConfig) -> bytes:
    model, _ = build_decoder(config)
    return ir.serde.serialize_model(model).SerializeToString()


def test_released_layout_with_legacy_names() -> None:
    config = NemotronHConfig.from_dict(RELEASED)
    assert config.pattern == "M-M*E"
    assert [layer.kind for layer in config.layers] == [
        LayerKind.MAMBA,
        LayerKind.MLP,
        LayerKind.MAMBA,
        LayerKind.ATTENTION,
        LayerKind.MOE,
    ]
    mamba = config.layers[0].mamba
    assert (mamba.n_groups, mamba.conv_kernel, mamba.chunk_size) == (2, 3, 16)
    assert mamba.time_step_limit == (0.0, math.inf)
    assert mamba.conv_dim == 4 * 8 + 2 * 2 * 8


def test_reads_what_transformers_writes(tmp_path: Path) -> None:
    hf = HFConfig(
        **{
            **SMALL,
            "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
            "n_group": 2,
            "topk_group": 1,
            "moe_latent_size": 12,
            "routed_scaling_factor": 2.0,
            "mamba_ssm_cache_dtype": "float16",
            "time_step_limit": (0.0, 0.5),
        }
    )
    hf.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    config = NemotronHConfig.from_file(tmp_path)
    assert config.pattern == hf.hybrid_override_pattern
    moe = config.layers[1].moe
    assert (moe.n_routed_experts, moe.num_experts_per_tok) == (
        hf.n_routed_experts,
        hf.num_experts_per_tok,
    )
    assert (moe.n_group, moe.topk_group, moe.latent_size) == (2, 1, 12)
    assert moe.routed_scaling_factor == hf.routed_scaling_factor
    assert moe.shared_intermediate_size == hf.moe_shared_expert_intermediate_size
    attention = config.layers[2].attention
    assert (attention.num_heads, attention.num_kv_heads, attention.head_dim) == (4, 2, 8)
    assert config.layers[3].mlp.intermediate_size == hf.intermediate_size
    assert config.layers[0].mamba.time_step_limit == (0.0, 0.5)
    assert config.layers[0].mamba.ssm_cache_dtype == "float16"
    # The infinity encoding round-trips through our own to_dict, and to_dict re-reads equal.
    assert NemotronHConfig.from_dict(config.to_dict()) == config
    assert raw["model_type"] == "nemotron_h"


def test_direct_construction_equals_reading_the_checkpoint(tmp_path: Path) -> None:
    direct = NemotronHConfig(
        **SMALL,
        layers_block_type=(LayerKind.MAMBA, LayerKind.MOE, LayerKind.ATTENTION, LayerKind.MLP),
        time_step_min=0.01,  # init-only: must not become a clamp
    )
    (tmp_path / "config.json").write_text(
        json.dumps({**direct.to_dict(), "model_type": "nemotron_h"})
    )
    read = NemotronHConfig.from_file(tmp_path)
    assert read.layers == direct.layers
    assert graph_bytes(read) == graph_bytes(direct)
    assert cache_tensors(read.layers, ir.DataType.FLOAT) == cache_tensors(
        direct.layers, ir.DataType.FLOAT
    )
    model, _ = build_decoder(direct)
    assert not [n for n in model.graph if n.op_type == "Clip"], "time_step_min became a clamp"


def test_time_step_limit_becomes_a_clip() -> None:
    config = NemotronHConfig(**SMALL, layers_block_type=("mamba",), time_step_limit=(0.01, 2.0))
    model, _ = build_decoder(config)
    clips = [n for n in model.graph if n.op_type == "Clip"]
    assert len(clips) == 1
    bounds = [
        v.producer().attributes["value"].as_tensor().numpy().item() for v in clips[0].inputs[1:]
    ]
    assert bounds == pytest.approx([0.01, 2.0])


@pytest.mark.parametrize(
    "cache_dtype, expected",
    [
        ("float32", ir.DataType.FLOAT),
        ("float16", ir.DataType.FLOAT16),
        ("bfloat16", ir.DataType.BFLOAT16),
    ],
)
def test_ssm_cache_dtype_sets_the_recurrent_state_type(
    cache_dtype: str, expected: ir.DataType
) -> None:
    config = NemotronHConfig(
        **SMALL, layers_block_type=("mamba", "attention"), mamba_ssm_cache_dtype=cache_dtype
    )
    for precision in ("f32", "f16"):
        model, _ = build_decoder(config, BuildContext.dense(precision))
        inputs = {v.name: v for v in model.graph.inputs}
        outputs = {v.name: v for v in model.graph.outputs}
        assert inputs[StateRole.RECURRENT.past_name(0)].dtype == expected
        assert outputs[StateRole.RECURRENT.present_name(0)].dtype == expected
        # the conv state and KV cache follow the model dtype
        model_dtype = ir.DataType.FLOAT if precision == "f32" else ir.DataType.FLOAT16
        assert inputs[StateRole.CONV.past_name(0)].dtype == model_dtype
        assert inputs[StateRole.KEY.past_name(1)].dtype == model_dtype


def released(**changes):
    raw = {**RELEASED, **changes}
    return {k: v for k, v in raw.items() if v is not None}


BAD = {
    "unknown layer kind": (
        released(hybrid_override_pattern="M-X*E", num_hidden_layers=None),
        "unknown layer kind 'X'",
    ),
    "heads do not divide": (
        released(num_key_value_heads=3),
        "num_attention_heads / num_key_value_heads",
    ),
    "mamba groups do not divide": (released(mamba_n_groups=3), "mamba_num_heads / n_groups"),
    "no topology": (
        released(hybrid_override_pattern=None),
        "neither layers_block_type nor hybrid_override_pattern",
    ),
    "layer count mismatch": (released(num_hidden_layers=7), "num_hidden_layers=7"),
    "pattern conflict": (
        released(layers_block_type=["mamba", "mlp", "mamba", "attention", "mlp"]),
        "disagree",
    ),
    "experts vs groups": (released(n_group=3), "n_routed_experts / n_group"),
    "topk_group too big": (released(n_group=2, topk_group=3), "topk_group=3 exceeds n_group=2"),
    "top-k unreachable": (
        released(n_group=4, topk_group=1, num_experts_per_tok=3),
        "num_experts_per_tok=3 exceeds",
    ),
    "bad activation": (released(mlp_hidden_act="gelu"), "mlp_hidden_act"),
    "bad ssm cache dtype": (released(mamba_ssm_cache_dtype="int8"), "mamba_ssm_cache_dtype"),
    "bad time step limit": (released(mamba_dt_limit=[1.0, 0.5]), "time_step_limit"),
    "non-numeric limit": (
        released(mamba_dt_limit=[0.0, {"__float__": "lots"}]),
        "time_step_limit[1]",
    ),
    "attention bias": (released(attention_bias=True), "attention_bias"),
    "sliding window": (released(sliding_window=128), "sliding_window"),
    "zero hidden size": (released(hidden_size=0), "hidden_size"),
    "two shared experts": (released(n_shared_experts=2), "n_shared_experts=2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_invalid_configs_name_the_field(case: str) -> None:
    raw, message = BAD[case]
    with pytest.raises(ConfigError, match=None) as info:
        NemotronHConfig.from_dict(raw)
    assert message in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no config.json"):
        NemotronHConfig.from_file(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        NemotronHConfig.from_file(tmp_path)
