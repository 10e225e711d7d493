"""The decoder's optional logits_to_keep input against transformers' own logits_to_keep: the
logits of the last k positions of a left-padded batch, and every position when not fed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.run.decoder_session import DecoderSession
from parity import export_reference
from reference_fixtures.nemotron_reference import pinned_torch

PROMPT = 9


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("logits_to_keep")
    overrides = dict(layers_block_type=["linear_attention", "moe", "full_attention"])
    return export_reference(overrides, directory)


def _inputs(vocab: int) -> tuple[np.ndarray, np.ndarray]:
    ids = np.random.default_rng(1).integers(3, vocab, size=(2, PROMPT)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, :3] = 0  # left padding in the second row
    ids[1, :3] = 0
    return ids, mask


@pytest.mark.parametrize("keep", [1, 4, PROMPT, PROMPT + 5])
def test_last_positions_match_transformers(exported, keep: int) -> None:
    model, config, package = exported
    ids, mask = _inputs(config.vocab_size)
    with pinned_torch():
        ref = model(
            torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            logits_to_keep=keep,
            position_ids=torch.arange(PROMPT).expand(2, -1),
        ).logits.float()
    session = DecoderSession(package / "model.onnx")
    session.reset(2)
    ours = session.step(ids, mask, logits_to_keep=keep)["logits"]
    assert ours.shape == tuple(ref.shape) == (2, min(keep, PROMPT), config.vocab_size)
    # the padded positions of row 1 are unspecified on both sides
    real = slice(max(0, 3 - (PROMPT - ours.shape[1])), None)
    checks = [
        compare("row0", ours[0], ref[0].numpy()),
        compare("row1", ours[1, real], ref[1, real].numpy()),
    ]
    assert all(c.passes(FP32_NRMSE, FP32_COSINE) for c in checks), checks


def test_not_fed_means_every_position(exported) -> None:
    """Runtimes that do not know the input (onnxruntime-genai) get [batch, sequence, vocab]."""
    model, config, package = exported
    ids, mask = _inputs(config.vocab_size)
    session = DecoderSession(package / "model.onnx")
    session.reset(2)
    full = session.step(ids, mask)["logits"]
    session.reset(2)
    last = session.step(ids, mask, logits_to_keep=1)["logits"]
    assert full.shape == (2, PROMPT, config.vocab_size)
    np.testing.assert_array_equal(last[:, 0], full[:, -1])
