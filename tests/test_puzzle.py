"""Puzzle (nemotron_h_puzzle): per-layer topology resolved from block_configs, checked against
transformers' NemotronH modules with each layer's mixer built from its own config."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
import pytest
import torch

import mobius_lite
from mobius_lite.configs.loader import load_config_file, load_text_config
from mobius_lite.configs.puzzle import NemotronHPuzzleConfig
from mobius_lite.enums import LayerKind, StateRole
from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.evaluation.puzzle_reference import puzzle_reference_model
from mobius_lite.graphs.cache import cache_tensors
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.sources import SafetensorsCheckpoint
from mobius_lite.weights.binding import graph_parameters
from parity import ParityRun, drive_parity
from reference_fixtures.puzzle_fixtures import (
    HETEROGENEOUS_BLOCKS,
    TINY_PUZZLE_GLOBALS,
    puzzle_raw_config,
    write_puzzle_checkpoint,
)

PROMPT, STEPS = 11, 5

# A global latent projection and shared expert (a block cannot switch the latent off: null means
# "inherit"); blocks vary experts, top-k, width, grouping, shared expert, state size, KV heads.
LATENT_GLOBAL_BLOCKS: list[dict[str, Any]] = [
    {
        "block_type": "moe",
        "n_routed_experts": 8,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 14,
    },
    {"block_type": "mamba", "ssm_state_size": 4},
    {
        "block_type": "moe",
        "n_routed_experts": 12,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 18,
        "n_group": 3,
        "topk_group": 2,
        "n_shared_experts": 0,
    },
    {"block_type": "attention", "num_key_value_heads": 4},
    {
        "block_type": "moe",
        "n_routed_experts": 4,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 6,
        "moe_latent_size": 8,
    },
]


def _assert_parity(run: ParityRun, config: NemotronHPuzzleConfig) -> None:
    """Every logits/K/V/conv/recurrent array of every step passes the FP32 gates; same tokens."""
    stateful = [c.present_name for c in cache_tensors(config.layers, ir.DataType.FLOAT)]
    steps = ["prefill"] + [f"decode{i}" for i in range(STEPS)]
    expected = {f"{s}/{n}" for s in steps for n in ["logits", *stateful]}
    assert {c.name for c in run.comparisons} == expected
    assert all(c.finite for c in run.comparisons)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [(c.name, c.nrmse, c.cosine) for c in failures]
    assert len(run.reference_tokens) == STEPS + 1
    assert run.exported_tokens == run.reference_tokens


@pytest.fixture(scope="module")
def hetero(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The heterogeneous checkpoint (with an MTP head) and its exported package."""
    root = tmp_path_factory.mktemp("puzzle")
    raw = puzzle_raw_config(HETEROGENEOUS_BLOCKS, num_nextn_predict_layers=1)
    checkpoint, written = write_puzzle_checkpoint(raw, root / "checkpoint", with_mtp=True)
    package = mobius_lite.build(checkpoint, dtype="f32")
    out = package.save(root / "package")
    return dict(raw=raw, checkpoint=checkpoint, written=written, package=package, out=out)


def test_reference_has_each_layers_own_sizes(hetero: dict[str, Any]) -> None:
    """The reference read back from the Puzzle layout is the model the tensors came from, and its
    modules carry the per-layer sizes the config resolves to."""
    reference = puzzle_reference_model(hetero["checkpoint"])
    written, loaded = hetero["written"].state_dict(), reference.state_dict()
    assert set(written) == set(loaded)
    assert all(torch.equal(written[k], loaded[k]) for k in written)

    config = load_config_file(hetero["checkpoint"])
    assert isinstance(config, NemotronHPuzzleConfig)
    assert config.pattern == "ME*EM-*EE"
    for layer, block in zip(config.layers, reference.model.layers, strict=True):
        mixer = block.mixer
        if layer.kind is LayerKind.MOE:
            spec = layer.moe
            width = spec.latent_size or config.hidden_size
            assert tuple(mixer.experts.up_proj.shape) == (
                spec.n_routed_experts,
                spec.moe_intermediate_size,
                width,
            )
            assert mixer.gate.top_k == spec.num_experts_per_tok
            assert mixer.gate.num_group == spec.n_group
            assert mixer.gate.topk_group == spec.topk_group
            assert mixer.gate.routed_scaling_factor == spec.routed_scaling_factor
            assert mixer.gate.norm_topk_prob == spec.norm_topk_prob
            has_shared = hasattr(mixer.shared_experts, "up_proj")
            assert has_shared == spec.has_shared_expert
        elif layer.kind is LayerKind.ATTENTION:
            spec = layer.attention
            assert tuple(mixer.k_proj.weight.shape) == (
                spec.num_kv_heads * spec.head_dim,
                config.hidden_size,
            )
            assert tuple(mixer.q_proj.weight.shape)[0] == spec.num_heads * spec.head_dim
        elif layer.kind is LayerKind.MAMBA:
            spec = layer.mamba
            assert mixer.conv_dim == spec.conv_dim
            assert mixer.num_heads == spec.num_heads and mixer.head_dim == spec.head_dim
        else:
            assert mixer.up_proj.weight.shape[0] == layer.mlp.intermediate_size


