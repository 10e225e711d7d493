"""Streaming sharded writer: shard boundaries, names, subgraph references, casts, and
onnxruntime running sharded packages (a synthetic Loop model and a real tiny Nemotron-H,
whose sharded logits must equal the unsharded package's and match transformers).

Oracles: onnx's own external-data loader, numpy, onnxruntime and transformers (torch FP32).
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from mobius_lite.sources import MemorySource
from mobius_lite.weights.binding import BoundTensor, bind_model, graph_parameters, plan_bindings
from mobius_lite.weights.writer import ALIGNMENT, write_model

SHARD_PATTERN = re.compile(r"^model\.onnx-(\d{5})-of-(\d{5})\.data$")


def synthetic_model(
    sizes: list[int], target: type = np.float32, seed: int = 0
) -> tuple[ir.Model, dict[str, np.ndarray]]:
    """A graph with one FP32-sourced initializer per size (in elements), each bound lazily."""
    rng = np.random.default_rng(seed)
    arrays = {f"w{i:04d}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate(sizes)}
    dtype = ir.DataType.from_numpy(np.dtype(target))
    inits, nodes, outputs = [], [], []
    for name, array in arrays.items():
        value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(dtype))
        inits.append(value)
        node = ir.Node("", "Identity", [value], num_outputs=1)
        node.outputs[0].name = f"out_{name}"
        nodes.append(node)
        outputs.append(node.outputs[0])
    graph = ir.Graph([], outputs, nodes=nodes, initializers=inits, opset_imports={"": 21})
    model = ir.Model(graph, ir_version=10)
    source = MemorySource(arrays)
    bind_model(model, plan_bindings(graph_parameters(model), source), source)
    return model, arrays


def data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name != "model.onnx")


def loaded_initializers(directory: Path) -> dict[str, np.ndarray]:
    """Initializers as onnx's own loader resolves their external data (independent oracle)."""
    model = onnx.load(str(directory / "model.onnx"))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def assert_regular_shards(directory: Path) -> None:
    for path in data_files(directory):
        st = os.lstat(path)
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1, path


def test_tensor_larger_than_a_shard_sits_alone(tmp_path: Path) -> None:
    # 400 B, 4000 B, 400 B with 1000-byte shards: the big tensor gets a shard of its own.
    model, arrays = synthetic_model([100, 1000, 100])
    result = write_model(model, tmp_path, shard_size=1000)
    files = data_files(tmp_path)
    assert [f.name for f in files] == [f"model.onnx-0000{i}-of-00003.data" for i in (1, 2, 3)]
    sizes = [f.stat().st_size for f in files]
    assert sizes == [400, 4000, 400]
    by_file = {}
    for t in result.tensors:
        by_file.setdefault(t.file, []).append(t.name)
    assert by_file[files[1].name] == ["w0001"]
    loaded = loaded_initializers(tmp_path)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
    assert_regular_shards(tmp_path)


def test_many_tiny_tensors_fill_shards_greedily(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    sizes = [int(n) for n in rng.integers(1, 40, size=300)]  # 4..156 bytes each
    model, arrays = synthetic_model(sizes)
    shard_size = 2000
    result = write_model(model, tmp_path, shard_size=shard_size)
    files = data_files(tmp_path)
    assert len(files) > 1
    for index, path in enumerate(files, start=1):
        match = SHARD_PATTERN.match(path.name)
        assert match and int(match[1]) == index and int(match[2]) == len(files)
        assert path.stat().st_size <= shard_size
    # Greedy: every shard but the last is closed only because the next tensor did not fit.
    order = result.tensors
    for current, following in zip(order, order[1:], strict=False):
        if following.file != current.file:
            end = os.path.getsize(tmp_path / current.file)
            aligned = -(-end // ALIGNMENT) * ALIGNMENT
            assert aligned + following.length > shard_size
    loaded = loaded_initializers(tmp_path)
    assert set(loaded) == set(arrays)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)
    assert_regular_shards(tmp_path)


@pytest.mark.parametrize(("shard_size", "per_shard"), [(4096, 4), (4095, 3), (1 << 30, 12)])
def test_exact_fits(tmp_path: Path, shard_size: int, per_shard: int) -> None:
    # Twelve 1024-byte tensors (already 64-aligned): 4096-byte shards hold exactly four.
    model, arrays = synthetic_model([256] * 12)
    write_model(model, tmp_path, shard_size=shard_size)
    files = data_files(tmp_path)
    count = 12 // per_shard
    if count == 1:
        assert [f.name for f in files] == ["model.onnx.data"]
    else:
        assert len(files) == count
    assert all(f.stat().st_size == per_shard * 1024 for f in files)
    loaded = loaded_initializers(tmp_path)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)


