"""The instrumented graph qualify uses: per-layer hidden states and router choices are exposed
without changing any byte of any other output, and what it exposes is what transformers
computes for the same layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_config_file
from mobius_lite.evaluation.instrument import external_data_session_options, instrument
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
from mobius_lite.graphs.cache import BATCH, PAST, cache_tensors
from reference_fixtures.nemotron_reference import make_reference, pinned_torch

PATTERN = ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"]
PROMPT = [5, 17, 33, 8, 61, 12, 40, 3, 77]
DECODE_STEPS = 3


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hidden")
    model = make_reference(dict(layers_block_type=PATTERN), seed=3)
    model.save_pretrained(root / "checkpoint")
    out = mobius_lite.build(root / "checkpoint").save(root / "package", quiet=True)
    return model, load_config_file(root / "checkpoint"), out


def _run(session: ort.InferenceSession, config: NemotronHConfig, tokens: list[list[int]]):
    """Feed the given calls (prefill, then one token each), carrying the session's own cache."""
    names = [o.name for o in session.get_outputs()]
    cache = cache_tensors(config.layers, onnx_dtype())
    past = {  # zero states, attention K/V with no past positions (the cache ABI's shapes)
        c.past_name: np.zeros(
            [1 if d == BATCH else 0 if d == PAST else int(d) for d in c.past_shape],
            c.dtype.numpy(),
        )
        for c in cache
    }
    length, results = 0, []
    for ids in tokens:
        length += len(ids)
        feeds = {
            "input_ids": np.array([ids], np.int64),
            "attention_mask": np.ones((1, length), np.int64),
            **past,
        }
        out = dict(zip(names, session.run(None, feeds), strict=True))
        past = {c.past_name: out[c.present_name] for c in cache}
        results.append(out)
    return results


def onnx_dtype():
    import onnx_ir as ir

    return ir.DataType.FLOAT


def _calls(plain_session, config) -> list[list[int]]:
    """Prefill then greedy decode driven by the plain graph's own tokens."""
    calls = [PROMPT]
    for _ in range(DECODE_STEPS):
        out = _run(plain_session, config, calls)[-1]
        calls.append([int(np.argmax(out["logits"][0, -1]))])
    return calls


def test_every_other_output_is_byte_identical(package) -> None:
    _, config, directory = package
    model_path = directory / "model.onnx"
    plain = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    taps = instrument(model_path, config)
    assert taps.missing == []
    assert set(taps.taps) == {f"hidden_states.{i}" for i in range(len(PATTERN))} | {
        f"routing.{i}.{part}" for i in (1, 5) for part in ("indices", "weights")
    }
    tapped = ort.InferenceSession(
        taps.model_bytes,
        sess_options=external_data_session_options(directory),
        providers=["CPUExecutionProvider"],
    )
    calls = _calls(plain, config)
    for step, (ours, theirs) in enumerate(
        zip(_run(plain, config, calls), _run(tapped, config, calls), strict=True)
    ):
        assert set(ours) < set(theirs)
        for name, value in ours.items():
            other = theirs[name]
            assert other.dtype == value.dtype and other.shape == value.shape, (step, name)
            assert other.tobytes() == value.tobytes(), f"step {step}: {name} changed"

    # Structurally too: the package's nodes come first, unchanged, and only Cast taps follow.
    package_nodes = onnx.load(str(model_path), load_external_data=False).graph.node
    instrumented = onnx.load_from_string(taps.model_bytes).graph.node
    assert list(instrumented[: len(package_nodes)]) == list(package_nodes)
    added = instrumented[len(package_nodes) :]
    assert [n.op_type for n in added] == ["Cast"] * len(taps.taps)


def test_tapped_hidden_states_are_the_reference_block_outputs(package) -> None:
    """hidden_states.{i} equals transformers' output_hidden_states entry after layer i.

    transformers returns (embeddings, after layer 0, ..., after layer L-2, final normed), so
    layers 0..L-2 are compared with its entries 1..L-1; the last block's raw output is
    compared through the final norm instead (the reference's last entry is norm_f of it).
    """
    model, config, directory = package
    taps = instrument(directory / "model.onnx", config)
    tapped = ort.InferenceSession(
        taps.model_bytes,
        sess_options=external_data_session_options(directory),
        providers=["CPUExecutionProvider"],
    )
    ours = _run(tapped, config, [PROMPT])[0]
    with pinned_torch():
        ref = model(torch.tensor([PROMPT]), output_hidden_states=True, use_cache=False)
        hidden = [h[0].float().numpy() for h in ref.hidden_states]
        inner = model.model if hasattr(model, "model") else model.backbone
        last = inner.norm_f(torch.from_numpy(ours[f"hidden_states.{len(PATTERN) - 1}"]))
    assert len(hidden) == len(PATTERN) + 1
    for i in range(len(PATTERN) - 1):
        c = compare(f"hidden_states.{i}", ours[f"hidden_states.{i}"], hidden[i + 1])
        assert c.passes(FP32_NRMSE, FP32_COSINE), c
    c = compare("norm_f(last)", last.numpy(), hidden[-1])
    assert c.passes(FP32_NRMSE, FP32_COSINE), c


def test_taps_not_in_the_package_graph_are_reported(package, tmp_path: Path) -> None:
    """A package whose graph is not what this version builds for the config gets no taps that
    would point at the wrong values: each one is listed as missing instead."""
    _, config, directory = package
    other = load_config_file(directory)
    shifted = NemotronHConfig.from_dict(
        {**other.to_dict(), "layers_block_type": ["mlp", *PATTERN[1:]]}
    )
    taps = instrument(directory / "model.onnx", shifted)
    assert taps.missing, "a graph built for another config must not be tapped blindly"
    assert all("is not in the package graph" in m for m in taps.missing)