def test_parity_heterogeneous(hetero: dict[str, Any]) -> None:
    """Prefill 11 tokens + 5 cached greedy steps against the per-layer transformers reference."""
    config = load_config_file(hetero["checkpoint"])
    reference = puzzle_reference_model(hetero["checkpoint"])
    run = drive_parity(reference, config, hetero["out"], prompt_length=PROMPT, decode_steps=STEPS)
    _assert_parity(run, config)


def test_parity_latent_global_batch_left_padding(tmp_path: Path) -> None:
    """A second topology (global latent, blocks without a shared expert, grouped routing),
    batch 2 with one left-padded row."""
    raw = puzzle_raw_config(
        LATENT_GLOBAL_BLOCKS, moe_latent_size=20, moe_shared_expert_intermediate_size=28
    )
    checkpoint, _ = write_puzzle_checkpoint(raw, tmp_path / "checkpoint", seed=3)
    out = mobius_lite.build(checkpoint, dtype="f32").save(tmp_path / "package")
    config = load_config_file(checkpoint)
    assert [layer.moe.latent_size for layer in config.layers_of(LayerKind.MOE)] == [20, 20, 8]
    reference = puzzle_reference_model(checkpoint)
    run = drive_parity(
        reference,
        config,
        out,
        prompt_length=PROMPT,
        decode_steps=STEPS,
        batch=2,
        left_padding=(3, 0),
        seed=3,
    )
    _assert_parity(run, config)


def test_checkpoint_layout_is_bound_by_name(hetero: dict[str, Any]) -> None:
    """model.* names and one tensor per expert are bound by an explicit stack, in expert order."""
    plan = hetero["package"].plan
    stacked = [b for b in plan.bindings if b.transform == "stack"]
    moe_layers = [i for i, b in enumerate(HETEROGENEOUS_BLOCKS) if b["block_type"] == "moe"]
    assert len(stacked) == 2 * len(moe_layers)
    for binding in stacked:
        proj = binding.target.rsplit(".", 1)[1]
        prefix = "model." + binding.target.removeprefix("backbone.").rsplit(".", 1)[0]
        assert binding.sources == tuple(
            f"{prefix}.{e}.{proj}.weight" for e in range(binding.shape[0])
        )
    assert all(s.startswith(("model.", "lm_head.")) for b in plan.bindings for s in b.sources)


def test_mtp_tensors_listed_as_unused(hetero: dict[str, Any], tmp_path: Path) -> None:
    source = SafetensorsCheckpoint(hetero["checkpoint"])
    mtp_names = {n for n in source.names() if n.startswith("mtp.")}
    assert mtp_names and "mtp.layers.1.mixer.experts.3.down_proj.weight" in mtp_names
    unused = hetero["package"].plan.unused
    assert set(unused) == mtp_names
    assert all("multi-token-prediction" in reason for reason in unused.values())

    # Without num_nextn_predict_layers the same tensors are an error, not silently dropped.
    raw = copy.deepcopy(hetero["raw"])
    raw["num_nextn_predict_layers"] = 0
    moved = tmp_path / "no_mtp_config"
    moved.mkdir()
    for f in hetero["checkpoint"].iterdir():
        (moved / f.name).symlink_to(f)
    (moved / "config.json").unlink()
    (moved / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="mtp.layers.0"):
        mobius_lite.build(moved, dtype="f32")


