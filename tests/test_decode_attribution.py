"""mobius_lite.bench.attribution's knocked-out graphs compute what the model computes with
those layers skipped (transformers, the layers' forward hooked to return their input), pass
the layers' caches through, and keep none of the layers' own weights; its per-kind weight
bytes per decode step are the layers' own initializers, routed experts at k / E."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from mobius_lite.bench.attribution import knock_out, package_with_graph, step_weight_bytes
from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.enums import LayerKind
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.layout import DECODER_FILE
from mobius_lite.run.decoder_session import DecoderSession

LAYERS = ("mamba", "moe", "attention", "mlp", "moe", "mamba")


@pytest.fixture(scope="module")
def package(tiny_package) -> Path:
    return tiny_package(LAYERS)


def skipped_reference_logits(model, layers: set[int], ids: np.ndarray) -> np.ndarray:
    """transformers' logits with the given blocks returning their input (residual only)."""
    handles = [
        model.model.layers[i].register_forward_hook(
            lambda _m, args, kwargs, _out: args[0] if args else kwargs["hidden_states"],
            with_kwargs=True,
        )
        for i in layers
    ]
    try:
        with torch.no_grad():
            return model(torch.from_numpy(ids)).logits.numpy()
    finally:
        for handle in handles:
            handle.remove()


@pytest.mark.parametrize("kind", ["mamba", "moe", "attention", "mlp", "all"])
def test_knocked_out_layers_are_skipped(package, tiny_checkpoint, tmp_path, kind) -> None:
    kinds = [k.value for k in NemotronHConfig.from_file(package / "config.json").layers_block_type]
    layers = {i for i, k in enumerate(kinds) if kind in (k, "all")}
    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    edited = knock_out(model, layers)
    variant = package_with_graph(package, tmp_path / "variant", edited)
    for node in edited.graph.node:  # of a knocked-out layer only its pass-through is left
        if any(f"layers.{i}/" in node.name for i in layers):
            assert node.op_type == "Identity" and node.name.endswith("_knocked_out"), node.name
    kept = {t.name for t in edited.graph.initializer}
    assert not any(name.startswith(f"backbone.layers.{i}.") for name in kept for i in layers)

    session = DecoderSession(variant / DECODER_FILE)
    session.reset(1)
    ids = np.random.default_rng(3).integers(3, 90, size=(1, 7))
    past = dict(session.past)
    logits = session.step(ids)["logits"]
    expected = skipped_reference_logits(tiny_checkpoint(LAYERS).model, layers, ids)
    result = compare("knocked-out prefill logits", logits, expected)
    assert result.passes(FP32_NRMSE, FP32_COSINE), result
    for name, value in session.past.items():  # the step's presents became the new pasts
        if int(name.split(".")[1]) in layers:
            assert np.array_equal(value, past[name]), name


def test_step_weight_bytes_are_each_kinds_own_initializers(package) -> None:
    config = NemotronHConfig.from_file(package / "config.json")
    kinds = list(config.layers_block_type)
    experts, k = config.n_routed_experts, config.num_experts_per_tok
    model = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    expected: dict[str, float] = {}
    for t in model.graph.initializer:
        parts = t.name.split(".")
        if parts[:2] != ["backbone", "layers"]:
            continue
        size = int(np.prod(t.dims)) * 4  # an f32 package
        kind = kinds[int(parts[2])]
        routed = ".mixer.experts." in t.name
        share = size * k / experts if routed else size
        expected[kind.value] = expected.get(kind.value, 0.0) + share
    got = step_weight_bytes(model, kinds, experts, k)
    for kind in {k.value for k in kinds}:
        assert got[kind] == int(expected[kind]), kind
    # top: the lm_head and the final norm, not the embedding table (one row per token)
    vocab, hidden = config.vocab_size, config.hidden_size
    assert got["top"] == (vocab * hidden + hidden) * 4
    assert LayerKind.MOE in kinds


def test_embedding_lookups_read_one_row() -> None:
    """A packed or block-quantized embedding table (GatherPacked, GatherBlockQuantized) is not
    a per-step read; the lm_head beside it is, whole."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(np.zeros((97, 66), np.uint8), "backbone.embeddings.weight")
    head = numpy_helper.from_array(np.zeros((97, 2, 34), np.uint8), "lm_head.weight_nbx_b")
    scales = numpy_helper.from_array(np.zeros((97, 2), np.float32), "lm_head.weight_nbx_scales")
    nodes = [
        helper.make_node(
            op,
            ["backbone.embeddings.weight", "ids"],
            [f"rows_{op}"],
            name=f"backbone/embeddings/{op}_node_1",
            domain="com.microsoft",
        )  # fmt: skip
        for op in ("GatherPacked", "GatherBlockQuantized")
    ]
    nodes.append(
        helper.make_node(
            "MatMulNBits",
            ["h", "lm_head.weight_nbx_b", "lm_head.weight_nbx_scales"],
            ["logits"],
            name="lm_head/MatMulNBits_node_2",
            domain="com.microsoft",
        )  # fmt: skip
    )
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)],
        [table, head, scales],
    )
    got = step_weight_bytes(helper.make_model(graph), [LayerKind.MAMBA], 8, 2)
    assert got == {"top": 97 * 2 * 34 + 97 * 2 * 4}
