"""GGUF export end to end: tiny nemotron_h / nemotron_h_moe GGUF files written as llama.cpp's
converter writes them (per-tensor type mixes like the real presets; every supported type
across the three cases, the third holding llama.cpp's FP4 / ternary / 1-bit types and an
NVFP4 `.scale` sidecar), exported with `mobius build`, against transformers loaded with
gguf-py's dequantized weights (Q1_0: ggml's definition; foundation gates), their packed bytes
found in the package, verify, --dequantize, node counts, and the onnxruntime routes
(GatherPacked, MatMulNBits; MatMulPacked structure only: CUDA)."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer
from transformers import NemotronHForCausalLM

import mobius_lite
from formats.emit_harness import run_emitter
from mobius_lite.cli.main import main
from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.formats.ggml.relayout.blocks_matmulnbits import (
    MatMulNBitsWeights,
    from_matmulnbits,
)
from mobius_lite.formats.ggml.types import GGML_TYPES, GGML_TYPES_BY_ID
from mobius_lite.formats.ggml.weight import (
    GATHER_PACKED_CPU,
    MATMUL_PACKED,
)
from mobius_lite.weights.verify import verify_package
from parity import drive_parity
from reference_fixtures.gguf_fixtures import (
    PRESET_MIXED,
    _permute_rows,
    build_bpe_tokenizer,
    dequantized_state_dict,
    random_blocks,
    write_gguf,
)
from reference_fixtures.nemotron_reference import make_reference

# end-to-end: builds packages and runs them against their reference (`-m "not slow"`
# leaves them out of a quick run)
pytestmark = pytest.mark.slow

DENSE_TYPES = ("F32", "F16", "BF16")
ALL_TYPES = set(GGML_TYPES)
CODECS = {name: t.codec for name, t in GGML_TYPES.items()}

MOE_WIDE = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "hidden_size": 256,
    "moe_latent_size": 256,
    "moe_intermediate_size": 256,
    "n_group": 2,
    "topk_group": 1,
    "norm_topk_prob": False,
    "routed_scaling_factor": 2.5,
}
HYBRID_WIDE = {
    "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
    "hidden_size": 256,
    "intermediate_size": 256,
    "head_dim": 64,
    "vocab_size": 304,  # the BPE tokenizer's 300 tokens, padded
}
# The types PRESET_MIXED leaves out, each on a tensor whose rows hold whole blocks; q / k are
# Q8_0 / Q4_0 so that the ort route re-lays out permuted rows.
PRESET_REST: dict[str, str] = {
    r"^token_embd": "IQ1_S",
    r"^output\.": "F16",
    r"attn_q\.": "Q8_0",
    r"attn_k\.": "Q4_0",
    r"attn_v\.": "IQ2_S",
    r"attn_output\.": "IQ3_XXS",
    r"blk\.0\.ssm_in\.": "IQ1_M",
    r"blk\.3\.ssm_in\.": "IQ2_XS",
    r"blk\.0\.ssm_out\.": "Q4_1",
    r"blk\.3\.ssm_out\.": "Q5_0",
    r"ffn_up\.": "Q3_K",
    r"ffn_down\.": "Q2_K",
}
# llama.cpp's FP4, ternary and 1-bit types: every row holds whole blocks (NVFP4 64, MXFP4 32,
# Q1_0 128, TQ1_0 / TQ2_0 256 elements); the stacked experts are MXFP4 as llama.cpp's
# MXFP4_MOE recipe writes them, q / k (rows permuted) NVFP4 / Q1_0.
FP4_TERNARY = {
    "layers_block_type": ["mamba", "moe", "attention"],
    "hidden_size": 256,
    "mamba_num_heads": 8,
    "mamba_head_dim": 16,  # d_inner 128
    "head_dim": 32,  # o_proj rows 128
    "moe_latent_size": 64,
    "moe_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 128,
}
PRESET_FP4_TERNARY: dict[str, str] = {
    r"^token_embd": "TQ1_0",
    r"^output\.": "TQ2_0",
    r"attn_q\.": "NVFP4",
    r"attn_k\.": "Q1_0",
    r"attn_v\.": "TQ1_0",
    r"attn_output\.": "Q1_0",
    r"ssm_in\.": "TQ2_0",
    r"ssm_out\.": "NVFP4",
    r"ffn_(up|down)_exps\.": "MXFP4",
    r"ffn_latent_down\.": "Q1_0",
    r"ffn_latent_up\.": "NVFP4",
    r"ffn_up_shexp\.": "NVFP4",
    r"ffn_down_shexp\.": "Q1_0",
}
# An NVFP4 weight's `.scale` sidecar (ModelOpt's weight_scale_2), not 1 as the converter writes it.
FP4_TERNARY_SCALES = {"blk.1.ffn_up_shexp.weight": np.array([0.75], np.float32)}
CASES = {
    "moe": (MOE_WIDE, "nemotron_h_moe", {r"blk\.3\.ffn_up_exps": "Q5_K", **PRESET_MIXED}),
    "hybrid": (HYBRID_WIDE, "nemotron_h", PRESET_REST),
    "fp4_ternary": (FP4_TERNARY, "nemotron_h_moe", PRESET_FP4_TERNARY),
}
SIDECARS = {"fp4_ternary": FP4_TERNARY_SCALES}
# Per case, the MatMulNBits re-layouts of the ort backend (Q8_0 / Q4_0 linears).
ORT_RELAYOUTS = {"moe": 1, "hybrid": 2, "fp4_ternary": 0}
TOKENIZER_CORPUS = ["The quick brown fox jumps over the lazy dog.", "state space 1234"] * 4


def _export(files: list[Path], out: Path, *flags: str) -> Path:
    code = main(["build", "--model", str(files[0]), "--output", str(out), "--quiet", *flags])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Per case: the reference model, the GGUF files and packages for both backends."""
    tmp = tmp_path_factory.mktemp("gguf_export")
    out: dict[str, Any] = {}
    for key, (overrides, arch, types) in CASES.items():
        model = make_reference(overrides)
        tokenizer = None
        if key == "hybrid":
            tokenizer = build_bpe_tokenizer(TOKENIZER_CORPUS, vocab_size=300)
        files = write_gguf(
            tmp / f"{key}.gguf",
            model,
            arch,
            types,
            tokenizer=tokenizer,
            special_tokens={"pad": 0, "bos": 1, "eos": 2} if tokenizer else None,
            scales=SIDECARS.get(key),
        )
        packages = {
            backend: _export(files, tmp / f"{key}-{backend}", "--weights-backend", backend)
            for backend in ("standard", "ort")
        }
        out[key] = {"model": model, "files": files, "packages": packages, "tokenizer": tokenizer}
    return out