def test_cast_per_chunk_matches_numpy(tmp_path: Path) -> None:
    # Small chunks force every tensor through several cast chunks.
    model, arrays = synthetic_model([5000, 3, 70000], target=np.float16)
    write_model(model, tmp_path, shard_size=1 << 30, chunk_bytes=4096)
    loaded = loaded_initializers(tmp_path)
    for name, array in arrays.items():
        assert loaded[name].dtype == np.float16
        np.testing.assert_array_equal(loaded[name], array.astype(np.float16))


def test_cast_to_bfloat16_matches_ml_dtypes(tmp_path: Path) -> None:
    model, arrays = synthetic_model([5000, 7], target=ml_dtypes.bfloat16)
    write_model(model, tmp_path, chunk_bytes=4096)
    proto = onnx.load(str(tmp_path / "model.onnx"))
    for tensor in proto.graph.initializer:
        assert tensor.data_type == onnx.TensorProto.BFLOAT16
        expected = arrays[tensor.name].astype(ml_dtypes.bfloat16).tobytes()
        assert numpy_helper.to_array(tensor).tobytes() == expected, tensor.name


def test_write_never_materialises_lazy_tensors(tmp_path: Path, monkeypatch) -> None:
    """Data is streamed chunk by chunk; serializing the proto must not call tobytes/numpy."""

    def forbidden(self, *args, **kwargs):
        raise AssertionError(f"{self.name}: whole tensor materialised")

    monkeypatch.setattr(BoundTensor, "tobytes", forbidden)
    monkeypatch.setattr(BoundTensor, "numpy", forbidden)
    model, arrays = synthetic_model([1000, 20, 3000])
    write_model(model, tmp_path, shard_size=5000)
    # The model object keeps its lazy tensors, so it can be saved again.
    assert all(isinstance(v.const_value, BoundTensor) for v in model.graph.initializers.values())
    loaded = loaded_initializers(tmp_path)
    for name, array in arrays.items():
        np.testing.assert_array_equal(loaded[name], array)


def loop_model() -> tuple[ir.Model, dict[str, np.ndarray]]:
    """y = x + outer + inner, computed inside a Loop body that reads an outer-scope
    initializer (`outer`) and owns one (`inner`); both lazily bound to a memory source."""
    n = 600
    rng = np.random.default_rng(2)
    arrays = {
        "outer": rng.standard_normal(n).astype(np.float32),
        "inner": rng.standard_normal(n).astype(np.float32),
    }
    ftype = ir.TensorType(ir.DataType.FLOAT)
    outer = ir.Value(name="outer", shape=ir.Shape([n]), type=ftype)
    inner = ir.Value(name="inner", shape=ir.Shape([n]), type=ftype)
    step = ir.Value(name="step", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.INT64))
    cond_in = ir.Value(name="cond_in", shape=ir.Shape([]), type=ir.TensorType(ir.DataType.BOOL))
    acc_in = ir.Value(name="acc_in", shape=ir.Shape([n]), type=ftype)
    add1 = ir.Node("", "Add", [acc_in, outer], num_outputs=1)
    add2 = ir.Node("", "Add", [add1.outputs[0], inner], num_outputs=1)
    cond_out = ir.Node("", "Identity", [cond_in], num_outputs=1)
    add2.outputs[0].name = "acc_out"
    cond_out.outputs[0].name = "cond_out"
    body = ir.Graph(
        [step, cond_in, acc_in],
        [cond_out.outputs[0], add2.outputs[0]],
        nodes=[add1, add2, cond_out],
        initializers=[inner],
        name="body",
    )
    x = ir.Value(name="x", shape=ir.Shape([n]), type=ftype)
    trip = ir.Value(name="trip", const_value=ir.tensor(np.array(1, dtype=np.int64)))
    true = ir.Value(name="true", const_value=ir.tensor(np.array(True)))
    loop = ir.Node("", "Loop", [trip, true, x], attributes=[ir.AttrGraph("body", body)])
    loop.outputs[0].name = "y"
    graph = ir.Graph(
        [x],
        [loop.outputs[0]],
        nodes=[loop],
        initializers=[outer, trip, true],
        opset_imports={"": 21},
    )
    model = ir.Model(graph, ir_version=10)
    source = MemorySource(arrays)
    plan = plan_bindings(
        {"outer": ((n,), np.dtype(np.float32)), "inner": ((n,), np.dtype(np.float32))}, source
    )
    by_target = plan.by_target()
    outer.const_value = BoundTensor(by_target["outer"], source)
    inner.const_value = BoundTensor(by_target["inner"], source)
    return model, arrays


