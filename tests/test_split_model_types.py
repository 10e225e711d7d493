"""transformers' split Nemotron-H model types, `nemotron_h_dense` and `nemotron_h_sparse`
(configs/nemotron_h_split.py): checkpoints whose config.json is written in their layout build,
match transformers under the FP32 gates, and a config outside its type is one clear error.

The installed transformers (5.24) has neither type; the layouts below follow the field lists
of transformers' configuration_nemotron_h_dense.py / _sparse.py: `hybrid_override_pattern`
(no layers_block_type, no num_hidden_layers), no MTP fields, each type's own fields only.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx_ir as ir
import pytest

from mobius_lite.configs.loader import load_text_config
from mobius_lite.configs.nemotron_h_split import NemotronHDenseConfig, NemotronHSparseConfig
from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from parity import run_parity

# The fields each transformers config class declares (besides model_type and the pattern).
COMMON_FIELDS = [
    "vocab_size",
    "hidden_size",
    "tie_word_embeddings",
    "use_cache",
    "num_logits_to_keep",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "attention_bias",
    "attention_dropout",
    "sliding_window",
    "mlp_hidden_act",
    "mlp_bias",
    "use_mamba_kernels",
    "ssm_state_size",
    "mamba_num_heads",
    "mamba_head_dim",
    "mamba_hidden_act",
    "n_groups",
    "conv_kernel",
    "expand",
    "time_step_min",
    "time_step_max",
    "time_step_limit",
    "time_step_floor",
    "use_conv_bias",
    "chunk_size",
    "mamba_proj_bias",
    "mamba_ssm_cache_dtype",
    "use_bias",
    "initializer_range",
    "layer_norm_epsilon",
    "residual_in_fp32",
    "hidden_dropout",
    "rescale_prenorm_residual",
]
DENSE_FIELDS = (*COMMON_FIELDS, "intermediate_size")
SPARSE_FIELDS = (
    *COMMON_FIELDS,
    *[
        "n_routed_experts",
        "n_shared_experts",
        "moe_intermediate_size",
        "moe_shared_expert_intermediate_size",
        "moe_latent_size",
        "moe_shared_expert_overlap",
        "num_experts_per_tok",
        "routed_scaling_factor",
        "n_group",
        "topk_group",
        "norm_topk_prob",
    ],
)
KIND_CHARS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
CASES = {
    "nemotron_h_dense": (
        ["linear_attention", "mlp", "full_attention", "mlp", "linear_attention"],
        DENSE_FIELDS,
    ),
    "nemotron_h_sparse": (
        ["linear_attention", "moe", "full_attention", "linear_attention", "moe"],
        SPARSE_FIELDS,
    ),
}


def split_layout(model_type: str, fields: tuple[str, ...]):
    """Rewrite a saved checkpoint's config.json as transformers' split config saves it."""

    def edit(checkpoint: Path) -> None:
        path = checkpoint / "config.json"
        raw = json.loads(path.read_text())
        pattern = "".join(KIND_CHARS[k] for k in raw["layers_block_type"])
        kept: dict[str, Any] = {k: raw[k] for k in fields if k in raw}
        path.write_text(
            json.dumps(
                {"model_type": model_type, "hybrid_override_pattern": pattern, **kept}, indent=2
            )
        )

    return edit


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_split_layout_matches_transformers(model_type: str, tmp_path: Path) -> None:
    pattern, fields = CASES[model_type]
    run = run_parity(
        {"layers_block_type": pattern},
        tmp_path,
        edit_checkpoint=split_layout(model_type, fields),
    )
    package = json.loads((tmp_path / "package" / "config.json").read_text())
    assert package["model_type"] == model_type
    assert len({c.name.split("/")[0] for c in run.comparisons}) == 6  # prefill + 5 decodes
    assert not run.failures(FP32_NRMSE, FP32_COSINE)
    assert run.exported_tokens == run.reference_tokens


def test_qualify_reference_loads_a_split_checkpoint(tmp_path: Path) -> None:
    """The qualify reference of both types loads a split checkpoint with a transformers that
    lacks the type (as nemotron_h) and computes the saved model's logits."""
    import torch

    from mobius_lite.evaluation.reference import load_reference
    from reference_fixtures.nemotron_reference import make_reference, pinned_torch

    pattern, fields = CASES["nemotron_h_sparse"]
    model = make_reference({"layers_block_type": pattern}, seed=4)
    model.save_pretrained(tmp_path)
    split_layout("nemotron_h_sparse", fields)(tmp_path)
    loaded = load_reference(tmp_path, "nemotron_h_sparse")
    ids = torch.tensor([[5, 17, 33, 8, 61, 12]])
    with pinned_torch(), torch.no_grad():
        expected = model(ids).logits
        actual = loaded(ids).logits
    assert torch.equal(actual, expected)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (
            {"model_type": "nemotron_h_dense", "hybrid_override_pattern": "M-E*"},
            r"layer 2 is moe \(E\); this type holds only .* is model_type 'nemotron_h_sparse'",
        ),
        (
            {"model_type": "nemotron_h_sparse", "hybrid_override_pattern": "M-E*"},
            r"layer 1 is mlp \(-\); .* is model_type 'nemotron_h_dense'",
        ),
        (
            {
                "model_type": "nemotron_h_dense",
                "hybrid_override_pattern": "M-M*",
                "num_nextn_predict_layers": 1,
            },
            "has no multi-token-prediction head",
        ),
        (
            {"model_type": "nemotron_h_sparse", "hybrid_override_pattern": "MEX*"},
            "unknown layer kind 'X'",
        ),
    ],
)
def test_configs_outside_their_type_are_one_clear_error(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_text_config(raw)


def test_cli_refuses_a_split_config_outside_its_type(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "nemotron_h_dense", "hybrid_override_pattern": "ME"})
    )
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "mobius_lite.cli.main",
            "build",
            "--model",
            str(checkpoint),
            "--output",
            str(tmp_path / "package"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "nemotron_h_dense" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "package").exists()


