"""`mobius build --dequantize` on ModelOpt checkpoints.

FP8: each E4M3 weight is written as its exact values in float32 (an exact cast) and its
per-tensor FP32 weight_scale (per expert, stacked) as the slot's output scale, which the graph
multiplies each product by. References, independent of the export: transformers on the
weights dequantized by the fixtures with ml_dtypes (e4m3 x scale in float32) under the FP32
gates (f32) and the release gates (f16), batch 2 with left padding; the initializers against
ml_dtypes' float8_e4m3fn decode of the checkpoint's bytes and its weight_scale tensors.
NVFP4 (and a MIXED_PRECISION checkpoint with NVFP4 layers) has no such form: refused in one
line from the config, before anything is read or written.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.errors import RouteError
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE, RELEASE_COSINE, RELEASE_NRMSE
from parity import drive_parity
from reference_fixtures import modelopt_fixtures as mf
from test_modelopt_export import cli

pytestmark = pytest.mark.slow  # builds packages and runs them against transformers

EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>up_proj|down_proj)\.weight$")
E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
# package -> its build flags (beside --dequantize); f32-fused: the experts on the MoE kernel
ROUTES = {
    "f32": ["--dtype", "f32"],
    "f16": ["--dtype", "f16"],
    "f32-fused": ["--dtype", "f32", "--backend", "ort", "--activations", "exact-fused"],
}


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The fixtures' FP8 checkpoint and its --dequantize packages (ROUTES), built by the CLI."""
    root = tmp_path_factory.mktemp("modelopt_dequantize")
    out = {"checkpoint": root / "checkpoint"}
    mf.write_checkpoint("fp8", out["checkpoint"])
    for name, flags in ROUTES.items():
        out[name] = root / name
        args = ["build", "--model", str(out["checkpoint"]), "--output", str(out[name])]
        assert main([*args, *flags, "--dequantize", "-q"]) == 0
    return out


@pytest.mark.parametrize(
    ("dtype", "nrmse", "cosine"),
    [
        ("f32", FP32_NRMSE, FP32_COSINE),
        ("f16", RELEASE_NRMSE, RELEASE_COSINE),
        ("f32-fused", FP32_NRMSE, FP32_COSINE),
    ],
)
def test_matches_transformers_on_the_dequantized_weights(
    fp8, dtype, nrmse, cosine, tmp_path
) -> None:
    reference = mf.dense_reference(fp8["checkpoint"], tmp_path / "reference")
    config = NemotronHConfig.from_file(fp8["checkpoint"])
    run = drive_parity(reference, config, fp8[dtype], batch=2, left_padding=(3, 0))
    assert len({c.name.split("/")[0] for c in run.comparisons}) == 6  # prefill + 5 steps
    assert run.failures(nrmse, cosine) == []
    assert run.exported_tokens == run.reference_tokens


def _initializers(package: Path) -> dict[str, np.ndarray]:
    """Initializer name -> its array (external data read as written)."""
    model = onnx.load(package / "model.onnx", load_external_data=False)
    out = {}
    for tensor in model.graph.initializer:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            where = {e.key: e.value for e in tensor.external_data}
            with open(package / where["location"], "rb") as f:
                f.seek(int(where["offset"]))
                raw = f.read(int(where["length"]))
        else:
            raw = tensor.raw_data
        out[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))
    return out


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_weights_are_the_e4m3_values_and_the_scales_are_output_scales(fp8, dtype) -> None:
    """Every FP8 weight: dense float32 holding ml_dtypes' decode of its bytes exactly (the
    scaled product computes in float32, also in an f16 build); its weight_scale: the slot's
    `_output_scale`, bit for bit. No FLOAT8 initializer and no decode node remain."""
    tensors = mf.read_tensors(fp8["checkpoint"])
    written = _initializers(fp8[dtype])
    weights = [n for n, a in tensors.items() if a.dtype == E4M3]
    assert weights
    for name in weights:
        values = tensors[name].astype(np.float32)  # ml_dtypes: exact
        scale = tensors[name + "_scale"].astype(np.float32).reshape(1)
        expert = EXPERT.match(name)
        if expert:
            target = f"{expert['prefix']}.{expert['proj']}"
            e = int(expert["e"])
            weight, output_scale = written[target][e], written[target + "_output_scale"][e : e + 1]
        else:
            weight, output_scale = written[name], written[name + "_output_scale"]
        assert weight.dtype == np.float32 and output_scale.dtype == np.float32, name
        assert np.array_equal(weight.view(np.uint32), values.view(np.uint32)), name
        assert np.array_equal(output_scale.view(np.uint32), scale.view(np.uint32)), name
    model = onnx.load(fp8[dtype] / "model.onnx", load_external_data=False)
    assert not [
        t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT8E4M3FN
    ]
    assert "DequantizeLinear" not in _ops(model.graph)


