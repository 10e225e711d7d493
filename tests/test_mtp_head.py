"""The multi-token-prediction head (mtp.onnx) and the decoder's `hidden_states` output, for each
source kind: parity at prefill + 5 cached steps against transformers (decoder hidden) and the
independent head reference (reference_fixtures/mtp_reference.py), under the FP32 gates."""

from __future__ import annotations

import json
from pathlib import Path

import onnx_ir as ir
import pytest

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_text_config
from mobius_lite.enums import GraphRole
from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, RELEASE_COSINE, RELEASE_NRMSE
from mobius_lite.graphs.cache import mtp_cache_tensors
from mobius_lite.weights.verify import verify_package
from reference_fixtures.mtp_fixtures import (
    PUZZLE_MTP_BLOCKS,
    drive_head_parity,
    head_reference,
    puzzle_block_config,
    write_nemotron_h_mtp_checkpoint,
    write_puzzle_mtp_checkpoint,
)
from reference_fixtures.mtp_reference import MTPHeadReference

SHARED = ["backbone.embeddings.weight", "lm_head.weight"]


def _failures(comparisons: list, gates: tuple[float, float] = (FP32_NRMSE, FP32_COSINE)) -> list:
    return [(c.name, c.nrmse, c.cosine) for c in comparisons if not c.passes(*gates)]


@pytest.fixture(scope="module")
def nemotron_h(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("mtp_nemotron_h")
    checkpoint, model, head = write_nemotron_h_mtp_checkpoint(root / "checkpoint")
    package = mobius_lite.build(checkpoint)
    out = package.save(root / "package", quiet=True)
    return dict(checkpoint=checkpoint, model=model, head=head, package=package, out=out)


def test_safetensors_package_carries_the_head(nemotron_h) -> None:
    package, out = nemotron_h["package"], nemotron_h["out"]
    assert [g.role for g in package.graphs] == [GraphRole.DECODER, GraphRole.MTP]
    assert (out / "mtp.onnx").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    # the head's weights shared with the decoder are declared so and stored once
    assert {name: sorted(roles) for name, roles in manifest["shared"].items()} == {
        name: ["decoder", "mtp"] for name in SHARED
    }
    assert not any(name.startswith("mtp.") for name in manifest["unused"])
    head_sources = {s for b in package.graph(GraphRole.MTP).plan.bindings for s in b.sources}
    assert set(nemotron_h["head"]) | set(SHARED) == head_sources
    report = verify_package(out, nemotron_h["checkpoint"])
    assert report.ok and report.checked == len(manifest["sources"])


@pytest.mark.parametrize(("batch", "left_padding"), [(1, ()), (2, (3,))])
def test_safetensors_head_parity(nemotron_h, batch: int, left_padding: tuple[int, ...]) -> None:
    config = NemotronHConfig.from_file(nemotron_h["checkpoint"])
    reference = head_reference(nemotron_h["model"], nemotron_h["head"])
    comparisons = drive_head_parity(
        nemotron_h["model"],
        reference,
        nemotron_h["out"],
        config,
        batch=batch,
        left_padding=left_padding,
    )
    assert len(comparisons) == 6 * 5  # hidden + 4 head arrays, prefill + 5 steps
    assert not _failures(comparisons)


def test_f16_head_parity(nemotron_h, tmp_path: Path) -> None:
    """An f16 package's decoder hidden states and mtp.onnx outputs against transformers and
    the f32 head reference: within the release gates (f16 rounding), with a left-padded row."""
    out = mobius_lite.build(nemotron_h["checkpoint"], dtype="f16").save(
        tmp_path / "f16", quiet=True
    )
    config = NemotronHConfig.from_file(nemotron_h["checkpoint"])
    reference = head_reference(nemotron_h["model"], nemotron_h["head"])
    comparisons = drive_head_parity(
        nemotron_h["model"], reference, out, config, batch=2, left_padding=(3,)
    )
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons, (RELEASE_NRMSE, RELEASE_COSINE))
    # f16 is not f32: the same comparisons do not all pass the FP32 gates
    assert _failures(comparisons)


