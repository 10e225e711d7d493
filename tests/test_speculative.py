"""Speculative greedy decoding with the MTP head (speculative.py) against plain greedy decoding.

The reference is the decoder stepped one token per call (run.greedy.greedy at batch 1, the same
loop per row for a left-padded batch): 64 new tokens must be identical for K = 1, 2 and 4, and
the decoder's conv, SSM and attention states afterwards must be plain decoding's (FP32 gates:
the verifying call computes several positions at once, so the arrays agree to rounding, not
bit for bit). A random head rarely drafts right, so a scripted head that drafts the known
continuation (always, or wrong at chosen positions) drives the accept and partial-accept paths.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.enums import RecurrenceInput
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.io_contract import window_of
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.draft_control import DraftController
from mobius_lite.run.greedy import greedy
from mobius_lite.run.mtp_head import MtpHead, open_head
from mobius_lite.run.speculative import speculative_greedy
from reference_fixtures.mtp_fixtures import HEAD_PATTERN, write_nemotron_h_mtp_checkpoint
from reference_fixtures.nemotron_reference import make_reference
from reference_fixtures.speculative_fixtures import ScriptedHead, plain_greedy

NEW_TOKENS = 64
PROMPT = 9
PAD = 3  # left padding of the batch's second row


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("speculative")
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(root / "checkpoint")
    out = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    save_tokenizer(out)
    return out


def save_tokenizer(package: Path) -> None:
    """A word-level tokenizer: "w{i}" is token i."""
    vocab = {f"w{i}": i for i in range(90)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(package / "tokenizer.json"))


def prompt(batch: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(batch).integers(3, vocab, size=(batch, PROMPT)).astype(np.int64)
    mask = np.ones_like(ids)
    if batch == 2:
        ids[1, :PAD] = 0
        mask[1, :PAD] = 0
    return ids, mask


@pytest.fixture(scope="module")
def plain_runs(package) -> dict:
    """Per batch: the prompt, plain greedy tokens, the decoder's hidden state at every fed
    position, and the decoder's state and mask after the run."""
    runs = {}
    decoder = DecoderSession(package / "model.onnx")
    for batch in (1, 2):
        ids, mask = prompt(batch, decoder.vocab_size)
        tokens, hidden = plain_greedy(decoder, ids, mask, NEW_TOKENS)
        runs[batch] = dict(
            ids=ids,
            mask=mask,
            tokens=tokens,
            hidden=hidden,
            state=dict(decoder.past),
            full_mask=decoder.mask,
        )
    # the runtime's own greedy loop gives the same tokens
    assert greedy(decoder, runs[1]["ids"], NEW_TOKENS).tokens == runs[1]["tokens"][0].tolist()
    return runs