def _reference(entry: dict[str, Any]) -> NemotronHForCausalLM:
    """transformers with the GGUF's weights as gguf-py dequantizes them."""
    config = entry["model"].config
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    rebuilt = NemotronHForCausalLM(config).eval()
    rebuilt.load_state_dict(dequantized_state_dict(entry["files"][0]), strict=True)
    return rebuilt


def _tensors(path: Path) -> dict[str, Any]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _manifest(package: Path) -> dict[str, Any]:
    return json.loads((package / "manifest.json").read_text())


def _initializer_bytes(package: Path, manifest: dict[str, Any], name: str, written) -> bytes:
    entry = manifest["graphs"]["decoder"]["initializers"][name]
    with open(package / entry["file"], "rb") as handle:
        handle.seek(entry["offset"] + written["offset"])
        return handle.read(written["length"])


# ----------------------------------------------------------------------------- coverage
def test_the_cases_cover_every_type(written: dict[str, Any]) -> None:
    seen = {t.tensor_type.name for e in written.values() for t in _tensors(e["files"][0]).values()}
    assert seen == ALL_TYPES, ALL_TYPES ^ seen


# ----------------------------------------------------------------------------- parity
@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("key", list(CASES))
def test_export_matches_transformers(written: dict[str, Any], key: str, backend: str) -> None:
    entry = written[key]
    package = entry["packages"][backend]
    config = NemotronHConfig.from_file(package)
    run = drive_parity(_reference(entry), config, package, prompt_length=9, decode_steps=5)
    assert len(run.comparisons) > 6
    failures = run.failures(FP32_NRMSE, FP32_COSINE)
    assert not failures, [str(c) for c in failures[:8]]
    assert run.exported_tokens == run.reference_tokens