def test_genai_runs_a_package_with_a_head(nemotron_h) -> None:
    """onnxruntime-genai ignores the decoder's extra hidden_states output and mtp.onnx: its
    greedy tokens are transformers'."""
    pytest.importorskip("onnxruntime_genai")
    from test_genai import PROMPT, genai_generate, transformers_greedy

    expected = transformers_greedy(nemotron_h["model"], PROMPT, 8, cached=True)
    assert len(expected) == 8
    assert genai_generate(nemotron_h["out"], PROMPT, 8) == expected


def test_puzzle_head_parity(tmp_path: Path) -> None:
    """Puzzle: the head's own sizes from mtp_block_configs, its tensors in mtp.safetensors
    (found beside the index that does not list it)."""
    checkpoint, model, head, raw = write_puzzle_mtp_checkpoint(tmp_path / "checkpoint")
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    config = load_text_config(raw)
    assert [layer.moe.n_routed_experts for layer in config.mtp_layers[1:]] == [6]
    assert [g.role for g in package.graphs] == [GraphRole.DECODER, GraphRole.MTP]
    reference = MTPHeadReference(
        head,
        puzzle_block_config(raw, PUZZLE_MTP_BLOCKS[0]),
        puzzle_block_config(raw, PUZZLE_MTP_BLOCKS[1]),
        model.model.embeddings.weight.detach().numpy(),
        model.lm_head.weight.detach().numpy(),
    )
    comparisons = drive_head_parity(model, reference, out, config, batch=2, left_padding=(2,))
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons)


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_gguf_q8_0_head_parity(tmp_path: Path, backend: str) -> None:
    """GGUF (nemotron_h_moe, Q8_0 weights): the head folded into block n_layer with
    nextn_predict_layers = 1 and the converter's copies of token_embd / output; the decoder
    does not take that block as a layer, the head computes packed."""
    import numpy as np
    import torch
    from transformers import NemotronHForCausalLM

    from mobius_lite.configs.gguf_metadata import config_from_gguf
    from reference_fixtures.gguf_fixtures import (
        dequantized_arrays,
        dequantized_state_dict,
        write_gguf,
    )
    from reference_fixtures.mtp_fixtures import (
        HEAD_PATTERN,
        global_head_shape,
        head_from_gguf,
        head_tensors,
        nextn_tensors,
    )
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference({"layers_block_type": HEAD_PATTERN}, seed=3)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(7))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    copies = {
        "nextn.embed_tokens.weight": state["model.embeddings.weight"],
        "nextn.shared_head_head.weight": state["lm_head.weight"],
    }
    path = tmp_path / "tiny.gguf"
    write_gguf(
        path,
        model,
        "nemotron_h_moe",
        {r".": "Q8_0"},
        nextn=nextn_tensors(head, model.config, copies),
    )
    _, metadata = dequantized_arrays(path)
    config = NemotronHConfig.from_dict(config_from_gguf(metadata))
    assert config.num_hidden_layers == len(HEAD_PATTERN) and config.has_mtp_head

    package = mobius_lite.build(path, weights_backend=backend)
    out = package.save(tmp_path / "package", quiet=True)
    assert [g.role for g in package.graphs] == [GraphRole.DECODER, GraphRole.MTP]
    # Q8_0 stays packed in the head: ggml blocks (standard) or MatMulNBits' layout (ort)
    weights = package.graph(GraphRole.MTP).model.graph.initializers
    packed = "mtp.layers.0.eh_proj.weight" + ("_nbits_b" if backend == "ort" else "")
    assert weights[packed].dtype == ir.DataType.UINT8
    block = config.num_hidden_layers
    assert set(package.plan.unused) == {
        f"blk.{block}.nextn.embed_tokens.weight",
        f"blk.{block}.nextn.shared_head_head.weight",
    }

    reference_decoder = NemotronHForCausalLM(model.config).eval()
    reference_decoder.load_state_dict(dequantized_state_dict(path), strict=True)
    head_arrays, _ = head_from_gguf(path)
    assert set(head_arrays) == set(head)
    reference = head_reference(reference_decoder, head_arrays)
    with torch.no_grad():
        comparisons = drive_head_parity(reference_decoder, reference, out, config)
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons)


