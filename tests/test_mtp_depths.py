"""A multi-token-prediction head of distinct depths (mtp_use_repeated_layer false,
num_nextn_predict_layers D > 1): one graph per depth (mtp.onnx, mtp_depth{j}.onnx), each
against the independent depth reference (reference_fixtures/mtp_reference.py) under the FP32
gates; the depth chain (run/mtp_depths.py) round by round against the reference run
teacher-forced on the same true and drafted inputs; speculative decoding with it equal to
plain greedy; the package through the CLI (build, generate --speculative, verify); an Omni
and a Puzzle checkpoint with such a head. qualify's verdict on text packages:
tests/test_qualify_depths.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.enums import GraphId, GraphRole
from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.draft_control import DraftController
from mobius_lite.run.mtp_depths import DepthChain
from mobius_lite.run.mtp_head import RoundDraftHead, head_session, open_head
from mobius_lite.run.speculative import speculative_greedy
from mobius_lite.weights.verify import verify_package
from reference_fixtures.mtp_fixtures import (
    HeadSession,
    depth_references,
    edit_config,
    write_distinct_depths_checkpoint,
)
from reference_fixtures.mtp_reference import teacher_forced_depths
from reference_fixtures.speculative_fixtures import plain_greedy

# (pattern of one depth, depths): "*E" as the releases, at D = 2 and 3; "*E*E" puts two
# attention caches in each depth (global indices mtp.0, mtp.2 | mtp.4, mtp.6)
LAYOUTS = [("*E", 2), ("*E", 3), ("*E*E", 2)]
SHARED = ["backbone.embeddings.weight", "lm_head.weight"]
PAD = 3  # left padding of a batch's second row
NEW_TOKENS = 20


def _passes(actual: np.ndarray, expected: np.ndarray, name: str) -> None:
    result = compare(name, actual, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), (name, result.nrmse, result.cosine)


@pytest.fixture(scope="module", params=LAYOUTS, ids=[f"{p}x{d}" for p, d in LAYOUTS])
def layout(request, tmp_path_factory: pytest.TempPathFactory) -> dict:
    pattern, depths = request.param
    root = tmp_path_factory.mktemp(f"depths{depths}")
    checkpoint, model, head = write_distinct_depths_checkpoint(root / "checkpoint", pattern, depths)
    package = mobius_lite.build(checkpoint)
    out = package.save(root / "package", quiet=True)
    return dict(
        pattern=pattern,
        depths=depths,
        checkpoint=checkpoint,
        model=model,
        head=head,
        package=package,
        out=out,
        references=depth_references(model, head, pattern, depths),
    )


def _sequence(batch: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    ids = np.random.default_rng(seed).integers(3, vocab, size=(batch, length)).astype(np.int64)
    mask = np.ones_like(ids)
    if batch == 2:
        ids[1, :PAD], mask[1, :PAD] = 0, 0
    return ids, mask


# --------------------------------------------------------------------------- the package
def test_one_graph_per_depth_binds_its_own_blocks(layout) -> None:
    """Graph j binds mtp.layers.{j*B ..} (the checkpoint's names) plus the shared table and
    lm_head; the manifest records every head tensor in exactly one graph, the shared ones in
    all; verify re-checks every source tensor; inspect lists every depth graph."""
    from mobius_lite.cli.inspect_cmd import inspect_package

    package, out, depths = layout["package"], layout["out"], layout["depths"]
    per_depth = len(layout["pattern"])
    keys = [GraphId(GraphRole.MTP, j).key for j in range(depths)]
    assert [g.graph_id for g in package.graphs] == [
        GraphId(GraphRole.DECODER),
        *(GraphId(GraphRole.MTP, j) for j in range(depths)),
    ]
    assert keys[0] == "mtp" and keys[1] == "mtp_depth1"
    manifest = json.loads((out / "manifest.json").read_text())
    assert list(manifest["graphs"]) == ["decoder", *keys]
    for name in layout["head"]:
        block = int(name.split(".")[2])
        assert manifest["sources"][name]["graphs"] == [keys[block // per_depth]], name
    assert {n: sorted(r) for n, r in manifest["shared"].items()} == {
        n: sorted(["decoder", *keys]) for n in SHARED
    }
    for j, key in enumerate(keys):
        record = package.graphs[1 + j]
        bound = {s for b in record.plan.bindings for s in b.sources}
        first = j * per_depth
        expected = {n for n in layout["head"] if first <= int(n.split(".")[2]) < first + per_depth}
        assert bound == expected | set(SHARED), key
        assert (out / GraphId(GraphRole.MTP, j).file_name).is_file()
    report = verify_package(out, layout["checkpoint"])
    assert report.ok and report.checked == len(manifest["sources"])
    models = [m["file"] for m in inspect_package(out)["models"]]
    assert models == ["model.onnx", *(GraphId(GraphRole.MTP, j).file_name for j in range(depths))]


def test_depth_graph_contracts(layout) -> None:
    """Each depth's caches are its own attention blocks' (global indices); a depth that feeds
    another returns mtp_hidden_states at every position under logits_to_keep, the last depth
    the kept ones only (as a one-depth head)."""
    config, out = layout["package"].config, layout["out"]
    per_depth = len(layout["pattern"])
    vocab, width = config.vocab_size, config.hidden_size
    for j in range(layout["depths"]):
        head = head_session(out / GraphId(GraphRole.MTP, j).file_name)
        attention = [j * per_depth + k for k, c in enumerate(layout["pattern"]) if c == "*"]
        assert [c.past_name for c in head.cache] == [
            f"past_key_values.mtp.{i}.{role}" for i in attention for role in ("key", "value")
        ]
        head.reset(2)
        rng = np.random.default_rng(j)
        logits, hidden = head.step(
            rng.integers(0, vocab, (2, 5)),
            rng.standard_normal((2, 5, width)).astype(np.float32),
            np.ones((2, 5), np.int64),
            logits_to_keep=1,
        )
        assert logits.shape == (2, 1, vocab)
        assert hidden.shape == (2, 5 if j < layout["depths"] - 1 else 1, width)
    genai = json.loads((out / "genai_config.json").read_text())
    overlay = json.loads((out / "genai_mtp_overlay.json").read_text())
    assert genai["model"]["mtp"]["filename"] == "mtp.onnx"
    assert genai["speculative"] == {"max_draft_tokens": 1}
    assert overlay["model"]["decoder"]["num_hidden_layers"] == per_depth


@pytest.mark.parametrize(("batch", "steps"), [(1, 3), (2, 3)])
def test_depth_graphs_match_the_reference(layout, batch: int, steps: int) -> None:
    """Depth j's graph, fed the reference's depth j-1 outputs (the package decoder's hidden
    states for depth 0) and tokens t_{i+j+1}: a prefill, then one-position cached steps;
    logits, mtp_hidden_states and every present under the FP32 gates at real positions (the
    second row left-padded)."""
    _check_depth_graphs(layout["out"], layout["package"].config, layout["references"], batch, steps)


def _check_depth_graphs(
    out: Path, config, references: list, batch: int, steps: int, length: int = 12
) -> None:
    """Each depth graph of package `out` against its reference (test_depth_graphs_match_the_
    reference): a prefill of length - steps positions, then `steps` one-position calls."""
    depths = len(references)
    ids, mask = _sequence(batch, length + depths, config.vocab_size, seed=batch)
    decoder = DecoderSession(out / "model.onnx")
    hidden = decoder.step(ids[:, :length], mask[:, :length])["hidden_states"]
    line, positions_mask = ids[:, 1:], mask[:, :length]
    taught = teacher_forced_depths(references, hidden, line, positions_mask)
    prefill = length - steps
    for j, reference in enumerate(references):
        inputs = hidden if j == 0 else taught[j - 1]["mtp_hidden_states"]
        tokens = line[:, j : j + length]
        graph = HeadSession(out / GraphId(GraphRole.MTP, j).file_name, config)
        reference.reset()
        calls = [(0, prefill)] + [(p, p + 1) for p in range(prefill, length)]
        for number, (a, b) in enumerate(calls):
            seen = positions_mask[:, :b]
            ours = graph.step(tokens[:, a:b], inputs[:, a:b], seen)
            ref = reference.step(tokens[:, a:b], inputs[:, a:b], seen)
            real = positions_mask[:, a:b].astype(bool)
            for name in ("logits", "mtp_hidden_states"):
                _passes(ours[name][real], ref[name][real], f"depth{j}/{number}/{name}")
            presents = [n for n in ref if n.startswith("present.")]
            assert sorted(presents) == sorted(n for n in ours if n.startswith("present."))
            for name in presents:
                actual = ours[name].transpose(0, 2, 1, 3)[seen.astype(bool)]
                expected = ref[name].transpose(0, 2, 1, 3)[seen.astype(bool)]
                _passes(actual, expected, f"depth{j}/{number}/{name}")
        # the teacher-forced reference is the same computation in one call
        _passes(ref["logits"][:, -1], taught[j]["logits"][:, -1], f"depth{j}/teacher-forced")


# --------------------------------------------------------------------------- the chain
@pytest.mark.parametrize("batch", [1, 2])
def test_chain_rounds_match_the_teacher_forced_reference(layout, batch: int) -> None:
    """The depth chain over a known sequence, the decoder advancing 1 to 4 positions between
    rounds (what accepted drafts do), rounds of D drafts and probes of one: each round's
    draft j is the reference's argmax at the last position p with the same true and drafted
    inputs, and afterwards depth j holds exactly positions 0..p-j, computed from true
    inputs (the reference teacher-forced on the true tokens, FP32 gates)."""
    config, out, depths = layout["package"].config, layout["out"], layout["depths"]
    length = 30
    ids, mask = _sequence(batch, length + 1, config.vocab_size, seed=10 + batch)
    hidden = DecoderSession(out / "model.onnx").step(ids[:, :length], mask[:, :length])[
        "hidden_states"
    ]
    chain = open_head(out)
    assert isinstance(chain, DepthChain) and isinstance(chain, RoundDraftHead)
    assert chain.max_drafts == depths
    chain.reset(batch)
    timed: list[int] = []
    position = 0
    advances = [8, 1, 3, 1, 2, 4, 1, 1, 2, 3, 1]  # the prompt, then accepted drafts + 1
    counts = [depths, 1, depths, depths, 1, 1, depths, depths - 1, depths, depths, depths]
    for advance, count in zip(advances, counts, strict=True):
        end = position + advance
        drafts = chain.draft_round(
            ids[:, position + 1 : end + 1],
            hidden[:, position:end],
            mask[:, position:end],
            count,
            lambda positions, _seconds: timed.append(positions),
        )
        position, last = end, end - 1
        assert drafts.shape == (batch, count)
        line = np.concatenate([ids[:, 1 : last + 2], drafts], axis=1)
        taught = teacher_forced_depths(
            layout["references"][:count], hidden[:, : last + 1], line, mask[:, : last + 1]
        )
        for j in range(count):
            expected = taught[j]["logits"][:, last].argmax(-1)
            np.testing.assert_array_equal(drafts[:, j], expected, err_msg=f"depth {j}")
        true_line = np.concatenate([ids[:, 1 : last + 2], np.zeros_like(drafts)], axis=1)
        truth = teacher_forced_depths(
            layout["references"][:count], hidden[:, : last + 1], true_line, mask[:, : last + 1]
        )
        assert chain.depths[0].length == last + 1
        for j in range(count):
            held = chain.depths[j].length
            assert held == max(0, last - j + 1), (j, held)
            real = mask[:, :held].astype(bool)
            for name, value in chain.depths[j].past.items():
                present = name.replace("past_key_values.", "present.")
                actual = value.transpose(0, 2, 1, 3)[real]
                reference = truth[j][present][:, :, :held].transpose(0, 2, 1, 3)[real]
                _passes(actual, reference, f"round at {last}, depth {j}: {name}")
    # the prompt's catch-up is not one draft's cost; a later round's depth calls are
    assert timed[0] == 8 and 1 in timed[depths:]


def test_chain_as_a_plain_draft_head(layout) -> None:
    """The chain's DraftHead methods: `step` runs depth 0 alone on true positions (later depths
    catch up on them in the next round); `truncate` drops positions no later depth has run, and
    refuses to cut into what one has run (it keeps only the inputs it has not used)."""
    config, out, depths = layout["package"].config, layout["out"], layout["depths"]
    ids, mask = _sequence(1, 13, config.vocab_size, seed=30)
    hidden = DecoderSession(out / "model.onnx").step(ids[:, :12], mask[:, :12])["hidden_states"]
    chain = open_head(out)
    chain.reset(1)
    logits, _ = chain.step(ids[:, 1:7], hidden[:, :6], mask[:, :6])
    assert logits.shape == (1, 6, config.vocab_size)
    assert [d.length for d in chain.depths] == [6] + [0] * (depths - 1)
    chain.truncate(4)  # positions 4 and 5 are run again below
    assert chain.length == 4
    untimed = lambda positions, seconds: None  # noqa: E731
    drafts = chain.draft_round(ids[:, 5:13], hidden[:, 4:12], mask[:, 4:12], depths, untimed)
    line = np.concatenate([ids[:, 1:13], drafts], axis=1)
    taught = teacher_forced_depths(layout["references"], hidden, line, mask[:, :12])
    expected = [taught[j]["logits"][:, 11].argmax(-1) for j in range(depths)]
    np.testing.assert_array_equal(drafts, np.stack(expected, axis=1))
    with pytest.raises(ValueError, match="depth 1 has run 11 positions"):
        chain.truncate(5)


class _RecordingChain(DepthChain):
    """The depth chain, recording each round's inputs as it saw them (for the reference)."""

    def reset(self, batch: int) -> None:
        super().reset(batch)
        self.decoder_hidden = np.zeros((batch, 0, 0), np.float32)
        # the whole line of true tokens and masks (the chain keeps only the tail it can read)
        self.true_tokens = np.zeros((batch, 0), np.int64)
        self.true_masks = np.zeros((batch, 0), np.int64)
        self.rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def draft_round(self, input_ids, hidden_states, attention_mask, count, timed):
        seen = [self.decoder_hidden] if self.decoder_hidden.size else []
        self.decoder_hidden = np.concatenate([*seen, hidden_states], axis=1)
        self.true_tokens = np.concatenate([self.true_tokens, input_ids], axis=1)
        self.true_masks = np.concatenate([self.true_masks, attention_mask], axis=1)
        drafts = super().draft_round(input_ids, hidden_states, attention_mask, count, timed)
        self.rounds.append((self.true_tokens, self.true_masks, self.decoder_hidden, drafts))
        return drafts