def test_subgraph_initializers_are_sharded_and_ort_runs_them(tmp_path: Path) -> None:
    import onnxruntime as ort

    model, arrays = loop_model()
    write_model(model, tmp_path, shard_size=3000)  # 2400 bytes each: one shard per tensor
    files = [f.name for f in data_files(tmp_path)]
    assert files == ["model.onnx-00001-of-00002.data", "model.onnx-00002-of-00002.data"]
    proto = onnx.load(str(tmp_path / "model.onnx"), load_external_data=False)
    body = proto.graph.node[0].attribute[0].g
    assert body.initializer[0].data_location == onnx.TensorProto.EXTERNAL
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    x = np.arange(600, dtype=np.float32)
    (y,) = session.run(None, {"x": x})
    np.testing.assert_array_equal(y, x + arrays["outer"] + arrays["inner"])


# --------------------------------------------------------------------------- real model
def subgraph_nodes(graph: onnx.GraphProto) -> tuple[set[str], set[str]]:
    """Op types and input names of every node inside any subgraph (any depth) of `graph`."""
    ops: set[str] = set()
    inputs: set[str] = set()

    def walk(g: onnx.GraphProto, nested: bool) -> None:
        for node in g.node:
            if nested:
                ops.add(node.op_type)
                inputs.update(node.input)
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    walk(sub, True)

    walk(graph, False)
    return ops, inputs


def test_sharded_package_runs_in_ort_like_unsharded_and_transformers(
    tiny_checkpoint, tmp_path: Path
) -> None:
    """A tiny Nemotron-H (Mamba, MoE with its expert Loop, attention, MLP) saved with 16 KB
    shards and unsharded: identical logits from both in onnxruntime, and both match
    transformers in torch FP32 within the FP32 parity gates."""
    import onnxruntime as ort
    import torch

    import mobius_lite
    from mobius_lite.configs import NemotronHConfig
    from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, compare
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.weights.verify import check_references, external_references
    from reference_fixtures.nemotron_reference import pinned_torch

    shared = tiny_checkpoint(["mamba", "moe", "attention", "mlp"])
    reference, checkpoint = shared.model, shared.path
    package = mobius_lite.build(checkpoint, dtype="f32")
    sharded = package.save(tmp_path / "sharded", shard_size="16KB", quiet=True)
    single = package.save(tmp_path / "single", quiet=True)

    shards = sorted(p.name for p in sharded.glob("*.data"))
    assert len(shards) > 3 and all(SHARD_PATTERN.match(s) for s in shards)
    assert sorted(p.name for p in single.glob("*.data")) == ["model.onnx.data"]
    manifest = json.loads((sharded / "manifest.json").read_text())
    oversized = {
        t["file"]
        for t in manifest["graphs"]["decoder"]["initializers"].values()
        if t["length"] > 16_000
    }
    for s in shards:
        if s not in oversized:
            assert (sharded / s).stat().st_size <= 16_000, s
    assert check_references(sharded, manifest) == []
    # The experts run in subgraphs (If branches, a Loop body) that read the stacked expert
    # tensors from outer scope: their external references must resolve there too.
    proto = onnx.load(str(sharded / "model.onnx"), load_external_data=False)
    sub_ops, sub_inputs = subgraph_nodes(proto.graph)
    assert "Loop" in sub_ops or any(n.op_type == "Loop" for n in proto.graph.node)
    refs = external_references(sharded / "model.onnx")
    stacked = {r.name for r in refs if r.name.endswith((".experts.up_proj", ".experts.down_proj"))}
    assert stacked and stacked <= sub_inputs

    config = NemotronHConfig.from_file(checkpoint)
    ids = np.random.default_rng(0).integers(3, config.vocab_size, size=(1, 11)).astype(np.int64)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    logits, decoded = {}, {}
    for name, directory in (("sharded", sharded), ("single", single)):
        session = DecoderSession(directory / "model.onnx", session_options=options)
        logits[name] = session.step(ids)["logits"]
        # One cached decode step too: a single token takes the other expert branch.
        decoded[name] = session.step(np.array([[5]], dtype=np.int64))["logits"]
    np.testing.assert_array_equal(logits["sharded"], logits["single"])
    np.testing.assert_array_equal(decoded["sharded"], decoded["single"])
    with pinned_torch():
        expected = reference(torch.from_numpy(ids)).logits.float().numpy()
    for name, actual in logits.items():
        result = compare(f"{name}/logits", actual, expected)
        assert result.passes(FP32_NRMSE, FP32_COSINE), result