def test_routes_per_backend(written: dict[str, Any]) -> None:
    """standard: only standard ops; ort: MatMulNBits for Q8_0 / Q4_0 linears and GatherPacked
    for an embedding table of a supported type (Q6_K here; IQ1_S has none: decoded); none
    for the FP4 / ternary / 1-bit case."""
    ops = {}
    for key in CASES:
        for backend, package in written[key]["packages"].items():
            model = onnx.load(package / "model.onnx", load_external_data=False)
            ops[key, backend] = Counter(
                (n.domain, n.op_type) for g in _graphs(model.graph) for n in g.node
            )
    for key in CASES:
        assert not any(domain for domain, _ in ops[key, "standard"])
    moe, hybrid = ops["moe", "ort"], ops["hybrid", "ort"]
    ms = "com.microsoft"
    assert moe[ms, "GatherPacked"] == 1 and moe[ms, "MatMulNBits"] == 1  # Q6_K table, Q8_0 head
    assert hybrid[ms, "GatherPacked"] == 0 and hybrid[ms, "MatMulNBits"] == 2  # q, k
    # onnxruntime 1.32 has no CPU kernel for the FP4 / ternary / 1-bit types: decoded
    fp4 = ops["fp4_ternary", "ort"]
    assert fp4[ms, "GatherPacked"] == fp4[ms, "MatMulNBits"] == fp4[ms, "MatMulPacked"] == 0
    assert fp4[ms, "LinearAttention"] == 1  # the ort backend all the same


def _graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("key", list(CASES))
def test_packed_bytes_are_in_the_package(written: dict[str, Any], key: str, backend: str) -> None:
    """Every quantized tensor's GGUF bytes: verbatim, rows moved whole (q / k, undone here with
    the converter's own permutation), or a MatMulNBits re-layout that restores them exactly.
    The package's weight bytes are the GGUF's plus the stated overhead (F16 / BF16 -> f32)."""
    entry = written[key]
    package = entry["packages"][backend]
    manifest = _manifest(package)
    tensors = _tensors(entry["files"][0])
    config = entry["model"].config
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    relayouts = 0
    for name, t in tensors.items():
        if t.tensor_type.name in DENSE_TYPES:
            continue
        source = bytes(np.asarray(t.data).view(np.uint8).reshape(-1))
        rows = np.frombuffer(source, np.uint8).reshape(-1, np.asarray(t.data).shape[-1])
        record = manifest["sources"][name]
        assert record["dtype"] == t.tensor_type.name
        assert record["sha256"] == hashlib.sha256(source).hexdigest()
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if "parts" in record:
            relayouts += 1
            parts = {
                p["part"]: _initializer_bytes(package, manifest, p["initializer"], p["written"])
                for p in record["parts"]
            }
            assert record["transform"].endswith("relayout")
            n, k = rows.shape[0], int(t.shape[0])
            k_blocks = k // 32
            weights = MatMulNBitsWeights(
                b=np.frombuffer(parts["b"], np.uint8).reshape(n, k_blocks, -1),
                scales=np.frombuffer(parts["scales"], np.float16).reshape(n, k_blocks),
                zero_points=None,
                bits=8 if t.tensor_type.name == "Q8_0" else 4,
                block_size=32,
            )
            restored = from_matmulnbits(t.tensor_type.name, weights, k)
            if kind in heads:
                restored = _permute_rows(restored, heads[kind])
            assert restored.tobytes() == source, name
            continue
        written_bytes = _initializer_bytes(
            package, manifest, record["initializer"], record["written"]
        )
        if kind in heads:
            assert record["transform"] == "row-permute"
            moved = _permute_rows(
                np.frombuffer(written_bytes, np.uint8).reshape(rows.shape), heads[kind]
            )
            assert moved.tobytes() == source, name
        else:
            assert record["transform"] == "identity"
            assert written_bytes == source, name
    assert relayouts == (0 if backend == "standard" else ORT_RELAYOUTS[key])

    gguf_bytes = sum(int(t.n_bytes) for t in tensors.values())
    widened = sum(
        int(t.n_elements) * 2 for t in tensors.values() if t.tensor_type.name in ("F16", "BF16")
    )
    initializers = manifest["graphs"]["decoder"]["initializers"].values()
    weight_bytes = sum(e["length"] for e in initializers if e["transform"] != "constant")
    assert weight_bytes == gguf_bytes + widened