@pytest.mark.parametrize(
    ("batch", "k", "adaptive"), [(1, 1, False), (1, None, False), (2, None, False), (1, None, True)]
)
def test_speculation_with_the_chain(layout, batch: int, k: int | None, adaptive: bool) -> None:
    """speculative_greedy with the depth chain: the tokens are plain greedy's (batch 2 left-
    padded; K = 1 and K = D fixed, and adaptive); every draft it proposed is the reference's
    argmax at the same position from the same decoder hidden states, true tokens and drafts;
    the controller hears the head's cost."""
    config, out, depths = layout["package"].config, layout["out"], layout["depths"]
    k = k or depths
    ids, mask = _sequence(batch, 7, config.vocab_size, seed=20 + batch)
    plain, _ = plain_greedy(DecoderSession(out / "model.onnx"), ids, mask, NEW_TOKENS)
    files = [out / GraphId(GraphRole.MTP, j).file_name for j in range(depths)]
    chain = _RecordingChain([head_session(f) for f in files])
    controller = DraftController(k)
    tokens, stats = speculative_greedy(
        DecoderSession(out / "model.onnx"),
        chain,
        ids,
        NEW_TOKENS,
        k,
        attention_mask=mask,
        adaptive=adaptive,
        controller=controller,
    )
    np.testing.assert_array_equal(np.array(tokens), plain)
    assert chain.rounds and stats.head_calls == sum(r[3].shape[1] for r in chain.rounds)
    if not adaptive:
        assert stats.k_rounds.get(k, 0) > 0 and controller.head_seconds is not None
    for line_tokens, masks, hidden, drafts in chain.rounds:
        last = line_tokens.shape[1] - 1
        line = np.concatenate([line_tokens, drafts], axis=1)
        taught = teacher_forced_depths(layout["references"][: drafts.shape[1]], hidden, line, masks)
        for j in range(drafts.shape[1]):
            expected = taught[j]["logits"][:, last].argmax(-1)
            np.testing.assert_array_equal(drafts[:, j], expected, err_msg=f"at {last}, depth {j}")


