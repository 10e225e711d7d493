"""Speculation on an `--activations int8` package gives plain greedy decoding's tokens.

The reference is the decoder stepped one token per call. Under int8 activations a rounding
difference anywhere before a kernel's activation quantization becomes whole quantization
steps, so the verifying call must compute each of its positions bit for bit as a one-position
step does. onnxruntime's fused expert kernels sum a row's expert terms in an order that
depends on the call's other rows (its threads split the active experts), so on QMoE every
(row, expert) pair is a row of its own and the graph adds a row's terms
(components/moe_fused.pairs_apart); the run-time-picked paths run one row at a time in calls
of up to the window's positions (components/row_by_row.py). The model has several experts per
token and the sessions two threads.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.components.state_window import DEFAULT_WINDOW
from mobius_lite.errors import ConfigError
from mobius_lite.io_contract import LOGITS, ROW_BY_ROW_WINDOW
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from mobius_lite.run.mtp_head import open_head
from mobius_lite.run.speculative import speculative_greedy
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.mtp_fixtures import (
    HEAD_PATTERN,
    global_head_shape,
    head_tensors,
    nextn_tensors,
)
from reference_fixtures.nemotron_reference import make_reference
from reference_fixtures.speculative_fixtures import ScriptedHead
from test_modelopt_dequantize import _ops

NEW_TOKENS = 40
PROMPT = 12
EXPERTS = {"n_routed_experts": 16, "num_experts_per_tok": 4}
# the experts' width: 32 puts both projections on QMoE int8; 16 leaves down_proj in F32
# (rows shorter than a Q8_0 block), so the experts stay on the run-time-picked paths
WIDTHS = {"qmoe": 32, "exact_experts": 16}
THREADS = 2


def options() -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    return opts


class Built(NamedTuple):
    experts: str  # a WIDTHS key
    path: Path


@pytest.fixture(scope="module", params=sorted(WIDTHS))
def package(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp(f"speculative_int8_{request.param}")
    width = {"moe_intermediate_size": WIDTHS[request.param]}
    model = make_reference({"layers_block_type": HEAD_PATTERN, **EXPERTS, **width}, seed=5)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(9))
    path = root / "tiny.gguf"
    write_gguf(
        path, model, "nemotron_h_moe", {r".": "Q8_0"}, nextn=nextn_tensors(head, model.config, {})
    )
    built = mobius_lite.build(path, weights_backend="ort", activations="int8")
    return Built(request.param, built.save(root / "package", quiet=True))


def test_each_row_computes_apart(package: Built) -> None:
    """On QMoE every (row, expert) pair is a row of its own (k = 1; its terms added in the
    graph), in the main graph, no Loop; the run-time-picked paths run inside a Loop, a row
    per iteration. The decoder records the window (generate --speculative warns without it)."""
    model = onnx.load(str(package.path / "model.onnx"), load_external_data=False)
    top = list(model.graph.node)
    qmoe = [n for n in top if n.op_type == "QMoE"]
    if package.experts == "qmoe":
        assert qmoe and "Loop" not in [n.op_type for n in top]
        assert all(a.i == 1 for n in qmoe for a in n.attribute if a.name == "k")
    else:
        assert "QMoE" not in _ops(model.graph) and "Loop" in [n.op_type for n in top]
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    assert metadata[ROW_BY_ROW_WINDOW] == str(DEFAULT_WINDOW)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("positions", [2, 4, 8])
def test_verifying_call_equals_steps_bit_for_bit(
    package: Built, positions: int, batch: int
) -> None:
    """Any batch: a call of up to the window's positions runs row by row (at batch 2 and 8
    positions it holds 16 rows)."""
    decoder = DecoderSession(package.path / "model.onnx", session_options=options())
    rng = np.random.default_rng(positions)
    ids = rng.integers(3, decoder.vocab_size, size=(batch, PROMPT)).astype(np.int64)
    decoder.reset(batch)
    out = decoder.step(ids, logits_to_keep=1)
    state = dict(decoder.past), decoder.mask
    tokens, steps = [out[LOGITS][:, -1].argmax(-1)], []
    for _ in range(positions):
        logits = decoder.step(tokens[-1][:, None], logits_to_keep=1)[LOGITS][:, -1]
        steps.append(logits)
        tokens.append(logits.argmax(-1))
    decoder.past, decoder.mask = dict(state[0]), state[1]
    fed = np.stack(tokens[:positions], axis=1).astype(np.int64)
    call = decoder.step(fed, logits_to_keep=positions)[LOGITS]
    np.testing.assert_array_equal(call, np.stack(steps, axis=1))


@pytest.mark.parametrize("batch", [1, 2])
def test_a_rewound_state_is_the_steps_state_bit_for_bit(package: Built, batch: int) -> None:
    """What a rejected draft leaves: for each kept prefix of a 5-position call, the decoder
    cut back with keep_prefix (the windows' slot, the attention caches cut) holds exactly
    the state that many one-position steps leave, every cache array bit for bit; so an
    int8-activation decoder continues from a rewind as plain decoding does."""
    positions = 5
    decoder = DecoderSession(package.path / "model.onnx", session_options=options())
    ids = np.random.default_rng(7 + batch).integers(3, decoder.vocab_size, size=(batch, PROMPT))
    decoder.reset(batch)
    decoder.step(ids.astype(np.int64), logits_to_keep=1)
    state = dict(decoder.past), decoder.mask
    fed = np.random.default_rng(batch).integers(3, decoder.vocab_size, size=(batch, positions))
    call = decoder.step(fed, logits_to_keep=positions)
    for kept in range(1, positions):
        decoder.past, decoder.mask = dict(state[0]), state[1]
        for j in range(kept):
            decoder.step(fed[:, j : j + 1], logits_to_keep=1)
        stepped = dict(decoder.past)
        decoder.past, decoder.mask = dict(state[0]), state[1]
        decoder.step(fed, logits_to_keep=positions)  # the call again: its caches, then the cut
        assert decoder.keep_prefix(call, positions, kept)
        assert set(decoder.past) == set(stepped)
        for name, expected in stepped.items():
            np.testing.assert_array_equal(decoder.past[name], expected, err_msg=f"{kept}: {name}")


@pytest.mark.parametrize("k", [1, 3, 4])
def test_speculative_tokens_equal_plain_greedy(package: Built, k: int) -> None:
    """A scripted head drafting the plain continuation, wrong at every fifth position
    (partial accepts), and the package's own head: plain greedy's tokens either way."""
    decoder = DecoderSession(package.path / "model.onnx", session_options=options())
    ids = np.random.default_rng(k).integers(3, decoder.vocab_size, size=(1, PROMPT))
    plain = greedy(decoder, ids, NEW_TOKENS).tokens
    known = np.array([[*ids[0], *plain]])
    scripted = ScriptedHead(known, decoder.vocab_size, lambda row, t: t % 5 == 0)
    for head in (scripted, open_head(package.path, session_options=options())):
        tokens, stats = speculative_greedy(decoder, head, ids, NEW_TOKENS, k, adaptive=False)
        assert tokens[0] == plain and stats.proposed > 0


def test_more_drafts_than_the_row_window_are_refused(package: Built, capsys) -> None:
    """K + 1 beyond the row-by-row window would verify in one batched call, whose tokens may
    differ: refused in one line, by the API and by generate (exit 2), before any call."""
    decoder = DecoderSession(package.path / "model.onnx", session_options=options())
    assert decoder.row_window == DEFAULT_WINDOW
    ids = np.array([[5, 6, 7]], np.int64)
    with pytest.raises(ConfigError, match=f"use k <= {DEFAULT_WINDOW - 1}"):
        speculative_greedy(decoder, open_head(package.path), ids, 4, DEFAULT_WINDOW)
    capsys.readouterr()
    args = [
        "generate",
        str(package.path),
        "--prompt-ids",
        "5,6,7",
        "--max-new-tokens",
        "4",
        "--ids",
    ]
    assert main([*args, "--speculative", str(DEFAULT_WINDOW)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"use k <= {DEFAULT_WINDOW - 1}" in err[0], err
    assert main([*args, "--speculative", str(DEFAULT_WINDOW - 1)]) == 0
