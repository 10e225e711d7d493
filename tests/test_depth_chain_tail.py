"""The depth chain (run/mtp_depths.py) keeps only the tail of the true tokens and masks that a
later depth can still read: from the lowest later depth's cache length (depth j holds
positions 0..p-j after a round that reached it, p the decoder's last position) to depth 0's.
After a round of D drafts that is D - 1 positions, however long the generation; the drafts
stay the independent reference's (reference_fixtures/mtp_reference.py, teacher-forced on the
same true and drafted inputs) over a 40-token generation on the tiny D = 3 head."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import mobius_lite
from mobius_lite.enums import GraphId, GraphRole
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.mtp_depths import DepthChain
from mobius_lite.run.mtp_head import head_session, open_head
from mobius_lite.run.speculative import speculative_greedy
from reference_fixtures.mtp_fixtures import depth_references, write_distinct_depths_checkpoint
from reference_fixtures.mtp_reference import teacher_forced_depths
from reference_fixtures.speculative_fixtures import plain_greedy

DEPTHS = 3
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tail")
    checkpoint, model, tensors = write_distinct_depths_checkpoint(root / "ckpt", "*E", DEPTHS)
    out = mobius_lite.build(checkpoint).save(root / "package", quiet=True)
    return dict(out=out, references=depth_references(model, tensors, "*E", DEPTHS))


def _untimed(positions: int, seconds: float) -> None:
    return None


def _kept(chain: DepthChain) -> int:
    assert chain.tokens.shape == chain.masks.shape
    return chain.tokens.shape[1]


def test_the_chain_keeps_a_bounded_tail_over_a_long_sequence(head: dict) -> None:
    """Rounds over a 48-position sequence (the decoder advancing 1 to 4 positions between
    rounds, D drafts, probes of one, D - 1): every draft is the reference's argmax; afterwards
    the chain keeps exactly the true tokens and masks from the lowest later depth's cache
    length on: D - 1 positions plus those the decoder advanced since the last round of D
    drafts (which reached the deepest depth), never the whole sequence."""
    out, references = head["out"], head["references"]
    decoder = DecoderSession(out / "model.onnx")
    length = 48
    ids = np.random.default_rng(7).integers(3, decoder.vocab_size, size=(2, length + 1))
    mask = np.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0  # the second row left-padded
    hidden = decoder.step(ids[:, :length], mask[:, :length])["hidden_states"]
    chain = open_head(out)
    assert isinstance(chain, DepthChain) and chain.max_drafts == DEPTHS
    chain.reset(2)
    held = [0] * DEPTHS  # each depth's cache length, from the chain's definition
    position, since_full = 0, 0  # positions since the last round of D drafts
    advances = [8, 1, 3, 1, 2, 4, 1, 1, 2, 3, 1, 4, 2, 1, 3, 4, 1, 2, 1, 3]
    counts = [3, 1, 3, 3, 1, 1, 3, 2, 3, 3, 3, 3, 2, 3, 1, 3, 3, 3, 3, 3]
    assert sum(advances) == length
    for advance, count in zip(advances, counts, strict=True):
        end = position + advance
        drafts = chain.draft_round(
            ids[:, position + 1 : end + 1],
            hidden[:, position:end],
            mask[:, position:end],
            count,
            _untimed,
        )
        position, last = end, end - 1
        line = np.concatenate([ids[:, 1 : last + 2], drafts], axis=1)
        taught = teacher_forced_depths(
            references[:count], hidden[:, : last + 1], line, mask[:, : last + 1]
        )
        for j in range(count):
            expected = taught[j]["logits"][:, last].argmax(-1)
            np.testing.assert_array_equal(drafts[:, j], expected, err_msg=f"at {last}, depth {j}")
        held[:count] = [last - j + 1 for j in range(count)]
        assert [d.length for d in chain.depths] == held
        first = min(held[1:])  # the first position a later depth has not run
        assert _kept(chain) == last + 1 - first, (last, count)
        np.testing.assert_array_equal(chain.tokens, ids[:, first + 1 : last + 2])
        np.testing.assert_array_equal(chain.masks, mask[:, first : last + 1])
        since_full = 0 if count == DEPTHS else since_full + advance
        assert _kept(chain) == DEPTHS - 1 + since_full, (last, count)
    assert chain.length == length and _kept(chain) == DEPTHS - 1


class _Recorder(DepthChain):
    """The chain, recording each round's true tokens, masks and decoder hidden states from
    the inputs it is given (the chain itself keeps only a tail of them) and its drafts."""

    def reset(self, batch: int) -> None:
        super().reset(batch)
        self.seen = (np.zeros((batch, 0), np.int64),) * 2 + (np.zeros((batch, 0, 0), np.float32),)
        self.rounds: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]] = []

    def draft_round(self, input_ids, hidden_states, attention_mask, count, timed):
        new = (input_ids, attention_mask, hidden_states)
        self.seen = tuple(
            np.concatenate([old, add], axis=1) if old.size else add
            for old, add in zip(self.seen, new, strict=True)
        )
        drafts = super().draft_round(input_ids, hidden_states, attention_mask, count, timed)
        self.rounds.append((*self.seen, drafts, self.tokens.shape[1]))
        return drafts


def test_a_long_speculative_generation_keeps_a_bounded_tail(head: dict) -> None:
    """speculative_greedy with the chain (K = D) over 40 new tokens: plain greedy's tokens,
    every draft the reference's, and after each round the chain keeps D - 1 true tokens and
    masks plus the positions since the last round of D drafts (the last rounds, short of
    tokens left, draft fewer)."""
    out, references = head["out"], head["references"]
    decoder = DecoderSession(out / "model.onnx")
    ids = np.random.default_rng(3).integers(3, decoder.vocab_size, size=(1, 7))
    mask = np.ones_like(ids)
    plain, _ = plain_greedy(decoder, ids, mask, NEW_TOKENS)
    files = [out / GraphId(GraphRole.MTP, j).file_name for j in range(DEPTHS)]
    chain = _Recorder([head_session(Path(f)) for f in files])
    tokens, stats = speculative_greedy(
        DecoderSession(out / "model.onnx"),
        chain,
        ids,
        NEW_TOKENS,
        DEPTHS,
        attention_mask=mask,
        adaptive=False,
    )
    np.testing.assert_array_equal(np.array(tokens), plain)
    assert stats.k_rounds.get(DEPTHS, 0) >= 5
    assert stats.head_calls == sum(r[3].shape[1] for r in chain.rounds)
    full = 0  # the decoder's last position at the last round of D drafts
    for true_tokens, masks, hidden, drafts, kept in chain.rounds:
        last = true_tokens.shape[1] - 1
        line = np.concatenate([true_tokens, drafts], axis=1)
        taught = teacher_forced_depths(references[: drafts.shape[1]], hidden, line, masks)
        for j in range(drafts.shape[1]):
            expected = taught[j]["logits"][:, last].argmax(-1)
            np.testing.assert_array_equal(drafts[:, j], expected, err_msg=f"at {last}, depth {j}")
        full = last if drafts.shape[1] == DEPTHS else full
        assert kept == DEPTHS - 1 + last - full, (last, kept)
    assert chain.length > NEW_TOKENS