def test_more_drafts_than_depths_are_refused(layout, capsys, monkeypatch) -> None:
    """K > D: one ConfigError in the API, exit 2 and one line from the CLI, which refuses it
    from the manifest before any session is created."""
    depths, out = layout["depths"], layout["out"]
    decoder = DecoderSession(out / "model.onnx")
    with pytest.raises(ConfigError, match=f"k .* is {depths + 1}, but this head has {depths}"):
        speculative_greedy(decoder, open_head(out), np.array([[5, 6, 7]]), 4, depths + 1)
    import mobius_lite.run.cached_session as cached_session

    def no_session(*args, **kwargs):
        raise AssertionError("a session was created before K was checked")

    monkeypatch.setattr(cached_session, "create_session", no_session)
    code = main(
        ["generate", str(out), "--prompt-ids", "5,6,7", "--ids", "--speculative", str(depths + 1)]
    )
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1 and f"use k <= {depths}" in captured.err


# --------------------------------------------------------------------------- the CLI
def test_cli_build_generate_verify(tmp_path: Path, capsys) -> None:
    """mobius build on a two-depth head, generate --speculative 2 gives plain generate's
    tokens (and reports its drafts), verify passes."""
    checkpoint, _, _ = write_distinct_depths_checkpoint(tmp_path / "checkpoint", "*E", 2, seed=4)
    out = tmp_path / "package"
    assert main(["build", "--model", str(checkpoint), "--output", str(out), "-q"]) == 0
    capsys.readouterr()
    assert (out / "mtp_depth1.onnx").is_file()
    common = ["generate", str(out), "--prompt-ids", "5,17,33,8", "--ids", "--ignore-eos"]
    common += ["--max-new-tokens", "12"]
    assert main(common) == 0
    plain = capsys.readouterr().out.split()
    assert main([*common, "--speculative", "2"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == plain and len(plain) == 12
    assert "speculative:" in captured.err and "drafts proposed" in captured.err
    assert main(["verify", str(out), "--source", str(checkpoint), "-q"]) == 0


def _reweighted(source: Path, destination: Path, depths_in_weights: int, edit) -> Path:
    """A copy of checkpoint `source` whose head holds `depths_in_weights` depths of "*E"
    (depth 0's tensors repeated under later indices), its config edited by `edit`."""
    from safetensors.numpy import load_file, save_file

    destination.mkdir()
    for f in source.iterdir():
        if f.name != "model.safetensors":
            (destination / f.name).write_bytes(f.read_bytes())
    tensors = {
        n: v for n, v in load_file(source / "model.safetensors").items() if not n.startswith("mtp.")
    }
    head = load_file(source / "model.safetensors")
    for depth in range(depths_in_weights):
        for name, value in head.items():
            if name.startswith(("mtp.layers.0.", "mtp.layers.1.")):
                block = int(name.split(".")[2]) + 2 * depth
                tensors[f"mtp.layers.{block}." + name.split(".", 3)[3]] = value
    save_file(tensors, destination / "model.safetensors", metadata={"format": "pt"})
    edit_config(destination, edit)
    return destination


@pytest.mark.parametrize(
    ("held", "declared", "found"),
    [(3, 2, "mtp.layers.0-5: 3 distinct depths"), (1, 2, "mtp.layers.0-1")],
)
def test_weights_of_another_depth_count_are_one_line(
    tmp_path: Path, capsys, held: int, declared: int, found: str
) -> None:
    """A config of `declared` distinct depths over weights holding `held`: one ConfigError
    naming both, nothing written; exit 2 and one line from mobius build."""
    checkpoint, _, _ = write_distinct_depths_checkpoint(tmp_path / "source", "*E", 2, seed=5)
    broken = _reweighted(
        checkpoint,
        tmp_path / "checkpoint",
        held,
        lambda raw: raw.update(num_nextn_predict_layers=declared),
    )
    with pytest.raises(ConfigError, match=found) as error:
        mobius_lite.build(broken)
    assert f"describes {declared} depth(s)" in str(error.value)
    capsys.readouterr()  # the fixture's own output
    code = main(["build", "--model", str(broken), "--output", str(tmp_path / "package")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and found in err and "Traceback" not in err
    assert not (tmp_path / "package").exists()


def test_omni_head_of_distinct_depths(tmp_path: Path) -> None:
    """An Omni checkpoint whose language model declares two distinct depths (its head under
    language_model.mtp.layers.0-3): the package gets both depth graphs beside the Omni ones,
    OmniSession's speculative decoding through the chain gives its plain greedy tokens, and
    qualify's head verdict compares both depth graphs (re-scored alike)."""
    from safetensors.numpy import load_file, save_file

    from mobius_lite.run.omni_session import OmniSession
    from reference_fixtures.mtp_fixtures import (
        depth_tensors,
        global_head_shape,
        write_omni_mtp_checkpoint,
    )

    checkpoint, model, _ = write_omni_mtp_checkpoint(tmp_path / "checkpoint")
    path = checkpoint / "model.safetensors"
    kept = {n: v for n, v in load_file(path).items() if not n.startswith("language_model.mtp.")}
    head = depth_tensors(
        global_head_shape(model.language_model.config), "*E", 2, np.random.default_rng(3)
    )
    save_file({**kept, **{"language_model." + n: v for n, v in head.items()}}, path)
    edit_config(
        checkpoint,
        lambda raw: raw["text_config"].update(
            num_nextn_predict_layers=2, mtp_use_repeated_layer=False
        ),
    )
    package = mobius_lite.build(checkpoint)
    assert [g.key for g in package.graphs][-2:] == ["mtp", "mtp_depth1"]
    out = package.save(tmp_path / "package", quiet=True)
    session = OmniSession(out)
    ids = np.array([[5, 17, 33, 8, 61, 12]], np.int64)
    plain = session.generate(ids, None, 12, stop_at_eos=False)
    tokens, _, stats = session.generate_speculative(
        ids, None, 12, 2, stop_at_eos=False, adaptive=False
    )
    assert tokens == plain.tokens and stats.k_rounds.get(2, 0) > 0
    # qualify's head verdict on it: both depth graphs against their references
    from mobius_lite.evaluation.qualify import qualify, rescore
    from mobius_lite.evaluation.scoring import PASS

    report = qualify(out, checkpoint, output=tmp_path / "run", steps=2)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert head.evidence["depth_status"] == {"0": PASS, "1": PASS}
    assert rescore(tmp_path / "run").verdicts["mtp_head"].status == PASS


# --------------------------------------------------------------------------- Puzzle
def _write_puzzle_depths_checkpoint(directory: Path, depths: int, seed: int = 0):
    """A Puzzle checkpoint (block_configs, model. names, an index) whose head has `depths`
    distinct depths: mtp_block_configs lists one depth's blocks (attention, latent MoE with
    the head's own sizes), which every depth has, and mtp.safetensors (not in the index) holds
    mtp.layers.0 .. 2 * depths - 1. Returns (dir, config.json dict, each depth's reference)."""
    from safetensors.numpy import save_file

    from reference_fixtures.mtp_fixtures import (
        PUZZLE_MTP_BLOCKS,
        head_tensors,
        puzzle_block_config,
        puzzle_head_shape,
    )
    from reference_fixtures.mtp_reference import MTPDepthReference
    from reference_fixtures.puzzle_fixtures import (
        HETEROGENEOUS_BLOCKS,
        puzzle_raw_config,
        write_puzzle_checkpoint,
    )

    raw = puzzle_raw_config(
        HETEROGENEOUS_BLOCKS,
        num_nextn_predict_layers=depths,
        mtp_use_repeated_layer=False,
        mtp_block_configs=PUZZLE_MTP_BLOCKS,
    )
    checkpoint, model = write_puzzle_checkpoint(raw, directory, seed=seed)
    model = model.float().eval()
    attention, moe = (puzzle_block_config(raw, block) for block in PUZZLE_MTP_BLOCKS)
    shape = puzzle_head_shape(raw)
    rng = np.random.default_rng(seed + 400)
    head: dict[str, np.ndarray] = {}
    for depth in range(depths):
        for name, value in head_tensors(shape, rng).items():
            _, _, block, rest = name.split(".", 3)
            head[f"mtp.layers.{int(block) + 2 * depth}.{rest}"] = value
    save_file(head, str(checkpoint / "mtp.safetensors"))
    embeddings = model.model.embeddings.weight.detach().numpy()
    lm_head = model.lm_head.weight.detach().numpy()
    references = [
        MTPDepthReference(
            head, ["attention", "moe"], 2 * depth, attention, moe, embeddings, lm_head
        )
        for depth in range(depths)
    ]
    return checkpoint, raw, references


@pytest.fixture(scope="module")
def puzzle(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("puzzle_depths")
    checkpoint, raw, references = _write_puzzle_depths_checkpoint(root / "checkpoint", 2)
    package = mobius_lite.build(checkpoint)
    out = package.save(root / "package", quiet=True)
    return dict(
        root=root, checkpoint=checkpoint, raw=raw, references=references, package=package, out=out
    )


def test_puzzle_head_of_distinct_depths(puzzle) -> None:
    """A Puzzle head of two distinct depths: one graph per depth, each block with
    mtp_block_configs' sizes; each depth graph against the independent reference (batch 2
    left-padded, FP32 gates); verify re-checks every source tensor, mtp.safetensors' too."""
    package, out = puzzle["package"], puzzle["out"]
    config = package.config
    assert config.mtp_depths == 2 and [g.key for g in package.graphs] == [
        "decoder",
        "mtp",
        "mtp_depth1",
    ]
    for depth in range(2):
        attention, moe = config.mtp_depth_layers(depth)
        assert attention.index == 2 * depth and attention.attention.num_kv_heads == 1
        assert moe.moe.n_routed_experts == 6 and moe.moe.latent_size == 16
    _check_depth_graphs(out, config, puzzle["references"], batch=2, steps=3)
    report = verify_package(out, puzzle["checkpoint"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert report.ok and report.checked == len(manifest["sources"])
    assert "mtp.layers.3.final_layernorm.weight" in manifest["sources"]


@pytest.mark.parametrize("k", [1, 2])
def test_puzzle_speculation_is_plain_greedy(puzzle, k: int) -> None:
    """speculative_greedy through the Puzzle head's depth chain (K = 1, K = D; batch 2 left-
    padded): exactly plain greedy's tokens."""
    out = puzzle["out"]
    ids, mask = _sequence(2, 7, puzzle["package"].config.vocab_size, seed=40 + k)
    plain, _ = plain_greedy(DecoderSession(out / "model.onnx"), ids, mask, NEW_TOKENS)
    chain = open_head(out)
    assert isinstance(chain, DepthChain)
    tokens, stats = speculative_greedy(
        DecoderSession(out / "model.onnx"),
        chain,
        ids,
        NEW_TOKENS,
        k,
        attention_mask=mask,
        adaptive=False,
    )
    np.testing.assert_array_equal(np.array(tokens), plain)
    assert stats.k_rounds.get(k, 0) > 0


def test_puzzle_qualify_compares_every_depth(puzzle) -> None:
    """qualify on the Puzzle package: its head reference reads each depth's blocks with the
    head's own sizes; both depths within the gates."""
    from mobius_lite.evaluation.qualify import qualify
    from mobius_lite.evaluation.scoring import PASS

    report = qualify(puzzle["out"], puzzle["checkpoint"], output=puzzle["root"] / "run", steps=3)
    head = report.verdicts["mtp_head"]
    assert head.status == PASS, head.summary
    assert head.evidence["depth_status"] == {"0": PASS, "1": PASS}
    assert head.evidence["depth_parity"]["1"]["families"]["logits"]["compared"] == 3


def test_puzzle_blocks_of_every_depth_listed_are_one_line(puzzle, tmp_path: Path, capsys) -> None:
    """mtp_block_configs is one depth's blocks: a config listing both depths' blocks (four
    entries) over a head of two depths reads as two depths of '*E*E', which the weights do
    not hold: one ConfigError naming both, from the tensor names alone; exit 2 and one line
    from mobius build, nothing written."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(puzzle["checkpoint"], checkpoint)
    edit_config(checkpoint, lambda raw: raw.update(mtp_block_configs=raw["mtp_block_configs"] * 2))
    with pytest.raises(
        ConfigError, match=r"holds blocks mtp\.layers\.0-3, but its config"
    ) as error:
        mobius_lite.build(checkpoint)
    assert "describes 2 depth(s) of '*E*E' (8 blocks)" in str(error.value)
    capsys.readouterr()
    code = main(["build", "--model", str(checkpoint), "--output", str(tmp_path / "package")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "mtp.layers.0-3" in err
    assert "Traceback" not in err and not (tmp_path / "package").exists()
