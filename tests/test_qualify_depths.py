"""`mobius qualify`'s mtp_head verdict on a head of distinct depths (mtp_use_repeated_layer
false): every depth's graph (mtp.onnx, mtp_depth{j}.onnx) against the reference of its depth
under the FP32 gates, the verdict failing, and naming the depth, when one later depth's graph
is wrong. The reference qualify uses for depth j (evaluation/mtp_reference.py) is itself held
to the independent one (reference_fixtures/mtp_reference.py's MTPDepthReference)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mobius_lite
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.evaluation.qualify import qualify, rescore
from mobius_lite.evaluation.scoring import FAIL, PASS
from reference_fixtures.mtp_fixtures import depth_references, write_distinct_depths_checkpoint

STEPS = 3  # prefill + 3 decode calls: 4 step names, depth j compared on the first 4 - j


@pytest.fixture(scope="module", params=[2, 3], ids=["D2", "D3"])
def built(request, tmp_path_factory: pytest.TempPathFactory) -> dict:
    depths = request.param
    root = tmp_path_factory.mktemp(f"qualify_depths{depths}")
    checkpoint, model, head = write_distinct_depths_checkpoint(
        root / "checkpoint", "*E", depths, seed=6 + depths
    )
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    return dict(
        depths=depths, root=root, checkpoint=checkpoint, model=model, head=head, package=package
    )


def test_every_depth_passes_and_rescores(built) -> None:
    """Each depth's logits, mtp_hidden_states and K/V against its reference within the gates
    (depth j at every step whose token t+j+1 is known), the summary naming each depth's graph;
    the speculative run drafts through the chain at K = 2 with plain greedy's tokens; the
    re-scored run gives the same per-depth verdicts."""
    depths, root = built["depths"], built["root"]
    report = qualify(built["package"], built["checkpoint"], output=root / "run", steps=STEPS)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert head.evidence["depth_status"] == {str(j): PASS for j in range(depths)}
    assert head.evidence["parity"]["families"]["logits"]["compared"] == STEPS + 1
    for j in range(1, depths):
        families = head.evidence["depth_parity"][str(j)]["families"]
        assert families["logits"]["compared"] == STEPS + 1 - j, j
        assert families["attention_kv"]["compared"] == 2 * (STEPS + 1 - j), j
        assert f"depth {j} (mtp_depth{j}.onnx) " in head.summary
    assert "depth 0 (mtp.onnx) " in head.summary
    speculative = head.evidence["speculative"]
    assert speculative["k"] == 2 and speculative["k_rounds"].get(2, 0) > 0
    assert speculative["tokens"] == speculative["plain_tokens"]
    assert speculative["plain_tokens"] == report.verdicts["generation"].evidence["actual"]
    hashed = set(report.run["files"]["sha256"])
    assert {"mtp.onnx", *(f"mtp_depth{j}.onnx" for j in range(1, depths))} <= hashed
    assert f"{depths} distinct depths" in report.run["mtp"]["depths"]
    again = rescore(root / "run")
    assert again.verdicts["mtp_head"].status == PASS
    assert again.verdicts["mtp_head"].evidence["depth_status"] == head.evidence["depth_status"]
    assert again.verdicts["numerical_parity"].status == PASS  # the head's arrays stay apart


def test_qualifys_reference_of_each_depth_is_the_independent_one(built) -> None:
    """MtpReference(checkpoint, j), which qualify compares depth j's graph with, equals
    MTPDepthReference of depth j (transformers' modules over mtp.layers.{2j, 2j+1}) on the same
    inputs: a prefill and two cached steps, every output under the FP32 gates."""
    from mobius_lite.evaluation.mtp_reference import MtpReference

    depths, vocab = built["depths"], built["model"].config.vocab_size
    independent = depth_references(built["model"], built["head"], "*E", depths)
    rng = np.random.default_rng(depths)
    width = built["model"].config.hidden_size
    for j in range(depths):
        ours = MtpReference(built["checkpoint"], j)
        ours.reset(1)
        independent[j].reset()
        seen = 0
        for length in (6, 1, 1):
            ids = rng.integers(3, vocab, (1, length)).astype(np.int64)
            hidden = rng.standard_normal((1, length, width)).astype(np.float32)
            seen += length
            mask = np.ones((1, seen), np.int64)
            mine, theirs = ours.step(ids, hidden, mask), independent[j].step(ids, hidden, mask)
            assert sorted(mine) == sorted(theirs)
            assert f"present.mtp.{2 * j}.key" in mine
            for name, value in theirs.items():
                result = compare(f"depth{j}/{name}", mine[name], value)
                assert result.passes(FP32_NRMSE, FP32_COSINE), (j, name, result.nrmse)


def _negate_in_package(package: Path, graph: str, initializer: str) -> None:
    """Overwrite one initializer's bytes in the package's external data with their negation
    (the manifest says where they are)."""
    manifest = json.loads((package / "manifest.json").read_text())
    where = manifest["graphs"][graph]["initializers"][initializer]
    assert where["dtype"] == "FLOAT"
    with open(package / where["file"], "r+b") as f:
        f.seek(where["offset"])
        values = np.frombuffer(f.read(where["length"]), np.float32)
        f.seek(where["offset"])
        f.write((-values).tobytes())


def test_a_wrong_later_depth_fails_and_is_named(built, tmp_path: Path) -> None:
    """The package's depth-1 eh_proj (bound by mtp_depth1.onnx alone) negated: the verdict
    FAILs naming depth 1 and its graph; depth 0, and a depth 2 (fed the package's depth-1
    outputs on both sides), still pass; the decoder's verdicts are untouched."""
    depths = built["depths"]
    package = tmp_path / "package"
    shutil.copytree(built["package"], package)
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["sources"]["mtp.layers.2.eh_proj.weight"]["graphs"] == ["mtp_depth1"]
    _negate_in_package(package, "mtp_depth1", "mtp.layers.2.eh_proj.weight")
    report = qualify(package, built["checkpoint"], output=tmp_path / "run", steps=STEPS)
    head = report.verdicts["mtp_head"]
    assert head.status == FAIL, head.summary
    assert head.summary.startswith("head arrays: depth 1 (mtp_depth1.onnx) ")
    assert "depth 0" not in head.summary and "depth 2" not in head.summary
    expected = {str(j): PASS for j in range(depths)} | {"1": FAIL}
    assert head.evidence["depth_status"] == expected
    speculative = head.evidence["speculative"]
    assert speculative["tokens"] == speculative["plain_tokens"]  # exact whatever the drafts
    assert report.verdicts["numerical_parity"].status == PASS
    assert report.verdicts["generation"].status == PASS
    assert report.exit_code == 1