def state_failures(actual: dict, expected: dict) -> list:
    assert actual.keys() == expected.keys()
    comparisons = [compare(name, actual[name], expected[name]) for name in expected]
    return [(c.name, c.nrmse) for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_tokens_and_states_equal_plain_greedy(package, plain_runs, k: int, batch: int) -> None:
    run = plain_runs[batch]
    ids, mask, plain = run["ids"], run["mask"], run["tokens"]
    plain_state, plain_mask = run["state"], run["full_mask"]
    decoder = DecoderSession(package / "model.onnx")
    head = open_head(package)
    tokens, stats = speculative_greedy(
        decoder, head, ids, NEW_TOKENS, k, attention_mask=mask, adaptive=False
    )
    assert np.array_equal(np.array(tokens), plain)
    assert stats.proposed > 0 and stats.rounds < NEW_TOKENS
    np.testing.assert_array_equal(decoder.mask, plain_mask)
    assert not state_failures(decoder.past, plain_state)


@pytest.mark.parametrize("batch", [1, 2])
def test_head_cache_keeps_only_real_positions(package, plain_runs, batch: int) -> None:
    """After generation the head's cache holds exactly the entries of (token t+1, decoder
    hidden t) at every position it covers: the chained drafts' entries were cut."""
    run = plain_runs[batch]
    ids, mask, plain, hidden = run["ids"], run["mask"], run["tokens"], run["hidden"]
    decoder = DecoderSession(package / "model.onnx")
    head = open_head(package)
    speculative_greedy(decoder, head, ids, NEW_TOKENS, 4, attention_mask=mask)
    covered = head.length
    assert 0 < covered < decoder.mask.shape[1]

    sequence = np.concatenate([ids, plain], axis=1)
    fresh = MtpHead(package / "mtp.onnx")
    fresh.reset(batch)
    full_mask = np.concatenate([mask, np.ones((batch, NEW_TOKENS), np.int64)], axis=1)
    fresh.step(
        sequence[:, 1 : covered + 1], np.stack(hidden[:covered], axis=1), full_mask[:, :covered]
    )
    np.testing.assert_array_equal(head.mask, fresh.mask)
    real = full_mask[:, :covered].astype(bool)  # padded positions' K/V are unspecified
    for name, expected in fresh.past.items():
        ours = head.past[name].transpose(0, 2, 1, 3)[real]
        c = compare(name, ours, expected.transpose(0, 2, 1, 3)[real])
        assert c.passes(FP32_NRMSE, FP32_COSINE), c


WRONG = {
    "never": lambda row, t: False,
    "every fifth": lambda row, t: (7 * t + 3 * row) % 5 == 0,
    "always": lambda row, t: True,
}


@pytest.mark.parametrize("windows", [True, False], ids=["windows", "re-run"])
@pytest.mark.parametrize("wrong", list(WRONG))
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_accepted_drafts_leave_plain_states(
    package, plain_runs, k: int, batch: int, wrong: str, windows: bool
) -> None:
    """Rejections at every position of a round leave plain decoding's states, cut back
    from the verifying call's own window inputs (one decoder call a round), or, for a decoder
    without them, by the re-run from the snapshot."""
    run = plain_runs[batch]
    ids, mask, plain, hidden = run["ids"], run["mask"], run["tokens"], run["hidden"]
    plain_state = run["state"]
    decoder = DecoderSession(package / "model.onnx")
    assert decoder.rewind is not None and len(decoder.rewind.layers) == 2  # two Mamba layers
    if not windows:
        decoder.rewind = None
    sequence = np.concatenate([ids, plain], axis=1)
    head = ScriptedHead(sequence, decoder.vocab_size, WRONG[wrong])

    tokens, stats = speculative_greedy(
        decoder, head, ids, NEW_TOKENS, k, attention_mask=mask, adaptive=False
    )
    assert np.array_equal(np.array(tokens), plain)
    assert not state_failures(decoder.past, plain_state)
    cut_backs = stats.rewinds + stats.rollbacks
    assert (stats.rollbacks if windows else stats.rewinds) == 0
    # one decoder call per round (and the prefill), plus one per re-run
    assert stats.decoder_calls == 1 + stats.rounds + stats.rollbacks
    if wrong == "never":
        assert stats.accepted == stats.proposed > 0 and cut_backs == 0
        # every round but the last emits k + 1 tokens
        assert stats.rounds == -(-(NEW_TOKENS - 1) // (k + 1))
    elif wrong == "always":
        assert stats.accepted == 0 and cut_backs == stats.rounds - 1
    else:
        assert 0 < stats.accepted < stats.proposed and cut_backs > 0
    # the head kept only real entries: token t+1 and the decoder's hidden state at t
    for t, (token, state) in enumerate(head.entries):
        np.testing.assert_array_equal(token, sequence[:, t + 1])
        c = compare(f"hidden {t}", state, hidden[t])
        assert c.passes(FP32_NRMSE, FP32_COSINE), c


def test_generate_cli_reports_drafts(package, capsys) -> None:
    base = ["generate", str(package), "--prompt", "w5 w17 w33 w4 w61", "--ids"]
    assert main([*base, "--max-new-tokens", "24"]) == 0
    plain = capsys.readouterr().out
    for k in ("1", "3"):
        assert main([*base, "--max-new-tokens", "24", "--speculative", k]) == 0
        captured = capsys.readouterr()
        assert captured.out == plain
        assert "drafts proposed" in captured.err and "accepted" in captured.err
        assert "decoder calls" in captured.err and "K=0 x" in captured.err  # the first round


@pytest.fixture(scope="module")
def headless_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("headless")
    make_reference({"layers_block_type": HEAD_PATTERN}, 0).save_pretrained(root / "checkpoint")
    plain = mobius_lite.build(root / "checkpoint").save(root / "package", quiet=True)
    save_tokenizer(plain)
    return plain


def test_generate_cli_refuses_speculation_without_a_head(package, headless_package, capsys) -> None:
    plain = headless_package
    code = main(["generate", str(plain), "--prompt", "w5", "--speculative", "2"])
    err = capsys.readouterr().err
    assert code == 2 and "has no mtp.onnx" in err and "Traceback" not in err
    code = main(["generate", str(package), "--prompt", "w5", "--speculative", "-1"])
    assert code == 2 and "--speculative must be" in capsys.readouterr().err


def _puzzle_package(root: Path) -> Path:
    from reference_fixtures.mtp_fixtures import write_puzzle_mtp_checkpoint

    checkpoint, _, _, _ = write_puzzle_mtp_checkpoint(root / "checkpoint")
    return mobius_lite.build(checkpoint).save(root / "package", quiet=True)


def _gguf_q8_0_package(root: Path) -> Path:
    from reference_fixtures.gguf_fixtures import write_gguf
    from reference_fixtures.mtp_fixtures import global_head_shape, head_tensors, nextn_tensors

    model = make_reference({"layers_block_type": HEAD_PATTERN}, seed=3)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(7))
    path = root / "tiny.gguf"
    write_gguf(
        path, model, "nemotron_h_moe", {r".": "Q8_0"}, nextn=nextn_tensors(head, model.config, {})
    )
    return mobius_lite.build(path, weights_backend="ort").save(root / "package", quiet=True)


@pytest.fixture(scope="module", params=["puzzle", "gguf_q8_0"])
def other_package(request, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp(f"speculative_{request.param}")
    return {"puzzle": _puzzle_package, "gguf_q8_0": _gguf_q8_0_package}[request.param](root)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_package_kind_with_a_head(other_package: Path, k: int) -> None:
    """Puzzle (the head's own MoE shape, mtp.safetensors) and GGUF Q8_0 (the head packed, on
    the ort backend): speculative tokens equal the runtime's plain greedy tokens."""
    decoder = DecoderSession(other_package / "model.onnx")
    ids, _ = prompt(1, decoder.vocab_size)
    plain = greedy(decoder, ids, NEW_TOKENS).tokens
    plain_state = dict(decoder.past)
    # fixed K: the head's random drafts would send adaptive K to plain steps
    head = open_head(other_package)
    tokens, stats = speculative_greedy(decoder, head, ids, NEW_TOKENS, k, adaptive=False)
    assert tokens[0] == plain and stats.proposed > 0
    assert not state_failures(decoder.past, plain_state)


@pytest.mark.parametrize("new_tokens", [1, 2, 3])
def test_fewer_tokens_than_drafts(package, plain_runs, new_tokens: int) -> None:
    """A round never drafts past max_new_tokens: 1, 2 or 3 tokens at K = 4 are plain's."""
    run = plain_runs[2]
    decoder = DecoderSession(package / "model.onnx")
    tokens, stats = speculative_greedy(
        decoder,
        open_head(package),
        run["ids"],
        new_tokens,
        4,
        attention_mask=run["mask"],
        adaptive=False,
    )
    assert np.array_equal(np.array(tokens), run["tokens"][:, :new_tokens])
    # the first round drafts new_tokens - 2 (its own next token is the last one), per row
    assert stats.proposed == 2 * max(new_tokens - 2, 0)
    assert decoder.mask.shape[1] == run["ids"].shape[1] + new_tokens - 1


@pytest.mark.parametrize("wrong", ["never", "every fifth"])
@pytest.mark.parametrize("k", [2, 4])
def test_stop_token_inside_an_accepted_round(package, plain_runs, k: int, wrong: str) -> None:
    """A stop token among a round's accepted drafts ends generation there, with the decoder
    state plain decoding (run.greedy.greedy with the stop token) leaves."""
    run = plain_runs[1]
    ids, sequence = run["ids"], np.concatenate([run["ids"], run["tokens"]], axis=1)
    stop = int(run["tokens"][0, 20])
    decoder = DecoderSession(package / "model.onnx")
    plain = greedy(decoder, ids, NEW_TOKENS, stop_tokens={stop}).tokens
    plain_state, plain_mask = dict(decoder.past), decoder.mask
    assert plain[-1] == stop and len(plain) <= 21
    head = ScriptedHead(sequence, decoder.vocab_size, WRONG[wrong])
    tokens, stats = speculative_greedy(
        decoder, head, ids, NEW_TOKENS, k, stops={stop}, adaptive=False
    )
    assert tokens[0] == plain
    if wrong == "never":  # rounds emit k + 1 tokens after the first; one ending mid-round is cut
        last = len(plain) - 1
        assert stats.rewinds == int(last > 0 and (last - 1) % (k + 1) != k)
        assert stats.rollbacks == 0
    np.testing.assert_array_equal(decoder.mask, plain_mask)
    assert not state_failures(decoder.past, plain_state)


def test_graphs_outside_the_head_contract_are_refused(package, headless_package) -> None:
    """A graph that is not a head, and a decoder without hidden_states, are one clear error."""
    with pytest.raises(PackageError, match="lacks hidden_states"):
        MtpHead(package / "model.onnx")
    decoder = DecoderSession(headless_package / "model.onnx")
    with pytest.raises(PackageError, match="has no hidden_states output"):
        speculative_greedy(decoder, open_head(package), np.array([[5, 6]]), 4, 2)
    with pytest.raises(ConfigError, match="must be >= 1"):
        speculative_greedy(decoder, open_head(package), np.array([[5, 6]]), 4, 0)


@pytest.mark.parametrize("batch", [1, 2])
def test_window_inputs_are_the_calls_own(package, plain_runs, batch: int) -> None:
    """A verifying call of 5 positions returns each Mamba layer's recurrence inputs at each
    position ([5, batch, width]); a one-token call and a call longer than the window (the
    9-token prompt) return no slot. The conv inputs' last kernel - 1 slots are the call's
    present conv state, and the rewind over all 5 positions gives its present SSM state, both
    bit for bit (the same values, the same kernel)."""
    run = plain_runs[batch]
    decoder = DecoderSession(package / "model.onnx")
    assert decoder.rewind is not None
    names = [which.window_name(layer.name) for layer in decoder.rewind.layers
             for which in RecurrenceInput]  # fmt: skip
    decoder.reset(batch)
    out = decoder.step(run["ids"], run["mask"])
    assert all(out[name].shape[0] == 0 for name in names)
    fed = run["tokens"][:, :5]
    window = decoder.step(fed)
    assert all(window[name].shape[:2] == (5, batch) for name in names)
    rewound = decoder.rewind.states(decoder.call_past, window, 5, 5)
    assert rewound is not None and rewound.keys() == set(decoder.rewind.past_names)
    for layer in decoder.rewind.layers:
        conv = window[RecurrenceInput.CONV_INPUT.window_name(layer.name)]
        kernel_taps = decoder.past[layer.conv.past_name].shape[2]
        np.testing.assert_array_equal(
            conv[-kernel_taps:].transpose(1, 2, 0), decoder.past[layer.conv.past_name]
        )
    for name, state in rewound.items():
        np.testing.assert_array_equal(state, decoder.past[name])
    one = decoder.step(run["tokens"][:, 5:6])
    assert all(one[name].shape[0] == 0 for name in names)


class StateWindowDecoder(DecoderSession):
    """A decoder with the state_window kernels' contract (CUDA only in onnxruntime 1.32), on
    the CPU: each call of 2 to 8 positions also returns present_window.* (each Mamba state
    after each position), made here by one-position calls of a twin session from the call's
    past, and no window inputs."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.twin = DecoderSession(path)
        assert self.rewind is not None
        self.windows = {name: window_of(name) for name in self.rewind.past_names}
        self.rewind = None

    def step(self, tokens, attention_mask=None, logits_to_keep=0):
        past, mask = dict(self.past), self.mask
        out = super().step(tokens, attention_mask, logits_to_keep)
        positions = tokens.shape[1]
        if 2 <= positions <= 8:
            self.twin.past, self.twin.mask = past, mask
            slots: dict[str, list[np.ndarray]] = {name: [] for name in self.windows}
            for j in range(positions):
                self.twin.step(tokens[:, j : j + 1])
                for name, states in slots.items():
                    states.append(self.twin.past[name])
            out.update({self.windows[n]: np.stack(states) for n, states in slots.items()})
        return out


@pytest.mark.parametrize("batch", [1, 2])
def test_a_decoder_with_state_windows_is_cut_back_from_their_slots(
    package, plain_runs, batch: int
) -> None:
    """The state_window kernels' outputs (present_window.*, slot n the state after position
    n) are what keep_prefix takes the Mamba states from when a decoder has them: every
    rejection cut back with no re-run, plain decoding's tokens and states."""
    run = plain_runs[batch]
    decoder = StateWindowDecoder(package / "model.onnx")
    sequence = np.concatenate([run["ids"], run["tokens"]], axis=1)
    head = ScriptedHead(sequence, decoder.vocab_size, WRONG["every fifth"])
    tokens, stats = speculative_greedy(
        decoder, head, run["ids"], NEW_TOKENS, 4, attention_mask=run["mask"], adaptive=False
    )
    assert np.array_equal(np.array(tokens), run["tokens"])
    assert not state_failures(decoder.past, run["state"])
    assert stats.rewinds > 0 and stats.rollbacks == 0


class FixedCosts(DraftController):
    """A controller fed fixed call costs instead of measured ones (deterministic K): a
    decoder call over n positions costs 1 + 0.1 (n - 1), a head call 0.3."""

    def observe_decoder(self, positions: int, seconds: float) -> None:
        super().observe_decoder(positions, 1.0 + 0.1 * (positions - 1))

    def observe_head(self, seconds: float) -> None:
        super().observe_head(0.3)


@pytest.mark.parametrize("wrong", ["never", "always", "every fifth"])
@pytest.mark.parametrize("batch", [1, 2])
def test_adaptive_k_keeps_plain_tokens_and_states(
    package, plain_runs, batch: int, wrong: str
) -> None:
    """K changes between rounds (down to plain steps for a drafter that is always wrong,
    k_max for one always right); tokens and states stay plain decoding's."""
    run = plain_runs[batch]
    ids, mask, plain = run["ids"], run["mask"], run["tokens"]
    decoder = DecoderSession(package / "model.onnx")
    sequence = np.concatenate([ids, plain], axis=1)
    head = ScriptedHead(sequence, decoder.vocab_size, WRONG[wrong])
    control = FixedCosts(4)
    tokens, stats = speculative_greedy(
        decoder, head, ids, NEW_TOKENS, 4, attention_mask=mask, controller=control
    )
    assert np.array_equal(np.array(tokens), plain)
    assert not state_failures(decoder.past, run["state"])
    assert stats.rollbacks == 0 and set(stats.k_rounds) <= set(range(5))
    assert stats.decoder_calls == 1 + stats.rounds
    if wrong == "never":
        # a plain step (measuring D(1)), two with a probe (the first catches the head up on
        # the prompt, the second times a one-position head call), then drafting up to k_max
        # (the last rounds draft less only to end on time)
        assert control.chosen[0] == 3 and stats.probes == stats.probes_right == 2
        assert control.chosen.get(4, 0) >= stats.rounds - 6
    elif wrong == "always":
        # only plain steps: the probes find the drafter wrong without a verifying call
        assert set(stats.k_rounds) == {0} and stats.probes >= 1 and stats.probes_right == 0
    else:
        assert len(stats.k_rounds) > 1


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("kept", [1, 2, 3, 4])
def test_keep_prefix_at_every_position(package, plain_runs, batch: int, kept: int) -> None:
    """A verifying call of 5 tokens cut back to its first `kept` (a rejection at each draft
    position of a K = 4 round) leaves the state of feeding only those tokens one call each:
    every conv, SSM and attention array (FP32 gates) and the mask."""
    run = plain_runs[batch]
    decoder = DecoderSession(package / "model.onnx")
    decoder.reset(batch)
    decoder.step(run["ids"], run["mask"])
    before = (dict(decoder.past), decoder.mask)
    fed = run["tokens"][:, :5]
    out = decoder.step(fed)
    assert decoder.keep_prefix(out, 5, kept)
    cut = (dict(decoder.past), decoder.mask)
    decoder.past, decoder.mask = dict(before[0]), before[1]
    for j in range(kept):
        decoder.step(fed[:, j : j + 1])
    np.testing.assert_array_equal(cut[1], decoder.mask)
    assert not state_failures(cut[0], decoder.past)


def test_keep_prefix_refuses_a_call_without_windows(package, plain_runs) -> None:
    """A call longer than the window (9 positions) has no slots: keep_prefix says so and
    changes nothing (the caller then re-runs)."""
    run = plain_runs[1]
    decoder = DecoderSession(package / "model.onnx")
    decoder.reset(1)
    out = decoder.step(run["ids"])
    past, mask = dict(decoder.past), decoder.mask
    assert not decoder.keep_prefix(out, run["ids"].shape[1], 3)
    assert decoder.past.keys() == past.keys()
    assert all(decoder.past[n] is past[n] for n in past) and decoder.mask is mask


SHARED_POOL_CHILD = """
import sys
import numpy as np
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from mobius_lite.run.mtp_head import open_head
from mobius_lite.run.ort_session import ALLOW_SPINNING, on_shared_pool, shares_pool
from mobius_lite.run.speculative import speculative_greedy

package = sys.argv[1]
decoder = DecoderSession(package + "/model.onnx", session_options=on_shared_pool())
head = open_head(package, session_options=on_shared_pool())
for session in (decoder.session, head.session):
    used = session.get_session_options()
    assert shares_pool(used)
    try:  # no allow_spinning entry: one pool cannot fight itself
        used.get_session_config_entry(ALLOW_SPINNING)
        raise SystemExit("the shared pool's session was told not to spin")
    except RuntimeError:
        pass
ids = np.array([[5, 17, 33, 8, 2, 40]], np.int64)
plain = greedy(decoder, ids, 24).tokens
tokens, stats = speculative_greedy(decoder, head, ids, 24, 3, adaptive=False)
assert tokens[0] == plain and stats.proposed > 0, (tokens, plain)
# onnxruntime refuses a session with a pool of its own once the process has the shared pool:
# the library's later sessions take the shared one
later = DecoderSession(package + "/model.onnx")
assert shares_pool(later.session.get_session_options())
print("OK")
"""


def test_decoder_and_head_share_one_thread_pool(package) -> None:
    """On the process's shared thread pool (ort_session.on_shared_pool; process-wide, so in a
    child process) the decoder and head keep that pool without a spinning entry, speculation
    gives plain greedy's tokens, and a later session of the library still opens; a head
    given options of its own (this process) still does not spin."""
    import subprocess
    import sys

    from mobius_lite.run.ort_session import ALLOW_SPINNING, shares_pool

    done = subprocess.run(
        [sys.executable, "-c", SHARED_POOL_CHILD, str(package)], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-2000:]
    own = open_head(package).session.get_session_options()
    assert not shares_pool(own) and own.get_session_config_entry(ALLOW_SPINNING) == "0"


def test_generate_command_speculates_on_the_shared_pool(package) -> None:
    """`mobius generate` as its own process (the shared thread pool) prints the same tokens
    with and without --speculative."""
    import subprocess
    import sys

    def generate(*extra: str) -> str:
        command = [sys.executable, "-m", "mobius_lite.cli.main", "generate", str(package)]
        done = subprocess.run(
            [*command, "--prompt-ids", "5,17,33,8", "--max-new-tokens", "16", *extra],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert generate("--speculative", "3") == generate()