def test_tokenizer_travels_with_the_package(written: dict[str, Any]) -> None:
    entry = written["hybrid"]
    package = entry["packages"]["standard"]
    rebuilt = Tokenizer.from_file(str(package / "tokenizer.json"))
    for text in ("The lazy fox.", "state 98 space"):
        assert rebuilt.encode(text).ids == entry["tokenizer"].encode(text).ids
    config = json.loads((package / "tokenizer_config.json").read_text())
    assert config["bos_token"] == "<s>"


# ----------------------------------------------------------------------------- verify
# Per case, the attention layer whose k_proj (Q4_0 / Q1_0) gets a flipped byte.
K_PROJ_LAYER = {"hybrid": 1, "fp4_ternary": 2}


@pytest.mark.parametrize("backend", ["standard", "ort"])
@pytest.mark.parametrize("key", list(K_PROJ_LAYER))
def test_verify_passes_and_a_flipped_byte_fails(
    written: dict[str, Any], key: str, backend: str, tmp_path: Path
) -> None:
    entry = written[key]
    package = entry["packages"][backend]
    report = verify_package(package, entry["files"][0])
    assert report.ok, report.mismatches
    relayouts = ORT_RELAYOUTS[key] if backend == "ort" else 0
    assert report.checked == len(_tensors(entry["files"][0])) + relayouts

    copy = tmp_path / "flipped"
    shutil.copytree(package, copy)
    manifest = _manifest(copy)
    target = f"backbone.layers.{K_PROJ_LAYER[key]}.mixer.k_proj.weight"
    target += "_nbits_b" if relayouts else ""
    spot = manifest["graphs"]["decoder"]["initializers"][target]
    data = bytearray((copy / spot["file"]).read_bytes())
    data[spot["offset"] + 5] ^= 0x10
    (copy / spot["file"]).write_bytes(bytes(data))
    flipped = verify_package(copy, entry["files"][0])
    assert not flipped.ok
    assert any(target in m and "differ" in m for m in flipped.mismatches), flipped.mismatches
    # the same through the command line, the GGUF file given as --source
    from mobius_lite.cli.main import main

    assert main(["verify", str(package), "--source", str(entry["files"][0]), "-q"]) == 0
    assert main(["verify", str(copy), "--source", str(entry["files"][0]), "-q"]) == 1


@pytest.mark.parametrize("key", ["moe", "fp4_ternary"])
def test_dequantize_gives_a_dense_package(
    written: dict[str, Any], key: str, tmp_path: Path
) -> None:
    """--dequantize: every weight dense f32 (numpy decode), verify recomputes each with
    gguf-py's dequantize (Q1_0: the storage's own definitional decode), and parity holds."""
    entry = written[key]
    package = _export(entry["files"], tmp_path / "dense", "--dequantize")
    manifest = _manifest(package)
    initializers = manifest["graphs"]["decoder"]["initializers"].values()
    assert {e["dtype"] for e in initializers if e["transform"] != "constant"} == {"FLOAT"}
    transforms = {s["transform"] for s in manifest["sources"].values()}
    assert "dequantize" in transforms and "row-permute+dequantize" in transforms
    report = verify_package(package, entry["files"][0])
    assert report.ok, report.mismatches
    config = NemotronHConfig.from_file(package)
    run = drive_parity(_reference(entry), config, package, prompt_length=9, decode_steps=5)
    assert not run.failures(FP32_NRMSE, FP32_COSINE)
    assert run.exported_tokens == run.reference_tokens


# ----------------------------------------------------------------------------- errors
def test_unknown_type_fails_before_anything_is_written(tmp_path: Path) -> None:
    model = make_reference({"layers_block_type": ["mamba", "attention"]})
    path = write_gguf(tmp_path / "bad.gguf", model, "nemotron_h", {})[0]
    tensor = gguf.GGUFReader(path).tensors[2]
    offset = tensor.field.offset + sum(int(p.nbytes) for p in tensor.field.parts[:4])
    data = bytearray(path.read_bytes())
    assert 99 not in GGML_TYPES_BY_ID
    data[offset : offset + 4] = np.uint32(99).tobytes()  # not a ggml type id
    path.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert main(["build", "--model", str(path), "--output", str(out), "--quiet"]) == 2
    assert not out.exists()