def _ops(graph: onnx.GraphProto) -> set[str]:
    """The op types of a graph and of every subgraph in it."""
    ops = set()
    for node in graph.node:
        ops.add(node.op_type)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                ops |= _ops(attr.g)
    return ops


def test_f32_experts_fold_their_scales_and_take_the_dense_paths(fp8, tmp_path) -> None:
    """f32: each stacked expert weight times its per-expert scale is a constant expression
    onnxruntime folds at session creation, so the experts compute as dense f32 experts (the
    Scan over weight slices is in the graph; with exact-fused the MoE kernel) and the session
    holds no unscaled expert weight or expert scale."""
    model = onnx.load(fp8["f32"] / "model.onnx", load_external_data=False)
    assert "Scan" in _ops(model.graph)
    fused = onnx.load(fp8["f32-fused"] / "model.onnx", load_external_data=False)
    assert "MoE" in _ops(fused.graph)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(fp8["f32"] / "model.onnx"), options, ["CPUExecutionProvider"])
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    names = {t.name for t in optimized.graph.initializer}
    experts = [n for n in names if re.search(r"\.experts\.(up|down)_proj", n)]
    assert experts == [], experts


def test_verify_passes_and_the_manifest_records_the_cast(fp8, capsys) -> None:
    checkpoint, package = fp8["checkpoint"], fp8["f32"]
    code, err = cli(["verify", str(package), "--source", str(checkpoint)], capsys)
    assert code == 0, err
    manifest = json.loads((package / "manifest.json").read_text())
    tensors = mf.read_tensors(checkpoint)
    weights = {n for n, a in tensors.items() if a.dtype == E4M3}
    for name in weights:
        entry = manifest["sources"][name]
        assert entry["dtype"] == "float8_e4m3fn" and len(entry["sha256"]) == 64, name
    transforms = {
        e["transform"]
        for graph in manifest["graphs"].values()
        for t, e in graph["initializers"].items()
        if any(s in weights for s in e["sources"])
    }
    assert transforms == {"cast", "stack+cast"}
    unused = {n for n in tensors if n.endswith((".input_scale", ".k_scale", ".v_scale"))}
    assert unused and unused == set(manifest["unused"])
    assert all("weight-only" in e["reason"] for e in manifest["unused"].values())


@pytest.mark.parametrize(
    ("variant", "found"),
    [
        ("nvfp4", "the ModelOpt checkpoint is NVFP4"),
        ("mixed", r"MIXED_PRECISION checkpoint stores \d+ layer\(s\) as NVFP4 \(first: backbone"),
    ],
)
def test_nvfp4_is_refused_in_one_line_before_anything_is_written(
    variant, found, tmp_path, capsys
) -> None:
    checkpoint, package = tmp_path / "checkpoint", tmp_path / "package"
    mf.write_checkpoint(variant, checkpoint)
    capsys.readouterr()
    args = ["build", "--model", str(checkpoint), "--output", str(package), "--dequantize"]
    code, err = cli(args, capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mobius build: error: --dequantize: "), err
    assert re.search(found, lines[0]) and "without --dequantize" in lines[0], lines[0]
    assert "Traceback" not in err
    assert not package.exists() and not list(tmp_path.glob(".*package*"))
    with pytest.raises(RouteError, match=found):
        mobius_lite.build(checkpoint, dequantize=True)
