"""Source errors say what the file holds and what applies to it: a wrong-shape GGUF attention
tensor is named with the shape found and expected; a GGUF-only build does not point at a
config.json it never read; Omni's missing tensors are named as the checkpoint names them; a
GGUF tokenizer without merges is one line, not transformers' KeyError."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
)

from mobius_lite.cli.main import main
from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, converter_tensors, write_gguf
from reference_fixtures.nemotron_reference import make_reference
from reference_fixtures.omni_fixtures import omni_config

HYBRID = dict(layers_block_type=["mamba", "attention", "mlp", "mamba"])


def build(model: Path, out: Path, capsys, *extra: str) -> tuple[int, str]:
    capsys.readouterr()  # what the fixture writing printed
    code = main(["build", "--model", str(model), "--output", str(out), "-q", *extra])
    return code, capsys.readouterr().err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(("tensor", "rows", "expected"), [("attn_q", 34, 32), ("attn_k", 18, 16)])
def test_wrong_shape_gguf_attention_tensor_is_named(tensor, rows, expected, tmp_path, capsys):
    """Rows that no per-head permutation can undo: the tensor, its shape and the expected one."""
    model = make_reference(HYBRID, seed=1)
    name = f"blk.1.{tensor}.weight"
    good = converter_tensors(model, "nemotron_h")[name]
    bad = np.concatenate([good, good[: rows - good.shape[0]]]).astype(np.float32)
    (path,) = write_gguf(tmp_path / "bad.gguf", model, "nemotron_h", extra_tensors={name: bad})
    code, err = build(path, tmp_path / "pkg", capsys)
    line = one_line(err)
    assert code == 2
    assert f"{name}: checkpoint [{rows}, 32], expected [{expected}, 32]" in line, line
    assert "config.json" not in line  # a GGUF-only build read no config.json
    assert "GGUF file's own metadata" in line
    assert not (tmp_path / "pkg").exists()


def test_gguf_build_with_config_points_at_that_config(tmp_path, capsys) -> None:
    model = make_reference(HYBRID, seed=1)
    name = "blk.1.attn_q.weight"
    short = converter_tensors(model, "nemotron_h")[name][:-8].copy()
    (path,) = write_gguf(tmp_path / "bad.gguf", model, "nemotron_h", extra_tensors={name: short})
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"chunk_size": 4}))
    code, err = build(path, tmp_path / "pkg", capsys, "--config", str(config))
    line = one_line(err)
    assert code == 2 and f"{name}: checkpoint [24, 32], expected [32, 32]" in line, line
    assert f"Check that --config {config} belongs to this GGUF file" in line


def test_omni_missing_tensor_is_named_as_the_checkpoint_names_it(tmp_path, capsys) -> None:
    config = omni_config(final_layernorm=False, pruning_rate=0.4)
    config.image_token_id, config.video_token_id = 45, 46
    NemotronH_Omni_Reasoning_V3(config).save_pretrained(tmp_path / "checkpoint")
    weights = tmp_path / "checkpoint" / "model.safetensors"
    tensors = load_file(weights)
    released = "vision_model.radio_model.model.blocks.1.attn.qkv.weight"
    assert released in tensors  # the name transformers' save_pretrained writes
    del tensors[released]
    save_file(tensors, weights)
    code, err = build(tmp_path / "checkpoint", tmp_path / "pkg", capsys)
    line = one_line(err)
    assert code == 2
    assert f"missing tensors: {released} (graph parameter " in line, line
    assert "vision_model.encoder.layer.1.attention.qkv.weight)" in line


def test_gguf_tokenizer_without_merges_is_one_clear_line(tmp_path, capsys, monkeypatch) -> None:
    """llama.cpp refuses a byte-level BPE vocabulary without merges; so does the build, in one
    line (transformers alone raises KeyError: 'scores')."""
    model = make_reference({**HYBRID, "vocab_size": 304}, seed=1)
    tokenizer = build_bpe_tokenizer(["a tiny corpus for a tiny tokenizer"] * 4, vocab_size=300)
    monkeypatch.setattr(gguf.GGUFWriter, "add_token_merges", lambda self, merges: None)
    (path,) = write_gguf(tmp_path / "nomerges.gguf", model, "nemotron_h", tokenizer=tokenizer)
    monkeypatch.undo()
    assert "tokenizer.ggml.merges" not in gguf.GGUFReader(path).fields  # really none
    code, err = build(path, tmp_path / "pkg", capsys)
    line = one_line(err)
    assert code == 2 and "KeyError" not in line
    assert "has no tokenizer.ggml.merges" in line and "convert_hf_to_gguf.py" in line, line
    assert not (tmp_path / "pkg").exists()