def test_cache_abi_per_layer_shapes_and_global_indices(hetero: dict[str, Any]) -> None:
    """Cache names keep global layer indices; shapes come from each layer's own sizes."""
    import onnxruntime as ort

    config = load_config_file(hetero["checkpoint"])
    session = ort.InferenceSession(str(hetero["out"] / "model.onnx"))
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    cache = cache_tensors(config.layers, ir.DataType.FLOAT)
    assert sorted({c.layer for c in cache}) == [0, 2, 4, 6]
    assert set(inputs) == {"input_ids", "attention_mask", *(c.past_name for c in cache)}
    assert outputs == {"logits", *(c.present_name for c in cache)}
    # Layer 6 attention: 1 KV head of 16; layer 4 Mamba: 2 heads x 12, 1 group, state 8.
    assert inputs[StateRole.KEY.past_name(6)][1:] == [1, "past_sequence", 16]
    assert inputs[StateRole.KEY.past_name(2)][1:] == [2, "past_sequence", 8]
    assert inputs[StateRole.CONV.past_name(4)][1:] == [2 * 12 + 2 * 1 * 8, 3]
    assert inputs[StateRole.RECURRENT.past_name(4)][1:] == [2, 8, 12]


def _direct_kwargs(raw: dict[str, Any]) -> dict[str, Any]:
    """The same model written as Python keyword arguments (released float encoding decoded)."""
    kwargs = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    kwargs["time_step_limit"] = (0.0, float("inf"))
    return kwargs


def test_direct_construction_matches_checkpoint(hetero: dict[str, Any]) -> None:
    from_file = load_config_file(hetero["checkpoint"])
    direct = NemotronHPuzzleConfig(**_direct_kwargs(hetero["raw"]))
    assert direct.layers == from_file.layers
    assert cache_tensors(direct.layers, ir.DataType.FLOAT) == cache_tensors(
        from_file.layers, ir.DataType.FLOAT
    )
    graph_direct, _ = build_decoder(direct)
    graph_file, _ = build_decoder(from_file)
    assert graph_parameters(graph_direct) == graph_parameters(graph_file)
    proto_direct = ir.serde.serialize_model(graph_direct).SerializeToString()
    proto_file = ir.serde.serialize_model(graph_file).SerializeToString()
    assert proto_direct == proto_file
    # The written config.json reads back to the same resolved layers.
    saved = json.loads((hetero["out"] / "config.json").read_text())
    assert load_text_config(saved).layers == from_file.layers


def _count_nodes(graph: ir.Graph) -> tuple[int, int]:
    """(top-level nodes, nodes inside subgraphs, recursively)."""
    inner = 0
    for node in graph:
        for attr in node.attributes.values():
            subgraphs = []
            if attr.type == ir.AttributeType.GRAPH:
                subgraphs = [attr.as_graph()]
            elif attr.type == ir.AttributeType.GRAPHS:
                subgraphs = list(attr.as_graphs())
            for sub in subgraphs:
                top, nested = _count_nodes(sub)
                inner += top + nested
    return len(graph), inner


def test_node_count_independent_of_expert_count() -> None:
    def graph_for(experts: int) -> ir.Model:
        blocks = [
            {**b, "n_routed_experts": experts} if b["block_type"] == "moe" else b
            for b in HETEROGENEOUS_BLOCKS
        ]
        raw = puzzle_raw_config(blocks)
        return build_decoder(NemotronHPuzzleConfig.from_dict(raw))[0]

    small, large = graph_for(16), graph_for(128)
    assert _count_nodes(small.graph) == _count_nodes(large.graph)
    up = "backbone.layers.1.mixer.experts.up_proj"
    assert small.graph.initializers[up].shape[0] == 16
    assert large.graph.initializers[up].shape[0] == 128


# ----------------------------------------------------------------------------- config errors
def _with(**changes: Any) -> dict[str, Any]:
    raw = puzzle_raw_config(copy.deepcopy(HETEROGENEOUS_BLOCKS))
    raw.update(changes)
    return raw


def _block_change(index: int, **entry: Any) -> dict[str, Any]:
    raw = puzzle_raw_config(copy.deepcopy(HETEROGENEOUS_BLOCKS))
    raw["block_configs"][index] = entry
    return raw


