"""A Puzzle (nemotron_h_puzzle) checkpoint as llama.cpp's converter writes it to GGUF: arch
nemotron_h_moe with per-layer feed_forward_length / expert_feed_forward_length /
expert_used_count arrays (0 for a layer without MoE) and per-layer head counts; the expert
count, shared-expert length and latent size global. Its config resolves to the same LayerSpecs
as the Puzzle safetensors release, and its package matches the Puzzle safetensors reference
(evaluation/puzzle_reference.py) under the foundation gates on both backends."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest

from mobius_lite.cli.main import main
from mobius_lite.configs.gguf_metadata import config_from_checkpoint
from mobius_lite.configs.loader import load_config_file, load_text_config
from mobius_lite.configs.puzzle import NemotronHPuzzleConfig
from mobius_lite.enums import LayerKind
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.evaluation.puzzle_reference import puzzle_reference_model
from mobius_lite.sources.gguf_file import GGUFCheckpoint
from parity import drive_parity
from reference_fixtures.gguf_fixtures import PUZZLE_GGUF_BLOCKS, PUZZLE_GGUF_GLOBALS, write_gguf
from reference_fixtures.puzzle_fixtures import puzzle_raw_config, write_puzzle_checkpoint


@pytest.fixture(scope="module")
def puzzle(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gguf_puzzle")
    raw = puzzle_raw_config(PUZZLE_GGUF_BLOCKS, **PUZZLE_GGUF_GLOBALS)
    checkpoint, model = write_puzzle_checkpoint(raw, root / "checkpoint")
    (file,) = write_gguf(root / "puzzle.gguf", model, "nemotron_h_moe", puzzle=True)
    return {"raw": raw, "checkpoint": checkpoint, "file": file, "root": root}


def test_the_file_has_the_converters_per_layer_arrays(puzzle: dict[str, Any]) -> None:
    fields = gguf.GGUFReader(puzzle["file"]).fields
    arch = "nemotron_h_moe"

    def values(key: str) -> Any:
        return fields[f"{arch}.{key}"].contents()

    assert fields["general.architecture"].contents() == arch
    assert values("feed_forward_length") == [0, 16, 0, 12, 0, 0, 20]
    assert values("expert_feed_forward_length") == [0, 16, 0, 12, 0, 0, 20]
    assert values("expert_used_count") == [0, 2, 0, 3, 0, 0, 1]
    assert values("attention.head_count_kv") == [0, 0, 2, 0, 0, 1, 0]
    assert values("expert_count") == 8 and values("moe_latent_size") == 24


def test_same_layer_specs_as_the_safetensors_release(puzzle: dict[str, Any]) -> None:
    released = load_config_file(puzzle["checkpoint"])
    raw = config_from_checkpoint(GGUFCheckpoint(puzzle["file"]))
    from_gguf = load_text_config(raw)
    assert isinstance(from_gguf, NemotronHPuzzleConfig)
    assert from_gguf.layers == released.layers
    assert [layer.kind for layer in from_gguf.layers][3] is LayerKind.MOE
    assert not from_gguf.layers[3].moe.has_shared_expert
    # the release's config.json given beside the file: cross-checked, the same specs
    given = json.loads((puzzle["checkpoint"] / "config.json").read_text())
    with_json = load_text_config(config_from_checkpoint(GGUFCheckpoint(puzzle["file"]), given))
    assert with_json.layers == released.layers


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_package_matches_the_puzzle_reference(puzzle: dict[str, Any], backend: str) -> None:
    package = puzzle["root"] / f"package-{backend}"
    args = ["build", "--model", str(puzzle["file"]), "--output", str(package), "-q"]
    assert main([*args, "--weights-backend", backend]) == 0
    config = load_config_file(package)
    assert isinstance(config, NemotronHPuzzleConfig)
    reference = puzzle_reference_model(puzzle["checkpoint"])
    run = drive_parity(reference, config, package, prompt_length=9, decode_steps=5)
    # per step (prefill + 5): logits, K and V of 2 attention layers, conv and SSM of 2 Mamba ones
    assert len(run.comparisons) == 6 * (1 + 2 * 2 + 2 * 2)
    assert all(c.finite for c in run.comparisons)
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [str(c) for c in failures[:8]]
    assert run.exported_tokens == run.reference_tokens


def test_a_moe_layer_without_its_expert_width_is_one_clear_error(
    puzzle: dict[str, Any], tmp_path: Path, capsys
) -> None:
    """expert_used_count says layer 1 routes to experts, expert_feed_forward_length gives it
    none: refused before anything is written."""
    _, model = write_puzzle_checkpoint(puzzle["raw"], tmp_path / "checkpoint")
    (file,) = write_gguf(tmp_path / "bad.gguf", model, "nemotron_h_moe", puzzle=True)
    reader = gguf.GGUFReader(file, "r+")
    field = reader.fields["nemotron_h_moe.expert_feed_forward_length"]
    field.parts[field.data[1]][0] = 0  # layer 1's entry
    reader.data.flush()
    out = tmp_path / "out"
    assert main(["build", "--model", str(file), "--output", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "expert_feed_forward_length[1]=0" in err and "Traceback" not in err, err
    assert not out.exists()


def _puzzle_metadata(**per_layer: list[int]) -> dict[str, Any]:
    """Metadata of a five-layer Puzzle file (mamba, moe, attention, mlp, moe) as the converter
    writes it, with per-layer arrays replaceable."""
    arch = "nemotron_h_moe"
    arrays = {
        "feed_forward_length": [0, 16, 0, 40, 12],
        "expert_feed_forward_length": [0, 16, 0, 0, 12],
        "expert_used_count": [0, 2, 0, 0, 3],
        "attention.head_count": [0, 0, 4, 0, 0],
        "attention.head_count_kv": [0, 0, 2, 0, 0],
        **{k.replace("__", "."): v for k, v in per_layer.items()},
    }
    scalars = {
        "block_count": 5,
        "embedding_length": 32,
        "attention.layer_norm_rms_epsilon": 1e-5,
        "attention.key_length": 8,
        "attention.value_length": 8,
        "ssm.time_step_rank": 4,
        "ssm.inner_size": 32,
        "ssm.state_size": 8,
        "ssm.group_count": 2,
        "ssm.conv_kernel": 4,
        "expert_count": 8,
        "expert_shared_feed_forward_length": 24,
        "expert_shared_count": 1,
        "vocab_size": 97,
    }
    return {
        "general.architecture": arch,
        **{f"{arch}.{k}": v for k, v in {**scalars, **arrays}.items()},
    }


def test_an_ffn_width_without_experts_is_a_dense_mlp_layer() -> None:
    from mobius_lite.configs.gguf_metadata import config_from_gguf

    config = load_text_config(config_from_gguf(_puzzle_metadata()))
    kinds = [layer.kind for layer in config.layers]
    assert kinds == [
        LayerKind.MAMBA,
        LayerKind.MOE,
        LayerKind.ATTENTION,
        LayerKind.MLP,
        LayerKind.MOE,
    ]
    assert config.layers[3].mlp.intermediate_size == 40
    assert (
        config.layers[1].moe.moe_intermediate_size,
        config.layers[1].moe.num_experts_per_tok,
    ) == (16, 2)
    assert (
        config.layers[4].moe.moe_intermediate_size,
        config.layers[4].moe.num_experts_per_tok,
    ) == (12, 3)


def test_a_per_layer_array_of_the_wrong_length_is_one_clear_error() -> None:
    from mobius_lite.configs.gguf_metadata import config_from_gguf
    from mobius_lite.errors import ConfigError

    with pytest.raises(ConfigError, match="expert_used_count has 4 entries for 5 layers"):
        config_from_gguf(_puzzle_metadata(expert_used_count=[0, 2, 0, 0]))
