"""Speculative greedy decoding on an Omni package (the decoder fed embeddings, the head fed ids)
against plain greedy decoding: an image prompt through OmniSession, and a left-padded text
batch of 2 through the embedding graph; 64 new tokens, K = 1, 2 and 4."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mobius_lite
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.run.mtp_head import open_head
from mobius_lite.run.omni_session import Media, OmniSession
from mobius_lite.run.speculative import speculative_greedy
from reference_fixtures.mtp_fixtures import write_omni_mtp_checkpoint
from reference_fixtures.omni_fixtures import pack_images
from reference_fixtures.speculative_fixtures import plain_greedy

NEW_TOKENS = 64
IMAGE_TOKEN = 90  # write_omni_mtp_checkpoint's image_token_id
MERGE = 4  # downsample_ratio 0.5: 2 x 2 patches per feature row


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("speculative_omni")
    checkpoint, _, _ = write_omni_mtp_checkpoint(root / "checkpoint")
    return mobius_lite.build(checkpoint).save(root / "package", quiet=True)


def state_failures(actual: dict, expected: dict) -> list:
    comparisons = [compare(name, actual[name], expected[name]) for name in expected]
    return [(c.name, c.nrmse) for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_image_prompt_equals_plain_greedy(package, k: int) -> None:
    gen = torch.Generator().manual_seed(3)
    pixels, grid = pack_images([torch.randn(3, 16, 24, generator=gen)])
    rows = int(grid.prod(-1).sum()) // MERGE
    ids = np.array([[5, 17, *([IMAGE_TOKEN] * rows), 33, 8]], dtype=np.int64)
    media = Media(pixel_values=pixels, image_grid_hw=grid)
    session = OmniSession(package)
    plain = session.generate(ids, media, NEW_TOKENS)
    plain_state = dict(session.decoder.past)
    tokens, outputs, stats = session.generate_speculative(ids, media, NEW_TOKENS, k, adaptive=False)
    assert tokens == plain.tokens
    assert stats.proposed > 0 and len(outputs) >= stats.rounds + 1
    assert not state_failures(session.decoder.past, plain_state)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_left_padded_text_batch_equals_plain_greedy(package, k: int) -> None:
    session = OmniSession(package)
    ids = np.random.default_rng(4).integers(3, 80, size=(2, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    ids[1, :3], mask[1, :3] = 0, 0
    embeds = session.embed(ids)
    plain, _ = plain_greedy(session.decoder, ids, mask, NEW_TOKENS, embeds, session.embed)
    plain_state = dict(session.decoder.past)
    tokens, stats = speculative_greedy(
        session.decoder,
        open_head(package),
        ids,
        NEW_TOKENS,
        k,
        attention_mask=mask,
        prompt_input=embeds,
        decoder_input=session.embed,
        adaptive=False,
    )
    assert np.array_equal(np.array(tokens), plain)
    assert stats.proposed > 0
    assert not state_failures(session.decoder.past, plain_state)


SHARED_POOL_CHILD = """
import sys
import numpy as np
import torch
from mobius_lite.run.omni_session import Media, OmniSession
from mobius_lite.run.ort_session import on_shared_pool, shares_pool
from reference_fixtures.omni_fixtures import pack_images

package, image_token, merge = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
gen = torch.Generator().manual_seed(3)
pixels, grid = pack_images([torch.randn(3, 16, 24, generator=gen)])
rows = int(grid.prod(-1).sum()) // merge
ids = np.array([[5, 17, *([image_token] * rows), 33, 8]], dtype=np.int64)
media = Media(pixel_values=pixels, image_grid_hw=grid)
session = OmniSession(package, None, on_shared_pool())
assert shares_pool(session.decoder.session.get_session_options())
plain = session.generate(ids, media, 24)
tokens, _, stats = session.generate_speculative(ids, media, 24, 2, adaptive=False)
assert tokens == plain.tokens and stats.proposed > 0, (tokens, plain.tokens)
print("OK")
"""


def test_image_prompt_on_the_shared_pool(package) -> None:
    """`mobius generate` as a command runs an Omni package's graphs and head on the process's
    shared thread pool (ort_session.on_shared_pool; process-wide, so in a child process): an
    image prompt's speculative tokens equal its plain greedy tokens there."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]  # reference_fixtures
    done = subprocess.run(
        [sys.executable, "-c", SHARED_POOL_CHILD, str(package), str(IMAGE_TOKEN), str(MERGE)],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert done.returncode == 0 and done.stdout.strip() == "OK", done.stderr[-2000:]