def test_omni_head_parity(tmp_path: Path) -> None:
    """Omni: language_model.mtp.* becomes mtp.onnx beside the Omni graphs; the decoder (fed
    inputs_embeds) gains hidden_states; the head shares the text table and lm_head."""
    from reference_fixtures.mtp_fixtures import omni_embedder, write_omni_mtp_checkpoint

    checkpoint, model, head = write_omni_mtp_checkpoint(tmp_path / "checkpoint")
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    assert GraphRole.MTP in [g.role for g in package.graphs]
    manifest = json.loads((out / "manifest.json").read_text())
    shared = {name: sorted(roles) for name, roles in manifest["shared"].items()}
    table = [n for n in shared if n.startswith("language_model.") and "embeddings" in n]
    assert len(table) == 1 and "mtp" in shared[table[0]]
    assert "mtp" in shared["language_model.lm_head.weight"]
    assert not any(name.startswith("language_model.mtp.") for name in manifest["unused"])

    text = model.language_model
    config = package.config
    reference = head_reference(text, head)
    comparisons = drive_head_parity(text, reference, out, config, decoder_input=omni_embedder(out))
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons)


# --------------------------------------------------------------------------- bad input
HEAD_CONFIG = {
    "model_type": "nemotron_h",
    "hybrid_override_pattern": "M*E",
    "num_nextn_predict_layers": 1,
}


def test_head_config_spellings() -> None:
    """mtp_layers_block_type defaults to attention + moe; the legacy pattern "*E" says the
    same; the head's cache names come from its attention block."""
    default = NemotronHConfig.from_dict(HEAD_CONFIG)
    legacy = NemotronHConfig.from_dict({**HEAD_CONFIG, "mtp_hybrid_override_pattern": "*E"})
    listed = NemotronHConfig.from_dict(
        {**HEAD_CONFIG, "mtp_layers_block_type": ["full_attention", "moe"]}
    )
    assert default.mtp_layers == legacy.mtp_layers == listed.mtp_layers
    assert [layer.cache_layer for layer in default.mtp_layers] == ["mtp.0", "mtp.1"]
    assert [c.past_name for c in mtp_cache_tensors(default, ir.DataType.FLOAT)] == [
        "past_key_values.mtp.0.key",
        "past_key_values.mtp.0.value",
    ]
    assert (
        NemotronHConfig.from_dict({**HEAD_CONFIG, "num_nextn_predict_layers": 0}).mtp_layers == ()
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_nextn_predict_layers": -1}, "an integer >= 0"),
        ({"num_nextn_predict_layers": 1.5}, "an integer >= 0"),
        ({"mtp_use_repeated_layer": "yes"}, "expected true or false"),
        ({"mtp_layers_block_type": ["mamba", "moe"]}, "must be attention or moe"),
        (
            {"mtp_layers_block_type": ["attention", "moe"], "mtp_hybrid_override_pattern": "E*"},
            "disagree",
        ),
        ({"mtp_hybrid_override_pattern": ["*", "E"]}, "must be a string"),
    ],
)
def test_bad_head_configs_are_one_clear_error(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        NemotronHConfig.from_dict({**HEAD_CONFIG, **fields})


def test_puzzle_head_moe_needs_its_sizes() -> None:
    from reference_fixtures.puzzle_fixtures import HETEROGENEOUS_BLOCKS, puzzle_raw_config

    raw = puzzle_raw_config(
        HETEROGENEOUS_BLOCKS,
        num_nextn_predict_layers=1,
        mtp_block_configs=[{"block_type": "attention"}, {"block_type": "moe"}],
    )
    with pytest.raises(ConfigError, match=r"mtp_block_configs\[1\] \(moe\) gives no"):
        load_text_config(raw)


def test_an_incomplete_head_is_one_clear_error(nemotron_h, tmp_path: Path) -> None:
    """A checkpoint with the head's fusion projection but not its other tensors fails before
    anything is written, naming what is missing."""
    from safetensors.numpy import load_file, save_file

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for f in nemotron_h["checkpoint"].iterdir():
        if f.name != "model.safetensors":
            (checkpoint / f.name).symlink_to(f)
    tensors = load_file(nemotron_h["checkpoint"] / "model.safetensors")
    del tensors["mtp.layers.1.final_layernorm.weight"]
    save_file(tensors, checkpoint / "model.safetensors")
    with pytest.raises(CheckpointError, match="mtp.layers.1.final_layernorm.weight"):
        mobius_lite.build(checkpoint)


def test_modelopt_nvfp4_head_parity(tmp_path: Path) -> None:
    """ModelOpt NVFP4: the head's linears are NVFP4 as the decoder's, stay packed in mtp.onnx,
    and match the head reference on the independently dequantized weights."""
    import numpy as np

    from reference_fixtures import modelopt_fixtures as mf
    from reference_fixtures.mtp_fixtures import HeadShape, head_tensors

    shape = HeadShape(
        hidden=32, heads=4, kv_heads=2, head_dim=8, experts=8, inner=16, shared_inner=32
    )
    head = head_tensors(shape, np.random.default_rng(11))

    def add_head(tensors: dict, config: dict, _hf: dict | None) -> None:
        config["num_nextn_predict_layers"] = 1
        for name, value in head.items():
            linear = value.ndim == 2 and not name.endswith("gate.weight")
            if not linear:
                tensors[name] = value
                continue
            module = name.removesuffix(".weight")
            for suffix, part in mf.quantize_nvfp4(value).items():
                tensors[f"{module}.{suffix}"] = part
            tensors[f"{module}.input_scale"] = np.array(4.0 / (6.0 * 448.0), dtype=np.float32)

    checkpoint = tmp_path / "checkpoint"
    mf.write_checkpoint("nvfp4", checkpoint, edit=add_head)
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    weights = package.graph(GraphRole.MTP).model.graph.initializers
    assert weights["mtp.layers.0.eh_proj.weight"].dtype == ir.DataType.UINT8  # packed NVFP4

    reference_decoder = mf.dense_reference(checkpoint, tmp_path / "reference")
    dense = mf.dequantized_state_dict(checkpoint)
    reference = head_reference(
        reference_decoder, {n: v for n, v in dense.items() if n.startswith("mtp.")}
    )
    comparisons = drive_head_parity(reference_decoder, reference, out, package.config)
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons)


