"""`mobius qualify`'s mtp_head verdict on a head of distinct depths (mtp_use_repeated_layer
false): every depth's graph (mtp.onnx, mtp_depth{j}.onnx) against the reference of its depth
under the FP32 gates, the verdict failing, and naming the depth, when one later depth's graph
is wrong. The reference qualify uses for depth j (evaluation/mtp_reference.py) is itself held
to the independent one (reference_fixtures/mtp_reference.py's MTPDepthReference). Heads of
pattern "*E" (as released) and "*E*E" (two attention caches and two MoE blocks a depth), the
latter repeated by chained drafts or as two distinct depths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mobius_lite
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.evaluation.qualify import qualify, rescore
from mobius_lite.evaluation.scoring import FAIL, NOT_RUN, PASS
from reference_fixtures.mtp_fixtures import (
    depth_references,
    edit_config,
    write_distinct_depths_checkpoint,
)

STEPS = 3  # prefill + 3 decode calls: 4 step names, depth j compared on the first 4 - j
TWO_ATTENTION = "*E*E"  # caches at blocks 0 and 2 of a depth (global 4j, 4j + 2)
PAD = 3  # left padding of a batch's second row
# the tensor negated in depth j's graph: depth 0's second attention block's v_proj, depth 1's
# second MoE block's shared expert
CORRUPTED = {
    0: "mtp.layers.2.mixer.v_proj.weight",
    1: "mtp.layers.7.mixer.shared_experts.down_proj.weight",
}


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


# --------------------------------------------------------------------------- "*E*E"
@pytest.fixture(scope="module", params=[1, 2], ids=["repeated", "D2"])
def two_attention(request, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A "*E*E" head: one depth that both chained drafts repeat (num_nextn_predict_layers 2,
    mtp_use_repeated_layer true, blocks mtp.layers.0-3), or two distinct depths (0-7)."""
    depths = request.param
    root = tmp_path_factory.mktemp(f"qualify_two_attention{depths}")
    checkpoint, model, head = write_distinct_depths_checkpoint(
        root / "checkpoint", TWO_ATTENTION, depths, seed=20 + depths
    )
    if depths == 1:
        edit_config(
            checkpoint,
            lambda raw: raw.update(num_nextn_predict_layers=2, mtp_use_repeated_layer=True),
        )
    package = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    return dict(
        depths=depths, root=root, checkpoint=checkpoint, model=model, head=head, package=package
    )


def _compare_real(
    name: str, mine: np.ndarray, theirs: np.ndarray, real: np.ndarray, cache: bool
) -> None:
    """One output at the real (not padded) positions, under the FP32 gates; a cache [B, H,
    T, D] at its real key positions."""
    if cache:
        mine, theirs = mine.transpose(0, 2, 1, 3), theirs.transpose(0, 2, 1, 3)
    result = compare(name, mine[real], theirs[real])
    assert result.passes(FP32_NRMSE, FP32_COSINE), (name, result.nrmse, result.cosine)


