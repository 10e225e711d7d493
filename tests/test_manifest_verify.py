"""Fidelity manifest and `mobius verify`: every source tensor accounted for once, hashes that
match independently computed ones, and verification that catches a flipped shard byte, a
changed source, links and missing shards.

Oracles: the safetensors library (source bytes), onnx's external-data loader (written bytes),
numpy casts and hashlib.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.errors import PackageError, VerificationError
from mobius_lite.formats.dense import Cast
from mobius_lite.weights.manifest import read_manifest
from mobius_lite.weights.verify import verify_package

EXPERT = re.compile(r"\.experts\.(\d+)\.")
MTP_TENSOR = "mtp.layers.0.norm.weight"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    """A tiny Nemotron-H checkpoint (per-expert tensors, FP32) plus one MTP tensor that the
    config declares and the decoder deliberately does not use."""
    import shutil

    path = tmp_path_factory.mktemp("manifest") / "checkpoint"
    shutil.copytree(tiny_checkpoint(["mamba", "moe", "attention", "mlp"]).path, path)
    tensors = load_file(path / "model.safetensors")
    tensors[MTP_TENSOR] = np.linspace(0, 1, 32, dtype=np.float32)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    return path


def export(checkpoint: Path, directory: Path, dtype: str, **options) -> Path:
    return mobius_lite.build(checkpoint, dtype=dtype).save(directory, quiet=True, **options)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        value = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([value ^ 0x01]))


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_manifest_accounts_for_every_source_tensor(
    checkpoint: Path, tmp_path: Path, dtype: str
) -> None:
    package = mobius_lite.build(checkpoint, dtype=dtype)
    out = package.save(tmp_path / "pkg", quiet=True, shard_size="16KB")
    manifest = json.loads((out / "manifest.json").read_text())
    source = load_file(checkpoint / "model.safetensors")

    assert manifest["format_version"] == 2
    assert manifest["tool"]["version"] == mobius_lite.__version__
    assert manifest["dtype"] == dtype
    assert manifest["source"] == package.metadata["source"]  # caller metadata at top level
    bound, unused = set(manifest["sources"]), set(manifest["unused"])
    assert bound | unused == set(source) and not bound & unused
    assert unused == {MTP_TENSOR}
    assert "multi-token" in manifest["unused"][MTP_TENSOR]["reason"]

    model = onnx.load(str(out / "model.onnx"))
    written = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    assert set(manifest["graphs"]["decoder"]["initializers"]) <= set(written)
    seen_transforms = set()
    for name, entry in manifest["sources"].items():
        array = source[name]
        assert entry["sha256"] == hashlib.sha256(array.tobytes()).hexdigest(), name
        target = written[entry["initializer"]]
        expert = EXPERT.search(name)
        part = target[int(expert[1])] if expert else target
        expected = ("stack" if expert else "") + ("" if target.dtype == array.dtype else "cast")
        assert (
            entry["transform"]
            == {"stack": "stack", "cast": "cast", "stackcast": "stack+cast", "": "identity"}[
                expected
            ]
        ), name
        seen_transforms.add(entry["transform"])
        # The written bytes are the source cast by numpy, and hashed as such.
        np.testing.assert_array_equal(part, array.astype(target.dtype), err_msg=name)
        assert entry["written"]["sha256"] == hashlib.sha256(part.tobytes()).hexdigest(), name
    # Router weights stay FP32 whatever the dtype: both plain kinds appear in an f16 export.
    wanted = {"identity", "stack"} if dtype == "f32" else {"identity", "cast", "stack+cast"}
    assert wanted <= seen_transforms


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_verify_catches_a_flipped_shard_byte(
    checkpoint: Path, tmp_path: Path, dtype: str, capsys
) -> None:
    out = export(checkpoint, tmp_path / "pkg", dtype, shard_size="16KB")
    report = verify_package(out, checkpoint)
    manifest = read_manifest(out)
    assert report.ok, report.mismatches
    assert report.checked == len(manifest["sources"])

    name, entry = next(
        (n, e)
        for n, e in manifest["graphs"]["decoder"]["initializers"].items()
        if e["transform"].startswith("stack")
    )
    per_expert = entry["length"] // len(entry["sources"])
    position = entry["length"] // 2 + 3
    expert_source = entry["sources"][position // per_expert]
    flip_byte(out / entry["file"], entry["offset"] + position)

    report = verify_package(out, checkpoint)
    assert not report.ok
    assert len(report.mismatches) == 1
    assert name in report.mismatches[0] and expert_source in report.mismatches[0]
    assert f"at byte {position} of the initializer" in report.mismatches[0]
    capsys.readouterr()
    assert main(["verify", str(out), "--source", str(checkpoint), "--quiet"]) == 1
    printed = capsys.readouterr().out
    assert "MISMATCH" in printed and name in printed

    flip_byte(out / entry["file"], entry["offset"] + position)  # undo: verdict follows the byte
    assert verify_package(out, checkpoint).ok
    assert main(["verify", str(out), "--source", str(checkpoint), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_verify_catches_a_changed_source(checkpoint: Path, tmp_path: Path) -> None:
    copy = tmp_path / "checkpoint"
    shutil.copytree(checkpoint, copy)
    out = export(copy, tmp_path / "pkg", "f16")
    tensors = load_file(copy / "model.safetensors")
    victim = "backbone.layers.0.mixer.in_proj.weight"
    tensors[victim] = tensors[victim] + np.float32(0.5)
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    report = verify_package(out, copy)
    assert not report.ok
    assert all(victim in m for m in report.mismatches)
    assert any("source bytes changed" in m for m in report.mismatches)


def test_verify_reports_links_and_missing_shards(checkpoint: Path, tmp_path: Path) -> None:
    out = export(checkpoint, tmp_path / "pkg", "f32", shard_size="16KB")
    shards = sorted(out.glob("model.onnx-*.data"))
    outside = tmp_path / "elsewhere.data"
    shutil.copyfile(shards[0], outside)
    shards[0].unlink()
    shards[0].symlink_to(outside)  # same bytes, but a link: ORT refuses these in subgraphs
    os.link(shards[1], tmp_path / "second-name.data")
    shards[2].unlink()
    report = verify_package(out, checkpoint)
    text = "\n".join(report.mismatches)
    assert f"{shards[0].name} is a symbolic link" in text
    assert f"{shards[1].name} has 2 hard links" in text
    assert f"{shards[2].name} is missing" in text


def test_not_a_package(checkpoint: Path, tmp_path: Path, capsys) -> None:
    with pytest.raises(PackageError, match="not a mobius package"):
        verify_package(tmp_path, checkpoint)
    assert main(["verify", str(tmp_path), "--source", str(checkpoint)]) == 2
    assert "not a mobius package" in capsys.readouterr().err
    # A complete package under a staging name is still not reported as a package.
    out = export(checkpoint, tmp_path / "pkg", "f32")
    hidden = tmp_path / f".pkg.partial-{os.getpid()}-abc"
    shutil.copytree(out, hidden)
    with pytest.raises(PackageError, match="temporary directory"):
        read_manifest(hidden)


def test_save_verify_refuses_to_publish_corrupt_output(
    checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    out = export(checkpoint, tmp_path / "good", "f16", verify=True)
    assert verify_package(out, checkpoint).ok
    original = Cast.convert

    def corrupting(self, raw):
        data = bytearray(original(self, raw))
        if len(data) > 100:
            data[100] ^= 0x80
        return bytes(data)

    monkeypatch.setattr(Cast, "convert", corrupting)
    with pytest.raises(VerificationError, match="differ from the source"):
        export(checkpoint, tmp_path / "bad", "f16", verify=True)
    assert not (tmp_path / "bad").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["good"]


def test_summary_fits_one_screen(checkpoint: Path, tmp_path: Path, capsys) -> None:
    package = mobius_lite.build(checkpoint, dtype="f32")
    out = package.save(tmp_path / "pkg", shard_size="4KB")
    err = capsys.readouterr().err
    summary = package.last_save
    assert summary is not None and summary.render() in err
    lines = summary.render().splitlines()
    assert len(lines) <= 16 and all(len(line) <= 100 for line in lines)
    files = sorted(p.name for p in out.iterdir() if p.name != "manifest.json")
    assert sorted(summary.files) == files
    assert summary.files == {f: (out / f).stat().st_size for f in files}
    # Many 4 KB shards are summarised in one line, not listed.
    shards = sorted(p.name for p in out.glob("model.onnx-*.data"))
    assert len(shards) > 10 and not any(shard in err for shard in shards)
    assert f"model.onnx-*-of-{len(shards):05d}.data: {len(shards)} shards" in err
    assert summary.source_tensors == len(read_manifest(out)["sources"])


def test_in_memory_source_is_hashed_and_verified(tmp_path: Path) -> None:
    """build_from_module: the model's tensors under their saved names are the source; the
    manifest hashes their arrays and save(verify=True) re-reads them."""
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference(dict(layers_block_type=["moe", "mamba"]))
    package = mobius_lite.build_from_module(model, dtype="f16")
    out = package.save(tmp_path / "pkg", quiet=True, verify=True, shard_size="8KB")
    manifest = read_manifest(out)
    # the source names and bytes are those transformers' save_pretrained writes
    model.save_pretrained(tmp_path / "checkpoint")
    state = load_file(tmp_path / "checkpoint" / "model.safetensors")
    assert set(manifest["sources"]) | set(manifest["unused"]) == set(state)
    for name, entry in manifest["sources"].items():
        assert entry["sha256"] == hashlib.sha256(state[name].tobytes()).hexdigest(), name
    assert verify_package(out, package.source).ok


def test_version_1_manifests_are_still_read(checkpoint: Path, tmp_path: Path) -> None:
    """A package written by the first manifest version (one decoder: top-level model_file and
    initializers, no graphs / shared) still verifies: read_manifest presents it as version 2."""
    out = export(checkpoint, tmp_path / "pkg", "f16", verify=False)
    manifest = json.loads((out / "manifest.json").read_text())
    decoder = manifest.pop("graphs")["decoder"]
    manifest.pop("shared")
    for entry in manifest["sources"].values():
        entry.pop("graphs")
    v1 = {**manifest, "format_version": 1, "model_file": decoder["file"]}
    v1["initializers"] = decoder["initializers"]
    (out / "manifest.json").write_text(json.dumps(v1))
    assert read_manifest(out)["graphs"]["decoder"]["file"] == "model.onnx"
    report = verify_package(out, checkpoint)
    assert report.ok, report.mismatches
