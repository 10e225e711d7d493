"""ModelOpt NVFP4 / FP8 / MIXED_PRECISION checkpoints exported packed with `mobius build`.

Each case is a tiny Nemotron-H MoE model quantized by the fixtures
(reference_fixtures/modelopt_fixtures.py) and written as ModelOpt lays it out, with its
quantization config in config.json only, in hf_quant_config.json only, or in both, in one or
several shards. The reference is transformers
holding the weights dequantized independently (ml_dtypes' float4 / float8 conversions), since
transformers 5.24 cannot load ModelOpt checkpoints. Gates (fixed): every array at prefill and
5 cached steps within NRMSE <= 1e-4 and cosine >= 0.99999, equal greedy tokens, f32.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint
from parity import drive_parity
from reference_fixtures import modelopt_fixtures as mf

# end-to-end: builds packages and runs them against their reference (`-m "not slow"`
# leaves them out of a quick run)
pytestmark = pytest.mark.slow

# variant -> (shards, where its quantization config is written)
CASES = {
    "nvfp4": (3, {"config.json", "hf_quant_config.json"}),
    "fp8": (1, {"config.json"}),
    "mixed": (2, {"hf_quant_config.json"}),
    "nano": (1, {"config.json", "hf_quant_config.json"}),
}
PACKED = (np.dtype(np.uint8), np.dtype(ml_dtypes.float8_e4m3fn))
EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>up_proj|down_proj)\.weight")


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """variant -> (checkpoint, package), each package built with the CLI."""
    root = tmp_path_factory.mktemp("modelopt_export")
    out = {}
    for variant, (shards, _) in CASES.items():
        checkpoint, package = root / variant / "checkpoint", root / variant / "package"
        mf.write_checkpoint(variant, checkpoint, shards=shards)
        assert main(["build", "--model", str(checkpoint), "--output", str(package), "-q"]) == 0
        out[variant] = (checkpoint, package)
    return out


def _quant_config_files(checkpoint: Path) -> set[str]:
    files = {"hf_quant_config.json"} & {p.name for p in checkpoint.iterdir()}
    if "quantization_config" in json.loads((checkpoint / "config.json").read_text()):
        files.add("config.json")
    return files


@pytest.mark.parametrize("variant", CASES)
def test_matches_transformers_on_the_dequantized_weights(variant, built, tmp_path) -> None:
    checkpoint, package = built[variant]
    shards, where = CASES[variant]
    assert _quant_config_files(checkpoint) == where
    assert len(list(checkpoint.glob("*.safetensors"))) == shards
    reference = mf.dense_reference(checkpoint, tmp_path / "reference")
    run = drive_parity(reference, NemotronHConfig.from_file(checkpoint), package)
    families = {c.name.split("/", 1)[1].rsplit(".", 1)[-1] for c in run.comparisons}
    assert {"logits", "key", "value", "conv_state", "recurrent_state"} <= families
    assert len({c.name.split("/")[0] for c in run.comparisons}) == 6  # prefill + 5 steps
    assert run.failures(FP32_NRMSE, FP32_COSINE) == []
    assert run.exported_tokens == run.reference_tokens


def _initializer_bytes(package: Path) -> dict[str, tuple[int, bytes]]:
    """Initializer name -> (ONNX data type, its bytes), read from the external data files."""
    model = onnx.load(package / "model.onnx", load_external_data=False)
    out = {}
    for tensor in model.graph.initializer:
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            out[tensor.name] = (tensor.data_type, tensor.raw_data)
            continue
        where = {e.key: e.value for e in tensor.external_data}
        with open(package / where["location"], "rb") as f:
            f.seek(int(where["offset"]))
            out[tensor.name] = (tensor.data_type, f.read(int(where["length"])))
    return out


@pytest.mark.parametrize("variant", CASES)
def test_packed_tensors_are_stored_verbatim(variant, built) -> None:
    checkpoint, package = built[variant]
    source = SafetensorsCheckpoint(checkpoint)
    initializers = _initializer_bytes(package)
    expected_type = {
        np.dtype(np.uint8): onnx.TensorProto.UINT8,
        np.dtype(ml_dtypes.float8_e4m3fn): onnx.TensorProto.FLOAT8E4M3FN,
    }
    packed = [n for n in source.names() if source.info(n).dtype in PACKED]
    assert packed, "the fixture wrote no packed tensors"
    for name in packed:
        raw = np.ascontiguousarray(source.read(name)).tobytes()
        expert = EXPERT.match(name)
        if expert:  # stacked in expert order: expert e is slice e of the initializer
            target = f"{expert['prefix']}.{expert['proj']}{name[expert.end() :]}"
            data_type, data = initializers[target]
            e = int(expert["e"])
            assert data[e * len(raw) : (e + 1) * len(raw)] == raw, name
        else:
            data_type, data = initializers[name]
            assert data == raw, name
        assert data_type == expected_type[source.info(name).dtype], name
    written = sum(len(d) for _, d in initializers.values())
    stored = sum(source.info(n).nbytes for n in source.names())
    assert abs(written - stored) <= 0.01 * stored, (written, stored)


@pytest.mark.parametrize("variant", CASES)
def test_verify_and_manifest_record_the_unused_scales(variant, built, capsys) -> None:
    checkpoint, package = built[variant]
    code, err = cli(["verify", str(package), "--source", str(checkpoint)], capsys)
    assert code == 0, err
    manifest = json.loads((package / "manifest.json").read_text())
    source = SafetensorsCheckpoint(checkpoint)
    scales = {n for n in source.names() if n.endswith((".input_scale", ".k_scale", ".v_scale"))}
    assert scales and scales == set(manifest["unused"])
    assert all("weight-only" in e["reason"] for e in manifest["unused"].values())
    assert set(manifest["sources"]) == set(source.names()) - scales


def _graph_ops(package: Path) -> Counter:
    model = onnx.load(package / "model.onnx", load_external_data=False)
    ops: Counter = Counter()

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            ops[node.op_type] += 1
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    walk(attr.g)

    walk(model.graph)
    return ops


def test_session_keeps_the_packed_bytes(built, tmp_path) -> None:
    """onnxruntime constant-folds decodes of initializers into dense floats; the graphs start
    every decode at DequantizeLinear (never folded), so the loaded session stays packed."""
    for variant in ("nvfp4", "fp8"):
        _, package = built[variant]
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(tmp_path / f"{variant}.onnx")
        ort.InferenceSession(str(package / "model.onnx"), options, ["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
        kinds = Counter(
            onnx.TensorProto.DataType.Name(t.data_type) for t in optimized.graph.initializer
        )
        dense_weights = [
            t.name
            for t in optimized.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT
            and len(t.dims) == 2
            and min(t.dims) > 16
            and "gate" not in t.name
            and "embeddings" not in t.name
            and "lm_head" not in t.name
        ]
        assert dense_weights == [], (variant, dense_weights)
        assert kinds["FLOAT8E4M3FN"] > 0 and (variant == "fp8" or kinds["UINT8"] > 0), variant


def test_node_count_does_not_depend_on_the_expert_count(tmp_path) -> None:
    histograms = []
    for experts in (8, 16):
        checkpoint = tmp_path / f"e{experts}"
        mf.write_checkpoint("mixed", checkpoint, overrides={"n_routed_experts": experts})
        package = mobius_lite.build(checkpoint, dtype="f32")
        model = package.graphs[0].model
        histograms.append(Counter(n.op_type for g in model.graphs() for n in g))
    assert histograms[0] == histograms[1]


# --- the ort route (CUDA kernels): valid graphs, built and checked here -----------------------


@pytest.mark.parametrize(
    ("variant", "kernel"),
    [("nvfp4", "MatMulBlockQuantizedFp4Weight"), ("fp8", "MatMulBlockQuantizedFp8Weight")],
)
def test_ort_route_graph(variant, kernel, built, tmp_path, capsys) -> None:
    checkpoint, _ = built[variant]
    package = tmp_path / "ort"
    args = ["build", "--model", str(checkpoint), "--output", str(package), "-q"]
    # the kernels are CUDA-only: the package targets --ep cuda (cpu is refused at build)
    code, err = cli(args + ["--weights-backend", "ort", "--dtype", "f16", "--ep", "cuda"], capsys)
    assert code == 0, err
    onnx.checker.check_model(str(package / "model.onnx"))
    model = onnx.load(package / "model.onnx", load_external_data=False)
    assert {i.domain: i.version for i in model.opset_import}.get("com.microsoft") == 1
    source = SafetensorsCheckpoint(checkpoint)
    single = [  # quantized linears outside the routed experts
        n
        for n in source.names()
        if n.endswith(".weight") and source.info(n).dtype in PACKED and not EXPERT.match(n)
    ]
    ops = _graph_ops(package)
    assert ops[kernel] == len(single)
    inputs = {n.input[1] for n in model.graph.node if n.op_type == kernel}
    assert inputs == set(single)
    # `mobius verify` reads the checkpoint as the export does (its packed storages)
    code, err = cli(["verify", str(package), "--source", str(checkpoint), "-q"], capsys)
    assert code == 0, err
    # f32 activations have no such kernel: refused before anything is written
    code, err = cli(args[:4] + [str(tmp_path / "f32"), "--weights-backend", "ort"], capsys)
    assert code == 2 and "float16 or bfloat16" in err and "Traceback" not in err
    assert not (tmp_path / "f32").exists()


# --- bad inputs: one clear error each, before anything is written -----------------------------


def _unknown_algorithm(tensors, config, hf) -> None:
    hf["quantization"]["quantized_layers"]["backbone.layers.0.mixer.in_proj"] = {
        "quant_algo": "INT4_AWQ"
    }


def _group_size_32(tensors, config, hf) -> None:
    hf["quantization"]["group_size"] = 32
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32


def _wrong_scale_shape(tensors, config, hf) -> None:
    name = "backbone.layers.3.mixer.q_proj.weight_scale"
    tensors[name] = tensors[name][:, :1]


def _missing_scale_2(tensors, config, hf) -> None:
    del tensors["backbone.layers.4.mixer.experts.3.down_proj.weight_scale_2"]


def _files_disagree(tensors, config, hf) -> None:
    hf["quantization"]["exclude_modules"] = ["lm_head", "backbone.layers.0.mixer.in_proj"]


BAD = [
    (
        "mixed",
        _unknown_algorithm,
        r"MIXED_PRECISION .*backbone\.layers\.0\.mixer\.in_proj: "
        r"'INT4_AWQ'",
    ),
    ("nvfp4", _group_size_32, r"NVFP4 group_size must be 16, got 32"),
    (
        "nvfp4",
        _wrong_scale_shape,
        r"wrong shape \(1\): backbone\.layers\.3\.mixer\.q_proj\."
        r"weight_scale is \[(\d+), 1\], expected \(\1, 2\)",
    ),
    (
        "mixed",
        _missing_scale_2,
        r"missing quantization tensors \(1\): backbone\.layers\.4\.mixer"
        r"\.experts\.3\.down_proj\.weight_scale_2",
    ),
    ("nvfp4", _files_disagree, r"disagree on the quantization: exclude"),
]


@pytest.mark.parametrize(("variant", "edit", "message"), BAD, ids=[b[1].__name__ for b in BAD])
def test_bad_input_is_one_clear_error(variant, edit, message, tmp_path, capsys) -> None:
    checkpoint, package = tmp_path / "checkpoint", tmp_path / "package"
    mf.write_checkpoint(variant, checkpoint, edit=edit)
    capsys.readouterr()  # transformers' own progress output while writing the fixture
    code, err = cli(["build", "--model", str(checkpoint), "--output", str(package)], capsys)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mobius build: error: "), err
    assert re.search(message, lines[0]), lines[0]
    assert not package.exists() and not list(tmp_path.glob(".*package*"))