# ----------------------------------------------------------------------------- graph shape
def _op_histogram(path: Path, backend: str) -> Counter:
    package = mobius_lite.build(path, dtype="f32", weights_backend=backend)
    model = package.graphs[0].model
    return Counter((n.domain, n.op_type) for g in model.graphs() for n in g)


@pytest.mark.parametrize("backend", ["standard", "ort"])
def test_node_count_does_not_depend_on_the_expert_count(tmp_path: Path, backend: str) -> None:
    moe = {"layers_block_type": ["moe", "attention"], "moe_intermediate_size": 32}
    types = {r"ffn_up_exps": "Q4_0", r"ffn_down_exps": "IQ4_NL", r"attn": "Q8_0"}
    histograms = []
    for experts in (8, 64):
        model = make_reference({**moe, "n_routed_experts": experts})
        path = write_gguf(tmp_path / f"e{experts}.gguf", model, "nemotron_h_moe", types)[0]
        histograms.append(_op_histogram(path, backend))
    assert histograms[0] == histograms[1]


def test_constant_folding_keeps_weights_packed(written: dict[str, Any], tmp_path: Path) -> None:
    """onnxruntime's optimizer, run at session creation as usual, leaves the packed weights
    packed: its optimized model holds no more initializer bytes than the package (the decode
    of a packed weight reads it through a run-time reshape, so it cannot be folded)."""
    package = written["moe"]["packages"]["standard"]
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", "optimized.data"
    )
    ort.InferenceSession(str(package / "model.onnx"), options, providers=["CPUExecutionProvider"])
    optimized = onnx.load(tmp_path / "optimized.onnx")
    folded = sum(
        onnx.numpy_helper.to_array(t).nbytes
        for g in _graphs(optimized.graph)
        for t in g.initializer
    )
    manifest = _manifest(package)
    weight_bytes = manifest["totals"]["bytes_written"]
    dense = sum(int(t.n_elements) * 4 for t in _tensors(written["moe"]["files"][0]).values())
    assert dense > 3 * weight_bytes  # a folded decode would show
    assert folded < 1.2 * weight_bytes, (folded, weight_bytes)


# ----------------------------------------------------------------------------- ort ops
def _valid_rows(type_name: str, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    qtype = gguf.GGMLQuantizationType[type_name]
    if type_name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32), qtype)
    return random_blocks(type_name, shape, rng)


def test_gather_packed_cpu_types() -> None:
    """GATHER_PACKED_CPU is exactly the set onnxruntime's CPU GatherPacked accepts, and for
    each its rows equal the numpy decode bit for bit."""
    rng = np.random.default_rng(3)
    accepted = set()
    for name, codec in CODECS.items():
        if name in DENSE_TYPES:
            continue
        data = _valid_rows(name, (6, 256), rng)
        ids = np.array([[4, 0], [5, 4]], dtype=np.int64)

        def emit(op, table, index, type_id=codec.type.type_id):
            return op.GatherPacked(
                table, index, packed_type=type_id, K=256, output_dtype=1, _domain="com.microsoft"
            )

        try:
            (rows,) = run_emitter(
                emit, [data, ids], as_initializers=False, opset_imports={"com.microsoft": 1}
            )
        except Exception as err:  # noqa: BLE001  (the refusal is onnxruntime's)
            assert "unsupported packed_type" in str(err), (name, err)
            continue
        accepted.add(name)
        expected = codec.dequantize(data)[ids]
        np.testing.assert_array_equal(rows.view(np.uint32), expected.view(np.uint32), name)
    assert accepted == GATHER_PACKED_CPU