def test_gguf_head_metadata(tmp_path: Path) -> None:
    """The nextn block is cut from the decoder's layers; config.json may say the same in
    transformers' spelling; a head block with other head counts is one clear error."""
    from mobius_lite.configs.gguf_metadata import config_from_gguf
    from reference_fixtures.gguf_fixtures import dequantized_arrays
    from reference_fixtures.mtp_fixtures import HEAD_PATTERN

    path = _gguf_with_head(tmp_path)
    _, metadata = dequantized_arrays(path)
    given = {"mtp_layers_block_type": ["full_attention", "moe"], "num_nextn_predict_layers": 1}
    config = NemotronHConfig.from_dict(config_from_gguf(metadata, given))
    assert config.num_hidden_layers == len(HEAD_PATTERN) and config.has_mtp_head
    arch = metadata["general.architecture"]
    kv = list(metadata[f"{arch}.attention.head_count_kv"])
    kv[-1] = 1  # the head's block: 1 KV head, the decoder's attention layer 2
    with pytest.raises(ConfigError, match="multi-token-prediction block 4 has num_key_value"):
        config_from_gguf({**metadata, f"{arch}.attention.head_count_kv": kv})
    with pytest.raises(ConfigError, match="nextn_predict_layers=2"):
        config_from_gguf({**metadata, f"{arch}.nextn_predict_layers": 2})


def _gguf_with_head(tmp_path: Path) -> Path:
    import numpy as np

    from reference_fixtures.gguf_fixtures import write_gguf
    from reference_fixtures.mtp_fixtures import (
        HEAD_PATTERN,
        global_head_shape,
        head_tensors,
        nextn_tensors,
    )
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference({"layers_block_type": HEAD_PATTERN}, seed=3)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(7))
    path = tmp_path / "tiny.gguf"
    write_gguf(path, model, "nemotron_h_moe", {}, nextn=nextn_tensors(head, model.config))
    return path


