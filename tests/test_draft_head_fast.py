"""`--draft-head fast`: the MTP head's packed matmuls on int8 activations (MatMulNBits
accuracy_level 4) over the same stored weights. The decoder is untouched, so the tokens
are plain greedy decoding's; the head's own arrays are reported, not gated, by qualify
(int8 activations), while its speculative tokens must still be identical."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.errors import ConfigError, RouteError
from mobius_lite.evaluation.qualify_mtp import score_head
from mobius_lite.evaluation.scoring import FAIL, NOT_GATED, PASS
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from mobius_lite.run.mtp_head import open_head
from mobius_lite.run.speculative import speculative_greedy
from reference_fixtures.mtp_fixtures import write_nemotron_h_mtp_checkpoint

NEW_TOKENS = 40


def accuracy_levels(path: Path) -> list[int]:
    """accuracy_level of every MatMulNBits node of a graph file (0 when not set)."""
    graph = onnx.load(str(path), load_external_data=False).graph
    return [
        next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)
        for node in graph.node
        if node.op_type == "MatMulNBits"
    ]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from reference_fixtures.gguf_fixtures import write_gguf
    from reference_fixtures.mtp_fixtures import (
        HEAD_PATTERN,
        global_head_shape,
        head_tensors,
        nextn_tensors,
    )
    from reference_fixtures.nemotron_reference import make_reference

    root = tmp_path_factory.mktemp("fast_head")
    model = make_reference({"layers_block_type": HEAD_PATTERN}, seed=3)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(7))
    gguf = root / "tiny.gguf"
    nextn = nextn_tensors(head, model.config, {})
    write_gguf(gguf, model, "nemotron_h_moe", {r".": "Q8_0"}, nextn=nextn)
    return {
        route: mobius_lite.build(gguf, weights_backend="ort", draft_head=route).save(
            root / route, quiet=True
        )
        for route in ("exact", "fast")
    }


def test_fast_head_moves_only_the_heads_matmuls(packages) -> None:
    exact, fast = packages["exact"], packages["fast"]
    head_levels = accuracy_levels(fast / "mtp.onnx")
    assert head_levels and set(head_levels) == {4}  # the lm_head and the head's projections
    assert set(accuracy_levels(exact / "mtp.onnx")) == {0}
    # the decoder graph and every stored byte are the exact package's
    assert (fast / "model.onnx").read_bytes() == (exact / "model.onnx").read_bytes()
    data = sorted(p.name for p in exact.iterdir() if ".data" in p.name)
    assert data and data == sorted(p.name for p in fast.iterdir() if ".data" in p.name)
    for name in data:
        assert (fast / name).read_bytes() == (exact / name).read_bytes()
    assert main(["verify", str(fast)]) == 0


@pytest.mark.parametrize("k", [1, 3])
def test_fast_head_keeps_plain_tokens(packages, k: int) -> None:
    decoder = DecoderSession(packages["fast"] / "model.onnx")
    ids = np.array([[5, 17, 33, 4, 61, 9]], np.int64)
    plain = greedy(decoder, ids, NEW_TOKENS).tokens
    plain_state = dict(decoder.past)
    head = open_head(packages["fast"])
    tokens, stats = speculative_greedy(decoder, head, ids, NEW_TOKENS, k, adaptive=False)
    assert tokens[0] == plain and stats.proposed > 0
    for name, value in plain_state.items():
        np.testing.assert_allclose(decoder.past[name], value, rtol=1e-4, atol=1e-4)


def test_fast_head_is_refused_without_packed_head_weights(tmp_path: Path) -> None:
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(ConfigError, match="needs packed head weights"):
        mobius_lite.build(checkpoint, weights_backend="ort", draft_head="fast")
    with pytest.raises(RouteError, match="needs the ort backend"):
        mobius_lite.build(checkpoint, draft_head="fast")
    with pytest.raises(RouteError, match="not supported"):
        mobius_lite.build(checkpoint, draft_head="quick")


def test_build_cli_refuses_a_fast_head_on_dense_weights(tmp_path: Path, capsys) -> None:
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "package"
    capsys.readouterr()  # the checkpoint writer's progress
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--draft-head", "fast"]
    code = main([*args, "--backend", "ort", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "needs packed head weights" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def head_facts(tokens: list[int], plain: list[int], int8_kernels: int) -> dict:
    return {
        "int8_activation_kernels": int8_kernels,
        "speculative": {
            "k": 2,
            "new_tokens": len(plain),
            "tokens": tokens,
            "plain_tokens": plain,
            "proposed": 4,
            "accepted": 1,
        },
    }


@pytest.mark.parametrize("int8_kernels", [0, 3])
def test_qualify_reports_a_fast_heads_arrays_and_gates_its_tokens(int8_kernels: int) -> None:
    """Head arrays off by NRMSE ~0.1 (outside the gates): a
    fast head's verdict is NOT_GATED when its speculative tokens are identical, FAIL when
    they are not; an exact head with the same arrays fails."""
    rng = np.random.default_rng(0)
    steps = ["prefill", "decode0"]
    reference = {f"{s}/logits": rng.standard_normal((1, 1, 50)).astype(np.float32) for s in steps}
    ours = {
        k: v + 0.1 * rng.standard_normal(v.shape).astype(np.float32) for k, v in reference.items()
    }
    same = score_head(head_facts([1, 2, 3], [1, 2, 3], int8_kernels), ours, reference, steps)
    differ = score_head(head_facts([1, 2, 4], [1, 2, 3], int8_kernels), ours, reference, steps)
    exact_arrays = score_head(
        head_facts([1, 2, 3], [1, 2, 3], int8_kernels), reference, reference, steps
    )
    assert exact_arrays.status == PASS
    if int8_kernels:
        assert same.status == NOT_GATED and "int8 activations" in same.summary
        assert same.evidence["gated_status"] == FAIL
    else:
        assert same.status == FAIL
    assert differ.status == FAIL