def test_reference_of_a_two_attention_head_is_the_independent_one(two_attention) -> None:
    """MtpReference(checkpoint, j) of a "*E*E" head equals MTPDepthReference of depth j
    (transformers' attention and MoE modules over mtp.layers.{4j .. 4j+3}): batch 2, the
    second row left-padded, a prefill and two cached steps; logits, mtp_hidden_states and both
    attention blocks' caches (present.mtp.{4j}, present.mtp.{4j+2}) at the real positions."""
    from mobius_lite.evaluation.mtp_reference import MtpReference

    model, depths = two_attention["model"], two_attention["depths"]
    vocab, width = model.config.vocab_size, model.config.hidden_size
    independent = depth_references(model, two_attention["head"], TWO_ATTENTION, depths)
    rng = np.random.default_rng(30 + depths)
    for j in range(depths):
        ours = MtpReference(two_attention["checkpoint"], j)
        assert ours.pattern == TWO_ATTENTION and ours.cache_indices == [4 * j, 4 * j + 2]
        caches = [
            f"present.mtp.{i}.{role}" for i in (4 * j, 4 * j + 2) for role in ("key", "value")
        ]
        ours.reset(2)
        independent[j].reset()
        mask = np.zeros((2, 0), np.int64)
        for length in (7, 1, 1):
            ids = rng.integers(3, vocab, (2, length)).astype(np.int64)
            hidden = rng.standard_normal((2, length, width)).astype(np.float32)
            new = np.ones((2, length), np.int64)
            if not mask.shape[1]:
                new[1, :PAD] = 0
                ids[1, :PAD] = 0
            mask = np.concatenate([mask, new], axis=1)
            mine, theirs = ours.step(ids, hidden, mask), independent[j].step(ids, hidden, mask)
            assert (
                sorted(mine) == sorted(theirs) == sorted(["logits", "mtp_hidden_states", *caches])
            )
            for name in ("logits", "mtp_hidden_states"):
                _compare_real(f"depth{j}/{name}", mine[name], theirs[name], new > 0, False)
            for name in caches:
                _compare_real(f"depth{j}/{name}", mine[name], theirs[name], mask > 0, True)


def test_a_two_attention_head_passes(two_attention) -> None:
    """qualify's mtp_head verdict on a "*E*E" package: every depth's logits,
    mtp_hidden_states and both caches (4 K/V arrays a step) within the gates, no array on one
    side only; speculative tokens exactly plain greedy's."""
    depths, root = two_attention["depths"], two_attention["root"]
    report = qualify(
        two_attention["package"], two_attention["checkpoint"], output=root / "run", steps=STEPS
    )
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    parities = [head.evidence["parity"]]
    if depths > 1:
        assert head.evidence["depth_status"] == {"0": PASS, "1": PASS}
        parities.append(head.evidence["depth_parity"]["1"])
        assert "depth 1 (mtp_depth1.onnx) " in head.summary
    steps = len(report.run["steps"])
    for j, parity in enumerate(parities):
        assert parity["one_sided_arrays"] == [], j
        assert parity["families"]["logits"]["compared"] == steps - j, j
        assert parity["families"]["attention_kv"]["compared"] == 4 * (steps - j), j
        names = {c["name"].split("/")[-1] for c in parity["comparisons"]}
        assert {f"present.mtp.{4 * j + 2}.value", f"present.mtp.{4 * j}.key"} <= names
    speculative = head.evidence["speculative"]
    assert speculative["tokens"] == speculative["plain_tokens"]
    assert report.verdicts["numerical_parity"].status == PASS


def test_a_wrong_block_of_a_two_attention_head_fails_naming_its_depth(
    two_attention, tmp_path: Path
) -> None:
    """One tensor of a "*E*E" depth negated in the package's external data (read by that
    depth's graph alone): depth 0's second attention block's v_proj, or depth 1's second MoE
    block's shared expert. The verdict FAILs, a head of distinct depths naming that depth and
    its graph, the other depth passing; the v_proj case fails that block's value cache and
    leaves both key caches and the first block's value cache within the gates."""
    depths = two_attention["depths"]
    for j in range(depths):
        graph, initializer = ("mtp" if j == 0 else f"mtp_depth{j}"), CORRUPTED[j]
        package = tmp_path / f"package{j}"
        shutil.copytree(two_attention["package"], package)
        manifest = json.loads((package / "manifest.json").read_text())
        assert manifest["sources"][initializer]["graphs"] == [graph]
        _negate_in_package(package, graph, initializer)
        report = qualify(
            package, two_attention["checkpoint"], output=tmp_path / f"run{j}", steps=STEPS
        )
        head = report.verdicts["mtp_head"]
        assert head.status == FAIL, head.summary
        assert report.verdicts["numerical_parity"].status == PASS
        parity = head.evidence["parity"] if j == 0 else head.evidence["depth_parity"][str(j)]
        failed = {c["name"].split("/")[-1] for c in parity["comparisons"] if not c["passed"]}
        assert {"logits", "mtp_hidden_states"} <= failed
        if j == 0:
            assert failed & {f"present.mtp.{i}.{r}" for i in (0, 2) for r in ("key", "value")} == {
                "present.mtp.2.value"
            }
        else:
            assert not any(name.startswith("present.") for name in failed)
        if depths > 1:
            graph_file = "mtp.onnx" if j == 0 else f"mtp_depth{j}.onnx"
            assert head.summary.startswith(f"head arrays: depth {j} ({graph_file}) ")
            assert f"depth {1 - j}" not in head.summary
            assert head.evidence["depth_status"] == {str(j): FAIL, str(1 - j): PASS}