def test_cuda_packed_ops_structure(written: dict[str, Any]) -> None:
    """bf16 (CUDA only) on the ort backend: MatMulPacked for every linear of a contract type;
    the graph passes the ONNX checker."""
    entry = written["moe"]
    package = mobius_lite.build(entry["files"][0], dtype="bf16", ep="cuda", weights_backend="ort")
    model = package.graphs[0].model
    packed = [n for g in model.graphs() for n in g if n.op_type == "MatMulPacked"]
    tensors = _tensors(entry["files"][0])
    linear_types = [
        t.tensor_type.name
        for name, t in tensors.items()
        if len(t.shape) == 2 and name != "token_embd.weight" and "exps" not in name
    ]
    assert len(packed) == sum(name in MATMUL_PACKED for name in linear_types) > 0
    contract = {GGML_TYPES[name].type_id for name in MATMUL_PACKED}
    for node in packed:
        assert node.inputs[1].dtype == ir.DataType.UINT8
        assert node.attributes["packed_type"].as_int() in contract
    onnx.checker.check_model(ir.serde.serialize_model(model))


def test_inspect_shows_each_weights_route(written: dict[str, Any], capsys) -> None:
    """`mobius inspect --json` names how each weight is computed with (read from the graph's
    own consumers), and the manifest's storages; the text report counts them."""
    from mobius_lite.cli.main import main

    package = written["hybrid"]["packages"]["ort"]
    assert main(["inspect", str(package), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    routes = report["models"][0]["weight_routes"]
    manifest = _manifest(package)["graphs"]["decoder"]["initializers"]
    for name, entry in manifest.items():
        if name.endswith("_nbits_b"):
            assert routes[name] == "ort MatMulNBits", name
        elif entry["dtype"] == "UINT8" and entry["transform"] != "constant":
            assert routes[name] in ("standard decode", "ort GatherPacked"), name
    storages = report["manifest.json"]["storage"]
    assert sum(row["tensors"] for row in storages.values()) == len(_manifest(package)["sources"])
    assert main(["inspect", str(package)]) == 0
    assert "weight routes: " in capsys.readouterr().out


@pytest.mark.parametrize("key", list(CASES))
def test_f16_activations_stay_within_the_release_gates(
    written: dict[str, Any], key: str, tmp_path: Path
) -> None:
    """--dtype f16 (decode in f32, one cast to f16): prefill logits against transformers on the
    same dequantized weights within the fixed release gates (NRMSE <= 0.03, cosine >= 0.999),
    the gates every f16 package is held to."""
    import torch

    from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, compare
    from mobius_lite.run.decoder_session import DecoderSession
    from reference_fixtures.nemotron_reference import pinned_torch

    entry = written[key]
    package = _export(entry["files"], tmp_path / "f16", "--dtype", "f16")
    config = NemotronHConfig.from_file(package)
    ids = np.random.default_rng(1).integers(3, config.vocab_size, size=(1, 9))
    session = DecoderSession(package / "model.onnx")
    ours = session.step(ids)["logits"]
    with pinned_torch():
        expected = _reference(entry)(torch.from_numpy(ids)).logits.float().numpy()
    result = compare("f16 prefill logits", ours, expected)
    assert result.passes(RELEASE_NRMSE, RELEASE_COSINE), result


def test_a_gguf_file_of_a_hub_repository(
    written: dict[str, Any], tmp_path: Path, monkeypatch
) -> None:
    """`--model org/name --gguf-file FILE`: the file comes from the Hugging Face cache (offline
    here, a hand-made cache) at the requested revision, and the package records that commit;
    without --gguf-file the same id is looked up as a safetensors repository and refused
    (exit 2)."""
    sha = "7" * 40
    repo = "someorg/tiny-gguf"
    snapshot = tmp_path / "hub" / f"models--{repo.replace('/', '--')}" / "snapshots" / sha
    snapshot.mkdir(parents=True)
    shutil.copy(written["hybrid"]["files"][0], snapshot / "tiny-Q.gguf")
    refs = snapshot.parent.parent / "refs"
    refs.mkdir()
    (refs / "main").write_text(sha)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "pkg"
    args = ["build", "--model", repo, "--gguf-file", "tiny-Q.gguf", "--output", str(out), "-q"]
    assert main(args) == 0
    manifest = _manifest(out)
    assert manifest["source"] == {"model": repo, "revision": sha}
    assert verify_package(out, snapshot / "tiny-Q.gguf").ok
    assert main(["build", "--model", repo, "--output", str(tmp_path / "no"), "-q"]) == 2