def test_tied_checkpoint_head_scores_with_the_table(tmp_path: Path) -> None:
    """A tied checkpoint without lm_head.weight: the head's logits use the embedding table,
    stored once for decoder and head."""
    from safetensors.numpy import load_file, save_file

    checkpoint, model, head = write_nemotron_h_mtp_checkpoint(
        tmp_path / "checkpoint", {"tie_word_embeddings": True}
    )
    model.lm_head.weight.data = model.model.embeddings.weight.data.clone()
    tensors = load_file(checkpoint / "model.safetensors")
    tensors.pop("lm_head.weight", None)
    save_file(tensors, checkpoint / "model.safetensors", metadata={"format": "pt"})
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["shared"]) == ["backbone.embeddings.weight"]
    comparisons = drive_head_parity(
        model, head_reference(model, head), out, package.config, decode_steps=5
    )
    assert len(comparisons) == 6 * 5
    assert not _failures(comparisons)


# --------------------------------------------------------------------------- newest layouts
@pytest.mark.parametrize("head_prefix", ["", "model."])
def test_lightning_head_repeats_one_depth(tmp_path: Path, head_prefix: str) -> None:
    """Nemotron 3.5 Lightning's layout: transformers' `model.` names, pattern "*E",
    num_nextn_predict_layers 2 over one depth of weights (mtp.layers.0-1, or under
    model.mtp.): mtp.onnx is that depth; its steps and its second, chained draft (the same
    weights over the first draft and the head's own hidden state) match the reference."""
    from reference_fixtures.mtp_fixtures import drive_chained_drafts, write_lightning_checkpoint

    checkpoint, model, head = write_lightning_checkpoint(tmp_path / "checkpoint", head_prefix)
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    config = package.config
    assert (config.num_nextn_predict_layers, config.mtp_depths) == (2, 1)
    assert [g.role for g in package.graphs] == [GraphRole.DECODER, GraphRole.MTP]
    head_sources = {s for b in package.graph(GraphRole.MTP).plan.bindings for s in b.sources}
    assert {head_prefix + n for n in head} | set(SHARED) == head_sources
    reference = head_reference(model, head)
    steps = drive_head_parity(model, reference, out, config, decode_steps=3)
    assert len(steps) == 5 * 4  # hidden + 4 head arrays, prefill + 3 steps
    chained = drive_chained_drafts(model, head_reference(model, head), out, config, drafts=2)
    assert len(chained) == 4 * 2
    assert not _failures(steps + chained)


def test_lightning_speculation_keeps_the_greedy_tokens(tmp_path: Path) -> None:
    """The depth-2 head drafts K=2 chained tokens a round; the tokens are plain greedy's."""
    import numpy as np

    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.speculative import speculative_greedy
    from reference_fixtures.mtp_fixtures import write_lightning_checkpoint

    checkpoint, _, _ = write_lightning_checkpoint(tmp_path / "checkpoint")
    out = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    prompt = np.array([[5, 17, 33, 8, 61, 12]], dtype=np.int64)
    plain = greedy(DecoderSession(out / "model.onnx"), prompt, 12).tokens
    tokens, stats = speculative_greedy(
        DecoderSession(out / "model.onnx"), open_head(out), prompt, 12, k=2, adaptive=False
    )
    assert tokens[0] == plain
    assert stats.as_dict()["proposed"] > 0


def _head_with_blocks(source: Path, destination: Path, config_edit, extra_depths: int) -> Path:
    """The fixture checkpoint with its config edited and its head's blocks copied
    `extra_depths` times further (mtp.layers.2-3, ...: distinct depths' names)."""
    import re

    from safetensors.numpy import load_file, save_file

    from reference_fixtures.mtp_fixtures import edit_config

    destination.mkdir()
    for f in source.iterdir():
        if f.name != "model.safetensors":
            (destination / f.name).write_bytes(f.read_bytes())
    tensors = load_file(source / "model.safetensors")
    block = re.compile(r"^mtp\.layers\.(\d+)\.")
    for depth in range(1, extra_depths + 1):
        for name, value in list(tensors.items()):
            m = block.match(name)
            if m and int(m[1]) < 2:
                tensors[f"mtp.layers.{int(m[1]) + 2 * depth}." + name[m.end() :]] = value
    save_file(tensors, destination / "model.safetensors", metadata={"format": "pt"})
    edit_config(destination, config_edit)
    return destination