@pytest.mark.parametrize(
    ("update", "said"),
    [
        (
            {"mtp_hybrid_override_pattern": "E*E*"},
            "blocks mtp.layers.0-3 are '*E*E' by their tensors (q_proj: attention '*', gate: "
            "MoE 'E', '?': neither or both), but the config describes 'E*E*'",
        ),
        (
            {"mtp_hybrid_override_pattern": "*E", "num_nextn_predict_layers": 4},
            "the head's depth of '*E' (mtp.layers.0-1) lacks mtp.layers.1.final_layernorm.weight",
        ),
        (
            {"mtp_hybrid_override_pattern": "*E*E*E", "num_nextn_predict_layers": 1},
            "hold blocks mtp.layers.[0, 1, 2, 3, 4, 5, 6, 7]: the config describes 1 depth(s) "
            "of '*E*E*E' (mtp.layers.0-5)",
        ),
        ({"mtp_hybrid_override_pattern": "*M"}, "mtp_hybrid_override_pattern[1] is 'M'"),
        (
            {"mtp_layers_block_type": ["attention", "moe"]},
            "mtp_layers_block_type ('*E') and mtp_hybrid_override_pattern ('*E*E') disagree",
        ),
    ],
    ids=["kinds", "blocks", "count", "mamba", "spellings"],
)
def test_a_head_the_reference_cannot_read_is_refused(
    tmp_path: Path, update: dict, said: str
) -> None:
    """A config that does not describe the head's weights (two distinct depths of "*E*E"),
    or a block kind a head cannot have: MtpReference raises one ConfigError saying what it
    found, rather than computing other blocks than the package's."""
    from mobius_lite.errors import ConfigError
    from mobius_lite.evaluation.mtp_reference import MtpReference

    checkpoint, _, _ = write_distinct_depths_checkpoint(
        tmp_path / "checkpoint", TWO_ATTENTION, 2, seed=5
    )
    edit_config(checkpoint, lambda raw: raw.update(update))
    with pytest.raises(ConfigError) as error:
        MtpReference(checkpoint, 0)
    assert said in str(error.value)


def test_a_head_the_reference_cannot_read_is_not_run(two_attention, tmp_path: Path) -> None:
    """qualify against a source whose config calls the "*E*E" head "E*E*": the head verdict
    is NOT_RUN with the reference's reason, never a comparison with the wrong blocks; the
    decoder's verdicts are untouched."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(two_attention["checkpoint"], checkpoint)
    edit_config(checkpoint, lambda raw: raw.update(mtp_hybrid_override_pattern="E*E*"))
    report = qualify(two_attention["package"], checkpoint, output=tmp_path / "run", steps=1)
    head = report.verdicts["mtp_head"]
    assert head.status == NOT_RUN, head.summary
    assert head.summary.startswith("the reference head did not run: ")
    assert "are '*E*E' by their tensors" in head.summary
    assert "the config describes 'E*E*'" in head.summary
    assert report.verdicts["numerical_parity"].status == PASS
