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
from mobius_lite.errors import RouteError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
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


def round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def int8_block_weights(w: np.ndarray) -> np.ndarray:
    """onnxruntime-genai's int8 blocks of 32 along a row, dequantized (from the convention:
    scale = the block's extreme / -128, code = round-half-away(x / scale) + 128 in 0..255)."""
    blocks = w.reshape(w.shape[0], -1, 32).astype(np.float64)
    low, high = blocks.min(-1), blocks.max(-1)
    scale = np.where(np.abs(high) > np.abs(low), high, low) / -128.0
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    codes = np.clip(round_half_away(blocks * inverse[..., None]) + 128, 0, 255)
    return ((codes - 128) * scale[..., None]).reshape(w.shape)


def int8_block_activations(x: np.ndarray) -> np.ndarray:
    """MatMulNBits' accuracy_level 4 activations: symmetric int8 per 32 along K (amax / 127,
    rounded to nearest even), dequantized."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float64)
    scale = np.abs(blocks).max(-1) / 127.0
    safe = np.where(scale == 0, 1.0, scale)
    return (np.rint(blocks / safe[..., None]) * scale[..., None]).reshape(x.shape)


def test_relaid_projection_is_int8_blocks_times_int8_activations() -> None:
    """One marked Gemm(x, W, transB) re-laid in memory computes x's int8 blocks times W's
    int8 blocks (both written out above from their definitions), to float rounding; the
    dense initializer leaves the graph."""
    import onnx_ir as ir
    import onnxruntime as ort

    from mobius_lite.graphs.draft_int8 import mark_draft_int8, relay_draft_int8

    rng = np.random.default_rng(0)
    rows, k, batch = 40, 96, 3
    weight = rng.standard_normal((rows, k)).astype(np.float32)
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([batch, k]))
    w = ir.Value(name="lm_head.weight", const_value=ir.tensor(weight, name="lm_head.weight"))
    w.shape, w.dtype = ir.Shape([rows, k]), ir.DataType.FLOAT
    node = ir.node("Gemm", [x, w], attributes={"transB": 1})
    y = node.outputs[0]
    y.name, y.dtype, y.shape = "y", ir.DataType.FLOAT, ir.Shape([batch, rows])
    model = ir.Model(
        ir.Graph([x], [y], nodes=[node], initializers=[w], opset_imports={"": 21}), ir_version=10
    )
    mark_draft_int8(model, ["lm_head.weight"])
    assert relay_draft_int8(model) == 1
    assert [n.op_type for n in model.graph] == ["MatMulNBits"]
    assert "lm_head.weight" not in model.graph.initializers
    session = ort.InferenceSession(
        ir.serde.serialize_model(model).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    inputs = rng.standard_normal((batch, k)).astype(np.float32)
    out = session.run(None, {"x": inputs})[0]
    expected = int8_block_activations(inputs) @ int8_block_weights(weight).T
    assert compare("relaid", out, expected).passes(FP32_NRMSE, FP32_COSINE)
    # and that is not the float32 product: the route is int8
    assert not compare("f32", out, inputs @ weight.T).passes(FP32_NRMSE, FP32_COSINE)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A dense (safetensors) checkpoint with a head, built exact and fast on --backend ort."""
    root = tmp_path_factory.mktemp("fast_dense_head")
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(root / "checkpoint")
    built = {
        route: mobius_lite.build(checkpoint, weights_backend="ort", draft_head=route).save(
            root / route, quiet=True
        )
        for route in ("exact", "fast")
    }
    return {"checkpoint": checkpoint, **built}


def test_dense_fast_head_lists_its_projections_and_keeps_the_bytes(dense) -> None:
    """A dense head's fast route changes no byte of the package but mtp.onnx's metadata: it
    lists the head's projections llama.cpp would quantize whose rows are whole 32-blocks
    (lm_head among them; not the router, nor a projection of 24-element rows)."""
    import json

    from mobius_lite.evaluation.qualify_mtp import _int8_kernels
    from mobius_lite.graphs.draft_int8 import DRAFT_INT8_WEIGHTS
    from mobius_lite.weights.verify import verify_package

    exact, fast = dense["exact"], dense["fast"]
    for path in sorted(p.relative_to(exact) for p in exact.rglob("*") if p.is_file()):
        if path.name not in ("mtp.onnx", "manifest.json"):
            assert (fast / path).read_bytes() == (exact / path).read_bytes(), path
    manifests = [json.loads((p / "manifest.json").read_text()) for p in (exact, fast)]
    for manifest in manifests:  # the one file that differs has its own sha256 there
        manifest["files"].pop("mtp.onnx")
    assert manifests[0] == manifests[1]
    proto = onnx.load(str(fast / "mtp.onnx"), load_external_data=False)
    listed = json.loads({p.key: p.value for p in proto.metadata_props}[DRAFT_INT8_WEIGHTS])
    shapes = {t.name: tuple(t.dims) for t in proto.graph.initializer}
    assert "lm_head.weight" in listed and "mtp.layers.1.mixer.gate.weight" not in listed
    assert all(shapes[name][1] % 32 == 0 for name in listed)
    assert {n for n in shapes if n.startswith("mtp.") and n.endswith("proj.weight")} - set(
        listed
    ) == {n for n in shapes if n.endswith("proj.weight") and shapes[n][1] % 32}
    assert _int8_kernels(fast / "mtp.onnx") == len(listed)
    assert _int8_kernels(exact / "mtp.onnx") == 0
    assert verify_package(fast, dense["checkpoint"]).ok


@pytest.mark.parametrize("k", [1, 3])
def test_dense_fast_head_keeps_plain_tokens(dense, k: int) -> None:
    decoder = DecoderSession(dense["fast"] / "model.onnx")
    ids = np.array([[5, 17, 33, 8, 61]], dtype=np.int64)
    plain = greedy(decoder, ids, NEW_TOKENS).tokens
    head = open_head(dense["fast"])
    tokens, stats = speculative_greedy(decoder, head, ids, NEW_TOKENS, k, adaptive=False)
    assert tokens[0] == plain and stats.proposed > 0


def test_fast_head_routes_are_refused(tmp_path: Path) -> None:
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path / "checkpoint")
    with pytest.raises(RouteError, match="needs the ort backend"):
        mobius_lite.build(checkpoint, draft_head="fast")
    with pytest.raises(RouteError, match="not supported"):
        mobius_lite.build(checkpoint, draft_head="quick")


def test_build_cli_fast_head_on_dense_weights(tmp_path: Path, capsys) -> None:
    """Built on --backend ort; refused in one line, with nothing written, without it."""
    checkpoint, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path / "checkpoint")
    out = tmp_path / "package"
    capsys.readouterr()  # the checkpoint writer's progress
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--draft-head", "fast"]
    code = main([*args, "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "needs the ort backend" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()
    assert main([*args, "--backend", "ort", "-q"]) == 0 and (out / "mtp.onnx").is_file()


def test_fast_head_without_a_head_is_refused(tmp_path: Path, capsys) -> None:
    """--draft-head fast on a checkpoint whose config declares no head: one line, exit 2,
    nothing written (before, the flag did nothing)."""
    checkpoint = tmp_path / "checkpoint"
    assert main(["demo", "text", str(checkpoint)]) == 0
    out = tmp_path / "package"
    capsys.readouterr()
    args = ["build", "--model", str(checkpoint), "--output", str(out), "--backend", "ort"]
    code = main([*args, "--draft-head", "fast", "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert "--draft-head fast: the config declares no multi-token-prediction head" in err
    assert not out.exists()
    assert main([*args, "-q"]) == 0 and not (out / "mtp.onnx").exists()


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