CONFLICTS = {
    "layers_block_type": (
        _with(layers_block_type=["mamba"] * len(HETEROGENEOUS_BLOCKS)),
        "layers_block_type",
    ),
    "layer_types": (_with(layer_types=["moe"]), "layer_types"),
    "hybrid_override_pattern": (
        _with(hybrid_override_pattern="ME*EM-*E"),
        "hybrid_override_pattern",
    ),
    "num_hidden_layers": (_with(num_hidden_layers=88), "num_hidden_layers=88"),
    "unknown_key": (
        _block_change(2, block_type="attention", q_indexer_dim=64),
        "q_indexer_dim",
    ),
    "key_of_other_kind": (
        _block_change(0, block_type="mamba", moe_intermediate_size=64),
        "moe_intermediate_size",
    ),
    "missing_moe_width": (
        _block_change(1, block_type="moe", n_routed_experts=8, num_experts_per_tok=2),
        "moe_intermediate_size",
    ),
    "missing_block_type": (_block_change(1, n_routed_experts=8), "block_type"),
    "invalid_override": (
        _block_change(
            1,
            block_type="moe",
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            n_group=3,
        ),
        "n_routed_experts / n_group",
    ),
    "empty": (_with(block_configs=[]), "block_configs"),
}


@pytest.mark.parametrize("case", sorted(CONFLICTS))
def test_config_conflicts_raise_before_reading_weights(case: str, tmp_path: Path) -> None:
    raw, message = CONFLICTS[case]
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        load_text_config(raw)
    # Through the build entry point too, with no weights on disk at all: nothing is read.
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        mobius_lite.build(tmp_path, dtype="f32")


def test_direct_construction_conflict_raises() -> None:
    kwargs = _direct_kwargs(puzzle_raw_config(HETEROGENEOUS_BLOCKS))
    with pytest.raises(ConfigError, match="layers_block_type disagrees"):
        NemotronHPuzzleConfig(**kwargs, layers_block_type=("mamba",) * len(HETEROGENEOUS_BLOCKS))
    with pytest.raises(ConfigError, match="block_configs is empty"):
        NemotronHPuzzleConfig(**{**kwargs, "block_configs": []})


def test_consistent_topology_fields_and_legacy_names_are_accepted() -> None:
    """Released configs may also carry the layer list (consistent) and legacy field names."""
    blocks = copy.deepcopy(HETEROGENEOUS_BLOCKS)
    experts = blocks[1].pop("n_routed_experts")
    blocks[1]["num_local_experts"] = experts
    raw = puzzle_raw_config(
        blocks,
        hybrid_override_pattern="ME*EM-*EE",
        layers_block_type=[b["block_type"] for b in HETEROGENEOUS_BLOCKS],
        num_hidden_layers=len(HETEROGENEOUS_BLOCKS),
        blockwise_members=["moe_intermediate_size", "num_experts_per_tok"],
    )
    config = load_text_config(raw)
    reference = load_text_config(puzzle_raw_config(HETEROGENEOUS_BLOCKS))
    assert config.layers == reference.layers
    assert config.layers[1].moe.n_routed_experts == 8


def test_global_values_fill_what_blocks_leave_out() -> None:
    config = load_text_config(puzzle_raw_config(HETEROGENEOUS_BLOCKS))
    moe = {layer.index: layer.moe for layer in config.layers_of(LayerKind.MOE)}
    g = TINY_PUZZLE_GLOBALS
    assert moe[1].shared_intermediate_size == g["moe_shared_expert_intermediate_size"]
    assert moe[1].latent_size is None and moe[1].n_group == 1
    assert moe[3].n_shared_experts == 0 and moe[3].routed_scaling_factor == 2.5
    assert not moe[3].norm_topk_prob
    # null in a block means "no override", as released configs serialise unset fields
    assert moe[7].routed_scaling_factor == g["routed_scaling_factor"]
    assert moe[7].shared_intermediate_size == 8
    assert config.layers[5].mlp.intermediate_size == 40
    assert config.layers[0].mamba.num_heads == g["mamba_num_heads"]
    assert config.layers[4].mamba.num_heads == 2
    assert np.array_equal([layer.index for layer in config.layers_of(LayerKind.ATTENTION)], [2, 6])
