"""`mobius qualify` on a package with an MTP head: the head's own verdict (its arrays against the
torch reference evaluation/mtp_reference.py on the same inputs, speculative tokens equal to the
plain ones, the acceptance rate reported), re-scored offline, and failing when the head is not
the source's."""

from __future__ import annotations

import json

import pytest
from safetensors.numpy import load_file, save_file

import mobius_lite
from mobius_lite.evaluation.qualify import qualify, rescore
from mobius_lite.evaluation.qualify_report import format_table
from mobius_lite.evaluation.scoring import FAIL, PASS
from reference_fixtures.mtp_fixtures import write_nemotron_h_mtp_checkpoint


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("qualify_mtp")
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(root / "checkpoint")
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    return root, checkpoint, package


def test_head_verdict_passes_and_rescores(built) -> None:
    root, checkpoint, package = built
    report = qualify(package, checkpoint, output=root / "run", steps=5)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    families = head.evidence["parity"]["families"]
    assert families["logits"]["compared"] == 6 and families["attention_kv"]["compared"] == 12
    assert families["other"]["compared"] == 6  # mtp_hidden_states, prefill + 5 steps
    speculative = head.evidence["speculative"]
    assert speculative["tokens"] == speculative["plain_tokens"]
    assert speculative["plain_tokens"] == report.verdicts["generation"].evidence["actual"]
    assert speculative["proposed"] > 0 and "acceptance" in head.summary
    assert "mtp_head" in format_table(report)
    saved = json.loads((root / "run" / "report.json").read_text())
    assert saved["mtp_head"]["status"] == PASS
    again = rescore(root / "run")
    assert again.verdicts["mtp_head"].status == PASS
    assert again.verdicts["numerical_parity"].status == PASS  # the head's arrays stay apart


def test_head_verdict_fails_when_the_head_is_not_the_sources(built, tmp_path) -> None:
    root, checkpoint, package = built
    edited = tmp_path / "checkpoint"
    edited.mkdir()
    for path in checkpoint.iterdir():
        (edited / path.name).write_bytes(path.read_bytes())
    tensors = load_file(edited / "model.safetensors")
    tensors["mtp.layers.0.eh_proj.weight"] = tensors["mtp.layers.0.eh_proj.weight"] * -1.0
    save_file(tensors, edited / "model.safetensors", metadata={"format": "pt"})
    report = qualify(package, edited, output=tmp_path / "run", steps=2)
    assert report.verdicts["mtp_head"].status == FAIL
    assert report.verdicts["numerical_parity"].status == PASS  # the decoder is still the model
    assert report.exit_code == 1


def test_omni_head_verdict(tmp_path) -> None:
    """An Omni package's head: fed the pruned prompt's ids and the decoder's hidden states,
    its speculative decoding fed embeddings; re-scored offline alike."""
    from reference_fixtures.mtp_fixtures import write_omni_mtp_checkpoint

    checkpoint, _, _ = write_omni_mtp_checkpoint(tmp_path / "checkpoint")
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    report = qualify(package, checkpoint, output=tmp_path / "run", steps=2)
    assert {name: v.status for name, v in report.verdicts.items()} == dict.fromkeys(
        ("graph_validity", "source_fidelity", "numerical_parity", "generation", "mtp_head"), PASS
    )
    speculative = report.verdicts["mtp_head"].evidence["speculative"]
    assert speculative["tokens"] == report.verdicts["generation"].evidence["actual"]
    assert rescore(tmp_path / "run").verdicts["mtp_head"].status == PASS


def test_puzzle_head_verdict(tmp_path) -> None:
    """A Puzzle head has its own attention and MoE sizes (mtp_block_configs) and its tensors in
    mtp.safetensors: the reference reads both."""
    from reference_fixtures.mtp_fixtures import write_puzzle_mtp_checkpoint

    checkpoint, _, _, _ = write_puzzle_mtp_checkpoint(tmp_path / "checkpoint")
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    report = qualify(package, checkpoint, output=tmp_path / "run", steps=2)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert report.verdicts["numerical_parity"].status == PASS


@pytest.mark.parametrize("layout", ["lightning", "super"])
def test_head_verdict_on_the_newest_layouts(layout: str, tmp_path) -> None:
    """Nemotron 3.5 Lightning (depth 2 over one depth of weights, here under model.mtp.) and
    Nemotron 3 Super / Ultra (latent MoE, backbone. names): qualify's head reference reads the
    head where the checkpoint keeps it and the verdict passes."""
    from reference_fixtures.mtp_fixtures import write_lightning_checkpoint, write_super_checkpoint

    if layout == "lightning":
        checkpoint, _, _ = write_lightning_checkpoint(tmp_path / "checkpoint", "model.")
    else:
        checkpoint, _, _ = write_super_checkpoint(tmp_path / "checkpoint")
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    report = qualify(package, checkpoint, output=tmp_path / "run", steps=3)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert head.evidence["parity"]["families"]["logits"]["compared"] == 4
    speculative = head.evidence["speculative"]
    assert speculative["tokens"] == speculative["plain_tokens"]


def _gguf_with_head(path, head_seed: int):
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
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(head_seed))
    nextn = nextn_tensors(head, model.config)
    write_gguf(path, model, "nemotron_h_moe", {r".": "Q8_0"}, nextn=nextn)
    return path


def test_gguf_head_verdict_reads_the_files_nextn_block(tmp_path) -> None:
    """Issue 30, item 10: the head built from a GGUF's nextn block is checked against that
    block dequantized (it was NOT_RUN with a NotADirectoryError); a GGUF whose head differs
    (same config, other head values) fails the head's verdict alone."""
    source = _gguf_with_head(tmp_path / "tiny-Q8_0.gguf", head_seed=7)
    package = mobius_lite.build(source).save(tmp_path / "package", quiet=True)
    report = qualify(package, source, output=tmp_path / "run", steps=3)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert head.evidence["parity"]["families"]["logits"]["compared"] == 4
    assert report.exit_code == 0

    other = _gguf_with_head(tmp_path / "other-Q8_0.gguf", head_seed=8)
    report = qualify(package, other, output=tmp_path / "run-other", steps=1)
    assert report.verdicts["mtp_head"].status == FAIL
    assert report.verdicts["numerical_parity"].status == PASS  # the decoder is the same model