@pytest.mark.parametrize(
    ("fields", "extra_depths", "message"),
    [
        # two distinct depths in the weights, a config that says one repeated depth
        ({"num_nextn_predict_layers": 2}, 1, "mtp.layers.0-3: 2 distinct depths of '[*]E'"),
        # the config says two distinct depths, the weights hold three
        (
            {"num_nextn_predict_layers": 2, "mtp_use_repeated_layer": False},
            2,
            "mtp.layers.0-5: 3 distinct depths .* describes 2 depth",
        ),
        # a config of one depth, weights of another count
        ({"num_nextn_predict_layers": 1}, 2, "mtp.layers.0-5: 3 distinct depths"),
    ],
)
def test_head_depths_the_weights_do_not_hold_are_one_clear_error(
    nemotron_h, tmp_path: Path, fields: dict, extra_depths: int, message: str
) -> None:
    checkpoint = _head_with_blocks(
        nemotron_h["checkpoint"],
        tmp_path / "checkpoint",
        lambda raw: raw.update(fields),
        extra_depths,
    )
    with pytest.raises(ConfigError, match=message):
        mobius_lite.build(checkpoint)
    assert not (tmp_path / "package").exists()


def test_distinct_depths_export_one_graph_per_depth(nemotron_h, tmp_path: Path) -> None:
    """Two distinct depths in the weights and the config (mtp_use_repeated_layer false), once
    refused: mtp.onnx binds mtp.layers.0-1, mtp_depth1.onnx mtp.layers.2-3
    (tests/test_mtp_depths.py checks them against the reference)."""
    from mobius_lite.enums import GraphId

    checkpoint = _head_with_blocks(
        nemotron_h["checkpoint"],
        tmp_path / "checkpoint",
        lambda raw: raw.update(num_nextn_predict_layers=2, mtp_use_repeated_layer=False),
        1,
    )
    package = mobius_lite.build(checkpoint)
    assert [g.graph_id for g in package.graphs] == [
        GraphId(GraphRole.DECODER),
        GraphId(GraphRole.MTP),
        GraphId(GraphRole.MTP, 1),
    ]
    for record, blocks in zip(package.graphs[1:], (("0", "1"), ("2", "3")), strict=True):
        head = {s for b in record.plan.bindings for s in b.sources} - set(SHARED)
        assert head and {name.split(".")[2] for name in head} == set(blocks)