# The dense NVIDIA-Nemotron-3-Nano-4B as its model card and the published architecture summary
# describe it: 42 layers (21 Mamba-2, 17 MLP, 4 attention), hidden 3136, vocabulary 131072,
# 262144 positions. The layer order and the per-layer sizes below are not the released file's
# (it could not be read here): they give the same shape (a hidden size that is no multiple of
# 128, four attention layers, no MoE) to the config readers and the graph builder.
NANO_4B_PATTERN = "M-M-M-M-M*M-M-M-M-M*M-M-M-M-M*M-M-M-M-M*M-"
NANO_4B = {
    "hybrid_override_pattern": NANO_4B_PATTERN,
    "hidden_size": 3136,
    "vocab_size": 131072,
    "max_position_embeddings": 262144,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12544,
    "mamba_num_heads": 112,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "layer_norm_epsilon": 1e-5,
}


def test_nano_4b_shape_builds_in_both_spellings() -> None:
    """The released spelling (nemotron_h, num_hidden_layers given) and transformers' newer
    one (nemotron_h_dense) resolve the same layers and cache ABI, and the decoder graph builds
    (weights unbound) with one cache pair per Mamba and per attention layer."""
    from mobius_lite.enums import LayerKind
    from mobius_lite.graphs.cache import cache_tensors
    from mobius_lite.graphs.decoder import build_decoder

    assert (NANO_4B_PATTERN.count("M"), NANO_4B_PATTERN.count("-"), NANO_4B_PATTERN.count("*")) == (
        21,
        17,
        4,
    )
    released = load_text_config({**NANO_4B, "model_type": "nemotron_h", "num_hidden_layers": 42})
    split = load_text_config({**NANO_4B, "model_type": "nemotron_h_dense"})
    assert isinstance(split, NemotronHDenseConfig)
    assert released.layers == split.layers and released.pattern == NANO_4B_PATTERN
    cache = cache_tensors(split.layers, ir.DataType.FLOAT)
    assert [c.past_name for c in cache] == [
        c.past_name for c in cache_tensors(released.layers, ir.DataType.FLOAT)
    ]
    model, _ = build_decoder(split)
    inputs = {v.name for v in model.graph.inputs}
    attention = [layer.index for layer in split.layers if layer.kind is LayerKind.ATTENTION]
    assert len(attention) == 4
    assert {f"past_key_values.{i}.key" for i in attention} <= inputs
    assert sum(name.endswith(".recurrent_state") for name in inputs) == 21
    assert not isinstance(split, NemotronHSparseConfig)
