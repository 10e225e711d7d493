"""ModelOpt NVFP4 / FP8: reference decode against ml_dtypes, graph decode against the reference
(bit for bit, onnxruntime CPU), quantization-config parsing and header checks, ort-route graphs."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
from onnxscript import GraphBuilder

from formats.emit_harness import run_emitter
from mobius_lite.enums import Backend
from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.formats.modelopt import fp8, nvfp4
from mobius_lite.formats.modelopt.quant_config import (
    QuantAlgo,
    QuantTensorError,
    check_tensors,
    load_quantization,
    parse_quantization,
)
from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint
from reference_fixtures import modelopt_fixtures as mf

E4M3 = ml_dtypes.float8_e4m3fn
FINITE_E4M3 = np.array([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=np.uint8)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(
        a.astype(np.float32).view(np.uint32), b.astype(np.float32).view(np.uint32)
    )


def independent_nvfp4(packed: np.ndarray, scale: np.ndarray, scale_2: np.ndarray) -> np.ndarray:
    """ml_dtypes' float4 / float8 conversions, same multiplication order, any leading dims."""
    nibbles = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), dtype=np.uint8)
    nibbles[..., 0::2] = packed & 0x0F
    nibbles[..., 1::2] = packed >> 4
    values = nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    blocked = values.reshape(scale.shape + (16,)) * scale.astype(np.float32)[..., None]
    s2 = np.asarray(scale_2, np.float32)
    return blocked.reshape(values.shape) * s2.reshape(s2.shape + (1, 1))