def test_head_depth_refusals_from_the_cli(nemotron_h, tmp_path: Path) -> None:
    """`mobius build` on a head whose depths the config does not describe: exit 2, one line."""
    import subprocess
    import sys

    checkpoint = _head_with_blocks(
        nemotron_h["checkpoint"],
        tmp_path / "checkpoint",
        lambda raw: raw.update(num_nextn_predict_layers=2),
        1,
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
    assert "2 distinct depths" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_super_latent_head_parity(tmp_path: Path) -> None:
    """Nemotron 3 Super / Ultra: the head's MoE block is a latent MoE (fc1 / fc2 latent
    projections around experts of the latent width), released `backbone.` names; steps and a
    chained second draft match the head reference (transformers' NemotronHMoE with latent)."""
    from reference_fixtures.mtp_fixtures import drive_chained_drafts, write_super_checkpoint

    checkpoint, model, head = write_super_checkpoint(tmp_path / "checkpoint")
    assert "mtp.layers.1.mixer.fc1_latent_proj.weight" in head
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    config = package.config
    assert config.mtp_layers[1].moe.latent_size == 16
    weights = package.graph(GraphRole.MTP).model.graph.initializers
    assert weights["mtp.layers.1.mixer.fc2_latent_proj.weight"].shape == (32, 16)
    steps = drive_head_parity(model, head_reference(model, head), out, config, decode_steps=3)
    chained = drive_chained_drafts(model, head_reference(model, head), out, config, drafts=2)
    assert (len(steps), len(chained)) == (5 * 4, 4 * 2)
    assert not _failures(steps + chained)


def test_gguf_latent_head_parity(tmp_path: Path) -> None:
    """A Super / Ultra-style head in llama.cpp's layout (block n_layer, ffn_latent_down /
    ffn_latent_up beside the stacked experts), Q8_0: the head's latent MoE matches the
    reference on the independently dequantized weights."""
    import numpy as np
    import torch
    from transformers import NemotronHForCausalLM

    from reference_fixtures.gguf_fixtures import dequantized_state_dict, write_gguf
    from reference_fixtures.mtp_fixtures import (
        HEAD_PATTERN,
        global_head_shape,
        head_from_gguf,
        head_tensors,
        nextn_tensors,
    )
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference({"layers_block_type": HEAD_PATTERN, "moe_latent_size": 16}, seed=5)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(8))
    assert "mtp.layers.1.mixer.fc1_latent_proj.weight" in head
    path = tmp_path / "tiny.gguf"
    write_gguf(
        path, model, "nemotron_h_moe", {r".": "Q8_0"}, nextn=nextn_tensors(head, model.config)
    )
    package = mobius_lite.build(path)
    out = package.save(tmp_path / "package", quiet=True)
    assert package.config.mtp_layers[1].moe.latent_size == 16
    reference_decoder = NemotronHForCausalLM(model.config).eval()
    reference_decoder.load_state_dict(dequantized_state_dict(path), strict=True)
    head_arrays, _ = head_from_gguf(path)
    assert set(head_arrays) == set(head)
    with torch.no_grad():
        comparisons = drive_head_parity(
            reference_decoder,
            head_reference(reference_decoder, head_arrays),
            out,
            package.config,
            decode_steps=3,
        )
    assert len(comparisons) == 5 * 4
    assert not _failures(comparisons)


def test_head_logits_to_keep_is_the_last_positions_logits(nemotron_h) -> None:
    """A draft asks the head for the last position's logits only (run/speculative.py): the
    last position of a full call (whose every position test_safetensors_head_parity holds
    to the reference) under the FP32 gates, with the same caches bit for bit, and the last
    position's hidden state (the experts after the attention ran on it alone), at batch 2
    and for a multi-position call."""
    import numpy as np

    from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
    from mobius_lite.run.mtp_head import open_head

    config = NemotronHConfig.from_file(nemotron_h["checkpoint"])
    rng = np.random.default_rng(5)
    ids = rng.integers(0, config.vocab_size, size=(2, 6)).astype(np.int64)
    hidden = rng.standard_normal((2, 6, config.hidden_size)).astype(np.float32)
    mask = np.ones((2, 6), np.int64)
    full, last = open_head(nemotron_h["out"]), open_head(nemotron_h["out"])
    assert full.keeps_logits
    for head in (full, last):
        head.reset(2)
    full_logits, full_hidden = full.step(ids, hidden, mask)
    last_logits, last_hidden = last.step(ids, hidden, mask, logits_to_keep=1)
    assert full_logits.shape == (2, 6, config.vocab_size)
    assert last_logits.shape == (2, 1, config.vocab_size)
    assert last_hidden.shape == (2, 1, config.hidden_size)
    # the experts' sums over one row against six round differently: the FP32 gates
    for name, kept, every in (
        ("logits", last_logits[:, 0], full_logits[:, -1]),
        ("hidden", last_hidden[:, 0], full_hidden[:, -1]),
    ):
        assert compare(name, kept, every).passes(FP32_NRMSE, FP32_COSINE)
    for name, value in full.past.items():
        np.testing.assert_array_equal(last.past[name], value)


def test_head_session_threads_do_not_spin(nemotron_h) -> None:
    """The head takes turns with the decoder on the same cores: its session's intra-op
    threads block when a call ends (a spinning pool kept the cores from the decoder)."""
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.ort_session import ALLOW_SPINNING

    options = open_head(nemotron_h["out"]).session.get_session_options()
    assert options.get_session_config_entry(ALLOW_SPINNING) == "0"
