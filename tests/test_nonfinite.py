"""Non-finite weights: counted per tensor while the writer streams them, refused before
publishing unless allowed, recorded in the manifest; and qualify never passes generation on
non-finite logits (regression: both sides picked token 0 from NaN logits and it passed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file, save_file

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.errors import PackageError
from mobius_lite.evaluation.qualify import qualify

LAYERS = dict(layers_block_type=["linear_attention", "full_attention", "mlp"])
NAN_TENSOR = "lm_head.weight"
INF_TENSOR = "backbone.layers.2.mixer.up_proj.weight"
BIG_TENSOR = "backbone.layers.1.mixer.o_proj.weight"  # finite in f32, infinite in f16


@pytest.fixture(scope="module")
def broken(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    directory = tmp_path_factory.mktemp("nonfinite") / "checkpoint"
    shutil.copytree(tiny_checkpoint(LAYERS["layers_block_type"]).path, directory)
    path = directory / "model.safetensors"
    tensors = load_file(path)
    tensors[NAN_TENSOR][3, :5] = float("nan")
    tensors[INF_TENSOR][0, 0] = float("inf")
    tensors[INF_TENSOR][1, 1] = float("-inf")
    tensors[BIG_TENSOR][0, :2] = 1.0e6
    save_file(tensors, path, metadata={"format": "pt"})
    return directory


def expected_counts(checkpoint: Path, dtype: np.dtype) -> dict[str, int]:
    tensors = load_file(checkpoint / "model.safetensors")
    counts = {}
    for name, tensor in tensors.items():
        with np.errstate(over="ignore"):  # overflow to inf is what is being counted
            values = tensor.numpy().astype(dtype)  # independent of the writer
        bad = int(values.size - np.isfinite(values).sum())
        if bad:
            counts[name] = bad
    return counts


def test_refused_before_publishing(broken: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "pkg"
    code = main(["build", "--model", str(broken), "--output", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{NAN_TENSOR} (5 values)" in err and f"{INF_TENSOR} (2 values)" in err
    assert "--allow-nonfinite" in err
    assert BIG_TENSOR not in err  # finite in f32
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial" in p.name]


def test_cast_overflow_is_caught_too(broken: Path, tmp_path: Path) -> None:
    with pytest.raises(PackageError, match=rf"{BIG_TENSOR} \(2 values\)"):
        mobius_lite.build(broken, dtype="f16").save(tmp_path / "pkg", quiet=True)


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_allowed_and_recorded(broken: Path, tmp_path: Path, dtype: str) -> None:
    out = tmp_path / "pkg"
    code = main(
        ["build", "--model", str(broken), "--output", str(out), "--dtype", dtype, "-q"]
        + ["--allow-nonfinite"]
    )
    assert code == 0
    manifest = json.loads((out / "manifest.json").read_text())
    initializers = manifest["graphs"]["decoder"]["initializers"]
    recorded = {n: e["nonfinite"] for n, e in initializers.items() if e.get("nonfinite")}
    expected = expected_counts(broken, np.float32 if dtype == "f32" else np.float16)
    assert recorded == expected and set(expected) >= {NAN_TENSOR, INF_TENSOR}
    assert manifest["totals"]["nonfinite_values"] == sum(expected.values())
    assert all("nonfinite" in e for e in initializers.values() if e["sources"])


def test_qualify_generation_fails_on_nan_logits(broken: Path, tmp_path: Path) -> None:
    out = mobius_lite.build(broken).save(tmp_path / "pkg", quiet=True, allow_nonfinite=True)
    prompt = [5, 17, 33, 8]  # lm_head row 3 holds NaN: logit 3 is NaN at every position
    report = qualify(out, broken, prompt_ids=prompt, steps=1, output=tmp_path / "q")
    generation = report.verdicts["generation"]
    assert generation.status == "FAIL" and "non-finite logits" in generation.summary
    assert report.verdicts["numerical_parity"].status == "FAIL"
