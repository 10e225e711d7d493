"""A GGUF holding llama.cpp's FP4, ternary and 1-bit types (NVFP4, MXFP4, TQ1_0, TQ2_0, Q1_0)
through the CLI: both weight backends and --dequantize build, `verify` recomputes every byte
from the file, `inspect` names each packed weight's route; MXFP4's largest exponent under
--dequantize, and a ggml type this library does not know, are one clear error each.

The block formats themselves (decode vs gguf-py, graph vs decode, the routes' math) are tested
in tests/formats/test_ggml_fp4_ternary.py; model parity on these types is the end-to-end tests'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from mobius_lite.cli.main import main
from reference_fixtures import gguf_fixtures
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.nemotron_reference import make_reference

HYBRID_WIDE = {
    "layers_block_type": ["mamba", "attention", "mlp", "mamba"],
    "hidden_size": 256,
    "intermediate_size": 256,
    "head_dim": 64,
}
# The fp16 scale offsets of the new types (ggml-common.h); the FP4 types' scales are bytes.
NEW_FP16_FIELDS = {"NVFP4": (), "MXFP4": (), "TQ1_0": (52,), "TQ2_0": (64,), "Q1_0": (0,)}
TYPES = {
    r"^token_embd": "NVFP4",  # a gathered table
    r"attn_q\.": "NVFP4",  # rows permuted per head by the converter
    r"attn_k\.": "Q1_0",
    r"attn_v\.": "TQ1_0",
    r"attn_output\.": "MXFP4",
    r"ffn_up\.": "TQ2_0",
    r"ffn_down\.": "Q1_0",
}
MXFP4_MODERATE = (120, 136)  # E8M0 exponents around 2^0: finite weights


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write(path: Path, monkeypatch: pytest.MonkeyPatch, mxfp4_exponent: int | None) -> Path:
    """The GGUF, with random valid blocks of each type; MXFP4 exponents moderate, or all set to
    `mxfp4_exponent`."""
    for name, fields in NEW_FP16_FIELDS.items():
        monkeypatch.setitem(gguf_fixtures.FP16_FIELDS, name, fields)
    random_blocks = gguf_fixtures.random_blocks

    def blocks(type_name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        data = random_blocks(type_name, shape, rng)
        if type_name == "MXFP4":
            view = data.reshape(-1, 17)
            low, high = MXFP4_MODERATE
            view[:, 0] = (
                low + view[:, 0] % (high - low) if mxfp4_exponent is None else mxfp4_exponent
            )
        return data

    monkeypatch.setattr(gguf_fixtures, "random_blocks", blocks)
    return write_gguf(path, make_reference(HYBRID_WIDE), "nemotron_h", TYPES)[0]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    with pytest.MonkeyPatch.context() as monkeypatch:
        path = _write(tmp_path_factory.mktemp("new_types") / "new.gguf", monkeypatch, None)
    stored = {t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert set(NEW_FP16_FIELDS) <= stored
    return path


@pytest.mark.parametrize("flags", [[], ["--weights-backend", "ort"], ["--dequantize"]])
def test_builds_verifies_and_inspects(
    gguf_file: Path, flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pkg"
    code, _, err = _run(
        ["build", "--model", str(gguf_file), "--output", str(out), "--quiet", *flags], capsys
    )
    assert code == 0, err
    code, _, err = _run(["verify", str(out), "--source", str(gguf_file)], capsys)
    assert code == 0, err

    manifest = json.loads((out / "manifest.json").read_text())
    by_type: dict[str, set[str]] = {}
    for record in manifest["sources"].values():
        by_type.setdefault(record["dtype"], set()).add(record["transform"])
    for name in NEW_FP16_FIELDS:
        expected = (
            {"dequantize", "row-permute+dequantize"}
            if flags == ["--dequantize"]
            else {
                "identity",
                "row-permute",
            }
        )
        assert by_type[name] <= expected, (name, by_type[name])

    code, report, _ = _run(["inspect", str(out), "--json"], capsys)
    assert code == 0
    routes: dict[str, Any] = json.loads(report)["models"][0]["weight_routes"]
    initializers = manifest["graphs"]["decoder"]["initializers"]
    packed = [
        n for n, e in initializers.items() if e["dtype"] == "UINT8" and e["transform"] != "constant"
    ]
    if flags == ["--dequantize"]:
        assert packed == []
    else:
        # onnxruntime 1.32 has no CPU kernel for these types: both backends decode
        assert len(packed) == 7 and {routes[n] for n in packed} == {"standard decode"}


def test_mxfp4_overflowing_exponent_is_refused_under_dequantize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """E8M0 0xFF is 2^127 in ggml (not NaN): codes of 2 and more overflow float32. Packed, the
    bytes go through as they are; dequantized, the writer's non-finite check refuses them."""
    path = _write(tmp_path / "ff.gguf", monkeypatch, 0xFF)
    out = tmp_path / "pkg"
    code, _, err = _run(
        ["build", "--model", str(path), "--output", str(out), "--quiet", "--dequantize"], capsys
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "NaN or infinite weights" in err and "o_proj" in err
    assert not out.exists()
    code, _, err = _run(["build", "--model", str(path), "--output", str(out), "--quiet"], capsys)
    assert code == 0, err


def test_unknown_ggml_type_is_one_line_naming_type_and_tensor(
    gguf_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Type 42 (Q2_0, newer than gguf-py 0.19) written into one tensor's header."""
    tensor = gguf.GGUFReader(gguf_file).tensors[2]
    offset = tensor.field.offset + sum(int(p.nbytes) for p in tensor.field.parts[:4])
    data = bytearray(gguf_file.read_bytes())
    data[offset : offset + 4] = np.uint32(42).tobytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(data))
    out = tmp_path / "pkg"
    code, _, err = _run(["build", "--model", str(bad), "--output", str(out), "--quiet"], capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"tensor {tensor.name} has ggml type unknown type id 42" in err
    assert "NVFP4" in err  # the supported list names the new types
    assert not out.exists()