def random_nvfp4(rng: np.random.Generator, lead: tuple[int, ...], n: int, k: int):
    """Random codes (every byte value) and finite block scales (every finite pattern)."""
    packed = rng.integers(0, 256, size=lead + (n, k // 2), dtype=np.uint8)
    positive = FINITE_E4M3[FINITE_E4M3 < 0x80]  # scales are positive; zero, subnormals too
    bits = rng.choice(positive, size=lead + (n, k // 16)).astype(np.uint8)
    assert packed.size >= 256 and bits.size >= positive.size, "too small to cover every pattern"
    packed.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)
    bits.reshape(-1)[: positive.size] = positive
    scale_2 = rng.uniform(1e-4, 1e-2, size=lead).astype(np.float32)
    return packed, bits.view(E4M3), scale_2


# --- reference decode ---------------------------------------------------------------------


def test_e2m1_all_sixteen_codes_match_ml_dtypes() -> None:
    expected = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert same_bits(nvfp4.E2M1_VALUES, expected)  # -0 keeps its sign
    assert list(nvfp4.E2M1_VALUES[:8]) == [0, 0.5, 1, 1.5, 2, 3, 4, 6]


def test_e4m3_every_bit_pattern_matches_ml_dtypes() -> None:
    expected = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    assert set(np.flatnonzero(np.isnan(fp8.E4M3_VALUES))) == {0x7F, 0xFF}
    assert set(np.flatnonzero(np.isnan(expected))) == {0x7F, 0xFF}
    decoded = fp8.e4m3_to_float32(FINITE_E4M3.view(E4M3), "t")
    assert same_bits(decoded, expected[FINITE_E4M3])
    assert decoded[1] == 2.0**-9 and decoded[7] == 7 * 2.0**-9  # subnormals
    assert decoded.max() == 448.0


@pytest.mark.parametrize("bad", [0x7F, 0xFF])
def test_e4m3_nan_patterns_are_refused_naming_the_tensor(bad: int) -> None:
    bits = np.array([[0x38, bad]], dtype=np.uint8)
    with pytest.raises(CheckpointError, match=r"layers\.0\.x\.weight_scale.*NaN"):
        fp8.e4m3_to_float32(bits.view(E4M3), "layers.0.x.weight_scale")
    with pytest.raises(CheckpointError, match="w.weight_scale"):
        nvfp4.dequantize(np.zeros((1, 8), np.uint8), bits[:, 1:].view(E4M3), 1.0, "w.weight")


def test_nibble_layout_low_nibble_is_even_k() -> None:
    packed = np.array([[0x21, 0xF3]], dtype=np.uint8)
    assert nvfp4.unpack_codes(packed).tolist() == [[1, 2, 3, 15]]
    codes = np.random.default_rng(0).integers(0, 16, size=(3, 32), dtype=np.uint8)
    assert np.array_equal(nvfp4.unpack_codes(nvfp4.pack_codes(codes)), codes)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_nvfp4_dequantize_matches_ml_dtypes(lead: tuple[int, ...]) -> None:
    packed, scale, scale_2 = random_nvfp4(np.random.default_rng(1), lead, 32, 64)
    scale_2 = scale_2 if lead else np.float32(3e-3)
    expected = independent_nvfp4(packed, scale, scale_2)
    assert same_bits(nvfp4.dequantize(packed, scale, scale_2), expected)


def test_fp8_dequantize_matches_ml_dtypes() -> None:
    weight = np.resize(FINITE_E4M3, (6, 64)).view(E4M3)
    expected = weight.astype(np.float32) * np.float32(0.0173)
    assert same_bits(fp8.dequantize(weight, np.float32(0.0173)), expected)


# --- graph decode (onnxruntime CPU) equals the reference bit for bit ----------------------


@pytest.mark.parametrize("lead", [(), (3,)])
def test_nvfp4_graph_dense_uint8_storage(lead: tuple[int, ...]) -> None:
    packed, scale, scale_2 = random_nvfp4(np.random.default_rng(2), lead, 32, 64)
    scale_2 = scale_2 if lead else np.array(2.5e-3, np.float32)
    expected = nvfp4.dequantize(packed, scale, scale_2)
    (out,) = run_emitter(nvfp4.emit_dense, [packed, scale, scale_2], as_initializers=True)
    assert same_bits(out, expected)
    raw = scale.view(np.uint8)  # block scales as raw bytes, fed as graph inputs
    (out,) = run_emitter(nvfp4.emit_dense, [packed, raw, scale_2])
    assert same_bits(out, expected)


@pytest.mark.parametrize("lead", [(), (3,)])
def test_nvfp4_graph_dense_float4_initializer(lead: tuple[int, ...]) -> None:
    packed, scale, scale_2 = random_nvfp4(np.random.default_rng(3), lead, 32, 64)
    scale_2 = scale_2 if lead else np.array(7e-4, np.float32)
    codes = nvfp4.unpack_codes(packed).view(ml_dtypes.float4_e2m1fn)  # [.., N, K]
    (out,) = run_emitter(nvfp4.emit_dense, [codes, scale, scale_2], as_initializers=True)
    assert same_bits(out, nvfp4.dequantize(packed, scale, scale_2))


def test_fp4_tensor_holds_the_stored_bytes() -> None:
    packed, _, _ = random_nvfp4(np.random.default_rng(4), (), 32, 64)
    tensor = nvfp4.fp4_tensor(packed, "w")
    assert tensor.dtype == ir.DataType.FLOAT4E2M1 and list(tensor.shape) == [32, 64]
    proto = ir.serde.serialize_tensor(tensor)
    assert proto.data_type == onnx.TensorProto.FLOAT4E2M1 and proto.raw_data == packed.tobytes()
    as_codes = ir.tensor(nvfp4.unpack_codes(packed).view(ml_dtypes.float4_e2m1fn))
    assert as_codes.tobytes() == packed.tobytes()  # the harness's initializer is the same bytes


@pytest.mark.parametrize("storage", ["uint8", "float4"])
def test_nvfp4_graph_rows_after_expert_gather(storage: str) -> None:
    packed, scale, scale_2 = random_nvfp4(np.random.default_rng(5), (4,), 16, 64)
    weight = (
        packed if storage == "uint8" else nvfp4.unpack_codes(packed).view(ml_dtypes.float4_e2m1fn)
    )
    experts = np.array([3, 0, 3], dtype=np.int64)
    (out,) = run_emitter(nvfp4.emit_rows, [weight, scale, scale_2, experts], as_initializers=True)
    assert same_bits(out, nvfp4.dequantize(packed, scale, scale_2)[experts])


@pytest.mark.parametrize("lead", [(), (3,)])
def test_fp8_graph_dense(lead: tuple[int, ...]) -> None:
    rng = np.random.default_rng(6)
    weight = rng.choice(FINITE_E4M3, size=lead + (8, 40)).astype(np.uint8)
    weight.reshape(-1)[:254] = FINITE_E4M3
    weight = weight.view(E4M3)
    scale = rng.uniform(1e-3, 1.0, size=lead).astype(np.float32)
    (out,) = run_emitter(fp8.emit_dense, [weight, scale], as_initializers=True)
    assert same_bits(out, fp8.dequantize(weight, scale))


def test_fp8_graph_rows_after_expert_gather() -> None:
    rng = np.random.default_rng(7)
    weight = rng.choice(FINITE_E4M3, size=(5, 8, 16)).astype(np.uint8).view(E4M3)
    scale = rng.uniform(1e-3, 1.0, size=5).astype(np.float32)
    experts = np.array([4, 1], dtype=np.int64)
    (out,) = run_emitter(fp8.emit_rows, [weight, scale, experts], as_initializers=True)
    assert same_bits(out, fp8.dequantize(weight, scale)[experts])


# --- the ort (CUDA) route: valid graphs of the installed wheel's contrib ops ---------------


def _ort_graph(emit, arrays: list[tuple[str, ir.DataType, list[int]]]) -> onnx.ModelProto:
    values = [ir.Value(name=n, type=ir.TensorType(t), shape=ir.Shape(s)) for n, t, s in arrays]
    graph = ir.Graph(
        inputs=values,
        outputs=[],
        nodes=[],
        opset_imports={"": 27, "com.microsoft": 1},
        name="ort_route",
    )
    out = emit(GraphBuilder(graph).op, *values)
    out.name = "y"
    graph.outputs.append(out)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=11))
    onnx.checker.check_model(proto)
    return proto


def _schema(name: str):
    return next(
        s
        for s in ort_state.get_all_operator_schema()
        if s.name == name and s.domain == "com.microsoft"
    )


def test_nvfp4_ort_route_graph() -> None:
    n, k = 64, 128
    u8, f16, f32 = ir.DataType.UINT8, ir.DataType.FLOAT16, ir.DataType.FLOAT
    proto = _ort_graph(
        nvfp4.emit_matmul_ort,
        [("x", f16, [2, k]), ("w", u8, [n, k // 2]), ("s", u8, [n, k // 16]), ("s2", f32, [])],
    )
    (node,) = [nd for nd in proto.graph.node if nd.domain == "com.microsoft"]
    assert node.op_type == "MatMulBlockQuantizedFp4Weight"
    assert list(node.input) == ["x", "w", "s", "s2"]
    assert {a.name: a.i for a in node.attribute} == {"block_size": 16}
    schema = _schema("MatMulBlockQuantizedFp4Weight")
    assert [i.name for i in schema.inputs][:4] == ["A", "B", "weight_scale", "weight_scale_2"]
    with pytest.raises(ValueError, match="UINT8 storage"):
        _ort_graph(
            nvfp4.emit_matmul_ort,
            [
                ("x", f16, [2, k]),
                ("w", ir.DataType.FLOAT4E2M1, [n, k]),
                ("s", u8, [n, k // 16]),
                ("s2", f32, []),
            ],
        )


def test_fp8_ort_route_graph() -> None:
    n, k = 64, 200
    f8, bf16, f32 = ir.DataType.FLOAT8E4M3FN, ir.DataType.BFLOAT16, ir.DataType.FLOAT
    proto = _ort_graph(
        lambda op, x, w, s: fp8.emit_matmul_ort(op, x, w, s, in_features=k),
        [("x", bf16, [3, k]), ("w", f8, [n, k]), ("s", f32, [])],
    )
    (node,) = [nd for nd in proto.graph.node if nd.domain == "com.microsoft"]
    assert node.op_type == "MatMulBlockQuantizedFp8Weight"
    assert node.input[:2] == ["x", "w"]
    assert {a.name: a.i for a in node.attribute} == {"block_size": fp8.ORT_FP8_BLOCK}
    assert [i.name for i in _schema("MatMulBlockQuantizedFp8Weight").inputs][:3] == [
        "A",
        "B",
        "b_scale",
    ]


# --- quantization config and header checks -------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    root = tmp_path_factory.mktemp("modelopt")
    return {
        v: (root / v, mf.write_checkpoint(v, root / v, shards=2 if v == "mixed" else 1))
        for v in mf.VARIANTS
    }


@pytest.mark.parametrize("variant", mf.VARIANTS)
def test_each_variant_parses_resolves_and_checks(variant: str, checkpoints) -> None:
    directory, model = checkpoints[variant]
    quant = load_quantization(directory)
    modules = mf.linear_modules(model)
    plan = mf.storage_plan(variant, modules)
    assert {m: quant.resolve(m).value for m in modules} == plan
    assert quant.kv_cache_algo is (QuantAlgo.FP8 if mf.kv_fp8(variant) else QuantAlgo.NONE)
    check_tensors(quant, SafetensorsCheckpoint(directory), modules)
    if variant == "nano":  # wildcard exclusion of the attention layer and the Mamba before it
        assert quant.resolve("backbone.layers.2.mixer.in_proj") is QuantAlgo.NONE
        assert quant.resolve("backbone.layers.0.mixer.in_proj") is QuantAlgo.NVFP4
        assert quant.resolve("model.layers.3.mixer.q_proj") is QuantAlgo.NONE


def test_fixture_dense_weights_are_close_to_the_source(checkpoints) -> None:
    """The fixture quantizer is realistic: NVFP4 / FP8 errors of a few / ten percent."""
    for variant, bound in (("nvfp4", 0.15), ("fp8", 0.05)):
        directory, model = checkpoints[variant]
        dense = mf.dequantized_state_dict(directory)
        source = model.state_dict()["model.layers.0.mixer.in_proj.weight"].numpy()
        got = dense["backbone.layers.0.mixer.in_proj.weight"]
        assert np.linalg.norm(got - source) / np.linalg.norm(source) < bound


def _configs(directory: Path) -> tuple[dict, dict | None]:
    hf = directory / "hf_quant_config.json"
    config = json.loads((directory / "config.json").read_text())
    return config, (json.loads(hf.read_text()) if hf.exists() else None)


def test_unknown_algorithm_in_mixed_precision(checkpoints) -> None:
    config, hf = _configs(checkpoints["mixed"][0])
    hf["quantization"]["quantized_layers"]["backbone.layers.0.mixer.in_proj"] = {
        "quant_algo": "INT4_AWQ"
    }
    with pytest.raises(ConfigError, match=r"backbone\.layers\.0\.mixer\.in_proj: 'INT4_AWQ'"):
        parse_quantization(config, hf)


def test_nvfp4_group_size_other_than_16(checkpoints) -> None:
    config, hf = _configs(checkpoints["nvfp4"][0])
    hf["quantization"]["group_size"] = 32
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 32
    config["quantization_config"].pop("quant_algo")  # algorithm read from config_groups
    with pytest.raises(ConfigError, match="group_size must be 16, got 32"):
        parse_quantization(config, hf)
    config, hf = _configs(checkpoints["mixed"][0])
    hf["quantization"]["quantized_layers"]["backbone.layers.1.mixer.experts.0.up_proj"] = {
        "quant_algo": "NVFP4",
        "group_size": 32,
    }
    with pytest.raises(ConfigError, match="group_size must be 16"):
        parse_quantization(config, hf)


def test_files_that_disagree(checkpoints) -> None:
    config, hf = _configs(checkpoints["nvfp4"][0])
    hf["quantization"]["exclude_modules"] = ["lm_head", "backbone.layers.0.mixer.in_proj"]
    with pytest.raises(ConfigError, match="disagree.*exclude"):
        parse_quantization(config, hf)
    config, hf = _configs(checkpoints["nano"][0])
    hf["quantization"] = {**hf["quantization"], "quant_algo": "FP8"}
    with pytest.raises(ConfigError, match="disagree.*quant_algo"):
        parse_quantization(config, hf)


def test_other_bad_configs() -> None:
    with pytest.raises(ConfigError, match="quant_method 'awq'"):
        parse_quantization({"quantization_config": {"quant_method": "awq"}}, None)
    with pytest.raises(ConfigError, match="'INT8_SQ' is not supported"):
        parse_quantization(None, {"quantization": {"quant_algo": "INT8_SQ"}})
    with pytest.raises(ConfigError, match="needs a quantized_layers"):
        parse_quantization(None, {"quantization": {"quant_algo": "MIXED_PRECISION"}})
    assert parse_quantization({"model_type": "nemotron_h"}, None) is None


def _break(tmp_path: Path, variant: str, edit) -> tuple[Path, object]:
    directory = tmp_path / variant
    model = mf.write_checkpoint(variant, directory, edit=lambda t, c, h: edit(t))
    return directory, model


def _check(directory: Path, model) -> None:
    check_tensors(
        load_quantization(directory), SafetensorsCheckpoint(directory), mf.linear_modules(model)
    )


def test_wrong_block_scale_shape(tmp_path: Path) -> None:
    names = ["backbone.layers.0.mixer.in_proj.weight_scale", "lm_head.weight_scale"]

    def edit(t):
        t[names[0]] = t[names[0]][:, :1]

    with pytest.raises(QuantTensorError, match="wrong shape") as error:
        _check(*_break(tmp_path, "nvfp4", edit))
    assert error.value.names == [f"{names[0]} is [100, 1], expected (100, 2)"]


def test_missing_scale_2(tmp_path: Path) -> None:
    gone = [
        "backbone.layers.1.mixer.experts.5.down_proj.weight_scale_2",
        "backbone.layers.4.mixer.experts.0.up_proj.weight_scale_2",
    ]

    def edit(t):
        for name in gone:
            del t[name]

    with pytest.raises(QuantTensorError, match="missing") as error:
        _check(*_break(tmp_path, "mixed", edit))
    assert error.value.names == sorted(gone)


def test_unexpected_dtype_and_stray_scales(tmp_path: Path) -> None:
    name = "backbone.layers.1.mixer.shared_experts.up_proj.weight"

    def edit(t):  # FP8 expected here (mixed); BF16 stored
        t[name] = np.zeros((32, 32), dtype=ml_dtypes.bfloat16)

    with pytest.raises(QuantTensorError, match="unexpected dtype") as error:
        _check(*_break(tmp_path, "mixed", edit))
    assert len(error.value.names) == 1 and error.value.names[0].startswith(name)

    def stray(t):  # a scale for a module the config keeps dense (lm_head)
        t["lm_head.weight_scale"] = np.array(1.0, np.float32)

    with pytest.raises(QuantTensorError, match="does not call for") as error:
        _check(*_break(tmp_path / "b", "fp8", stray))
    assert error.value.names == ["lm_head.weight_scale"]


# --- run-time decode, storages and weight formats (formats/modelopt/storage.py, weight.py) --


@pytest.mark.parametrize("lead", [(), (3,)])
def test_nvfp4_run_time_decode_is_bit_exact(lead: tuple[int, ...]) -> None:
    packed, scale, scale_2 = random_nvfp4(np.random.default_rng(8), lead, 32, 64)
    scale_2 = scale_2 if lead else np.array(4e-3, np.float32)
    expected = nvfp4.dequantize(packed, scale, scale_2)
    (out,) = run_emitter(
        nvfp4.emit_dense_at_run_time, [packed, scale, scale_2], as_initializers=True
    )
    assert same_bits(out, expected)


def test_nvfp4_rows_of_one_table_share_the_scalar_scale_2() -> None:
    packed, scale, _ = random_nvfp4(np.random.default_rng(9), (), 32, 64)
    scale_2 = np.array(3e-3, np.float32)
    rows = np.array([5, 0, 5, 31], dtype=np.int64)
    (out,) = run_emitter(
        lambda op, w, s, s2, i: nvfp4.emit_rows(op, w, s, s2, i, per_row_scale_2=False),
        [packed, scale, scale_2, rows],
        as_initializers=True,
    )
    assert same_bits(out, nvfp4.dequantize(packed, scale, scale_2)[rows])


def test_storages_are_verbatim_and_refuse_dense_targets() -> None:
    from mobius_lite.errors import RouteError
    from mobius_lite.formats.dense import dense
    from mobius_lite.formats.modelopt import storage

    codes, weights, scales = (
        storage.nvfp4_codes(()),
        storage.fp8_weights((1,)),
        storage.e4m3_scales(),
    )
    assert (codes.name, weights.name, scales.name) == ("uint8", "float8_e4m3fn", "float8_e4m3fn")
    assert codes.conversion_to(dense(np.uint8)).verbatim
    assert weights.conversion_to(dense(E4M3)).verbatim
    raw = bytes(range(256))
    assert scales.conversion_to(dense(np.uint8)).convert(raw) == raw  # the bits, not a cast
    for s in (codes, scales):
        with pytest.raises(RouteError, match="NVFP4 weights have no dense conversion"):
            s.conversion_to(dense(np.float32))
    for target in (np.int8, ml_dtypes.float8_e5m2):
        with pytest.raises(RouteError, match="FP8 weights convert to"):
            weights.conversion_to(dense(target))


@pytest.mark.parametrize("target", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_fp8_weights_cast_exactly_to_dense_floats(target) -> None:
    """--dequantize: every E4M3 bit pattern becomes the float ml_dtypes decodes it to (in
    float64, then the target: exact, each value is representable), NaN patterns NaN; verify's
    recompute (ml_dtypes' own cast) gives the same bytes."""
    from mobius_lite.formats.dense import dense
    from mobius_lite.formats.modelopt import storage

    conversion = storage.fp8_weights(()).conversion_to(dense(target))
    assert (conversion.name, conversion.unit_bytes, conversion.verbatim) == ("cast", 1, False)
    raw = bytes(range(256))
    written = np.frombuffer(bytes(conversion.convert(raw)), dtype=target)
    expected = np.frombuffer(raw, dtype=E4M3).astype(np.float64)
    assert np.array_equal(written.astype(np.float64), expected, equal_nan=True)
    assert np.array_equal(written.astype(np.float64).astype(target), written, equal_nan=True)
    assert conversion.recompute(raw) == bytes(conversion.convert(raw))


def test_weight_formats_parameters_and_routes() -> None:
    from mobius_lite.errors import RouteError
    from mobius_lite.formats.modelopt import storage

    f16 = ir.DataType.FLOAT16
    fmt = storage.nvfp4_codes(()).weight_format(f16, Backend.ORT, (8, 64, 32), True)
    assert not fmt.kernel  # stacked experts decode with standard ops on every backend
    shapes = {k: (p.shape, p.dtype) for k, p in fmt.parameters((8, 64, 32)).items()}
    assert shapes == {
        "": (ir.Shape([8, 64, 16]), ir.DataType.UINT8),
        "_scale": (ir.Shape([8, 64, 2]), ir.DataType.FLOAT8E4M3FN),
        "_scale_2": (ir.Shape([8]), ir.DataType.FLOAT),
    }
    kernel = storage.nvfp4_codes((1,)).weight_format(f16, Backend.ORT, (64, 32), False)
    assert kernel.kernel and kernel.parameters((64, 32))["_scale"].dtype == ir.DataType.UINT8
    # f32 activations: the CUDA kernel is refused when the graph is built (before any tensor
    # is read); under --activations a linear leaves the kernel first (on_exact_layout)
    f32 = storage.fp8_weights(()).weight_format(ir.DataType.FLOAT, Backend.ORT, (64, 32), False)
    weight = np.zeros((64, 32), ml_dtypes.float8_e4m3fn)

    def emit(op, x, w, scale):
        return f32.matmul(op, x, {"": w, "_scale": scale})

    with pytest.raises(RouteError, match="float16 or bfloat16"):
        run_emitter(emit, [np.zeros((1, 32), np.float32), weight, np.float32(1.0)])
    assert not f32.on_exact_layout(4).kernel  # the fused CPU routes: the standard decode
