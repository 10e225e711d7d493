"""Hub resolution: offline cache layout, registry pins applied before the first hub request.

No test touches the network: either HF_HUB_OFFLINE=1 with a hand-made cache directory
(models--org--name/snapshots/REV/... plus refs/main), or a recording fake snapshot_download.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import load_file

import mobius_lite
from mobius_lite.errors import ConfigError, RouteError
from mobius_lite.hub_pins import COMMIT_SHA, KNOWN_MODELS, KnownModel, lookup, resolve_revision
from mobius_lite.sources import hub
from reference_fixtures.nemotron_reference import make_reference

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])
PINNED_ID = "nvidia/NVIDIA-Nemotron-Nano-9B-v2"
PIN = lookup(PINNED_ID).revision
MAIN_SHA = "1" * 40  # what refs/main points at in the hand-made cache: NOT the pin


def save_checkpoint(directory: Path, seed: int, **kwargs) -> Path:
    make_reference(LAYERS, seed=seed).save_pretrained(directory, **kwargs)
    return directory


def add_snapshot(cache: Path, repo_id: str, sha: str, checkpoint: Path) -> Path:
    """Copy a checkpoint into the hub cache layout (files, as an offline user would have)."""
    snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / sha
    shutil.copytree(checkpoint, snapshot)
    return snapshot


def set_ref(cache: Path, repo_id: str, ref: str, sha: str) -> None:
    refs = cache / f"models--{repo_id.replace('/', '--')}" / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / ref).write_text(sha)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache where the pinned id has two commits: the pin (seed 1) and main (seed 2)."""
    cache = tmp_path / "hf" / "hub"
    add_snapshot(cache, PINNED_ID, PIN, save_checkpoint(tmp_path / "pin", seed=1))
    add_snapshot(cache, PINNED_ID, MAIN_SHA, save_checkpoint(tmp_path / "main", seed=2))
    set_ref(cache, PINNED_ID, "main", MAIN_SHA)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def embeddings_in_package(package_dir: Path) -> np.ndarray:
    model = onnx.load(str(package_dir / "model.onnx"))  # with its external data
    (init,) = [t for t in model.graph.initializer if t.name == "backbone.embeddings.weight"]
    return numpy_helper.to_array(init)


# --------------------------------------------------------------------------- registry
def test_registry_entries_are_full_commit_shas():
    assert KNOWN_MODELS, "the registry must not be empty"
    for entry in KNOWN_MODELS:
        assert COMMIT_SHA.fullmatch(entry.revision), entry
        assert entry.revision in entry.confirmed_at, entry
        assert entry.family in ("nemotron_h", "nemotron_h_puzzle", "nemotron_h_omni")


@pytest.mark.parametrize(
    "revision", ["main", "v1.0", "6533e8de", "6533E8DE2C68E4536BF7C411D7A3CE5734111476"]
)
def test_registry_refuses_anything_but_a_full_sha(revision: str):
    with pytest.raises(ValueError, match="40-hex commit SHA"):
        KnownModel("nvidia/x", revision, "nemotron_h", "https://example")


def test_resolve_revision_order():
    assert resolve_revision(PINNED_ID, None) == PIN
    assert resolve_revision(PINNED_ID.upper(), None) == PIN  # hub ids are case-insensitive
    assert resolve_revision(PINNED_ID, "main") == "main"  # an explicit revision wins
    assert resolve_revision("someorg/unknown", None) is None  # unknown ids: hub default


# --------------------------------------------------------------------------- offline cache
def test_offline_cache_uses_the_pin_not_main(offline_cache: Path, tmp_path: Path):
    package = mobius_lite.build(PINNED_ID)
    assert package.metadata["source"] == {"model": PINNED_ID, "revision": PIN}
    snapshot = offline_cache / "models--nvidia--NVIDIA-Nemotron-Nano-9B-v2" / "snapshots" / PIN
    assert package.source_dir == snapshot
    out = package.save(tmp_path / "pkg")
    pinned = load_file(str(snapshot / "model.safetensors"))["backbone.embeddings.weight"]
    main = load_file(str(tmp_path / "main" / "model.safetensors"))["backbone.embeddings.weight"]
    assert not np.array_equal(pinned, main)  # the two commits really differ
    np.testing.assert_array_equal(embeddings_in_package(out), pinned)


def test_offline_cache_explicit_branch_resolves_refs(offline_cache: Path):
    package = mobius_lite.build(PINNED_ID, revision="main")
    assert package.metadata["source"] == {"model": PINNED_ID, "revision": MAIN_SHA}


def test_offline_cache_unknown_id_resolves_main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "hub"
    sha = "ab" * 20
    add_snapshot(cache, "someorg/tiny-nemotron", sha, save_checkpoint(tmp_path / "ck", seed=3))
    set_ref(cache, "someorg/tiny-nemotron", "main", sha)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub is the cache
    package = mobius_lite.build("someorg/tiny-nemotron")
    assert package.metadata["source"] == {"model": "someorg/tiny-nemotron", "revision": sha}


def test_offline_cache_miss_is_one_clear_error(offline_cache: Path):
    with pytest.raises(hub.HubError) as err:
        mobius_lite.build("nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16")
    message = str(err.value)
    pin = lookup("nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16").revision
    assert f"@{pin}" in message  # the pin was what it looked for
    assert "not in the local Hugging Face cache" in message and "HF_HUB_OFFLINE" in message
    assert str(offline_cache) in message


def test_snapshot_directory_passed_as_path_records_its_commit(offline_cache: Path):
    snapshot = offline_cache / "models--nvidia--NVIDIA-Nemotron-Nano-9B-v2" / "snapshots" / PIN
    package = mobius_lite.build(snapshot)
    assert package.metadata["source"] == {"model": str(snapshot), "revision": PIN}


def test_cli_subprocess_offline_build(offline_cache: Path, tmp_path: Path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(offline_cache)}
    out = tmp_path / "pkg"
    cmd = [sys.executable, "-m", "mobius_lite.cli.main", "build", "--model", PINNED_ID]
    result = subprocess.run(
        cmd + ["--output", str(out), "--quiet"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""  # --quiet
    result = subprocess.run(
        cmd + ["--output", str(out), "--overwrite"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert f"revision: {PIN}" in result.stdout
    genai = json.loads((out / "genai_config.json").read_text())
    assert genai["model"]["decoder"]["session_options"]["provider_options"] == []


def _clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a new user: no HF_* variables at all, HOME a fresh directory (so the
    default cache ~/.cache/huggingface is empty)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, "HOME": str(home), **extra}


@pytest.mark.parametrize(
    "command",
    [
        ["build", "--model", PINNED_ID, "--output", "{out}"],
        ["verify", "{out}", "--source", PINNED_ID],
    ],
    ids=["build", "verify"],
)
@pytest.mark.parametrize("offline", [True, False], ids=["offline", "online-env-unset"])
def test_hub_ids_with_no_hf_variables(tmp_path: Path, command: list[str], offline: bool):
    """Regression: with neither HF_HOME nor HF_HUB_CACHE set, resolving a hub id crashed with
    `AttributeError: No huggingface_hub attribute constants` (huggingface-hub 2.x). Now the
    default cache is used: offline, an id not in it is one clear error (exit 2).

    The "online" variant still sets HF_HUB_OFFLINE=1 (tests never touch the network) but
    through TRANSFORMERS_OFFLINE, so that no HF_* variable is set at all."""
    home = tmp_path / "home"
    home.mkdir()
    out = tmp_path / "pkg"
    if command[0] == "verify":  # a real package, checked against a hub id that is not cached
        mobius_lite.build(save_checkpoint(tmp_path / "ck", seed=1)).save(out, quiet=True)
    env = _clean_env(
        home, **({"HF_HUB_OFFLINE": "1"} if offline else {"TRANSFORMERS_OFFLINE": "1"})
    )
    args = [a.replace("{out}", str(out)) for a in command]
    result = subprocess.run(
        [sys.executable, "-m", "mobius_lite.cli.main", *args],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "AttributeError" not in result.stderr
    assert "not in the local Hugging Face cache" in result.stderr
    assert str(home / ".cache" / "huggingface" / "hub") in result.stderr


# --------------------------------------------------------------------------- recorded calls
class RecordingHub:
    """A fake snapshot_download: records each call and serves files from one snapshot dir."""

    def __init__(self, snapshot: Path) -> None:
        self.snapshot = snapshot
        self.calls: list[dict] = []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        return str(self.snapshot)


@pytest.fixture
def recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RecordingHub:
    cache = tmp_path / "hub"
    checkpoint = save_checkpoint(tmp_path / "ck", seed=1, max_shard_size="40KB")
    snapshot = add_snapshot(cache, PINNED_ID, PIN, checkpoint)
    fake = RecordingHub(snapshot)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return fake


def test_pin_is_applied_before_the_first_request(recorder: RecordingHub):
    package = mobius_lite.build(PINNED_ID, dtype="f16")
    first, second = recorder.calls
    assert first["repo_id"] == PINNED_ID and first["revision"] == PIN
    assert second["revision"] == PIN  # the shards of the same commit
    shards = sorted(p.name for p in recorder.snapshot.glob("*.safetensors"))
    assert len(shards) > 1
    # first request: small files only; second: exactly the shards the index names
    assert not any(fnmatch.fnmatch(s, pat) for s in shards for pat in first["allow_patterns"])
    assert "config.json" in first["allow_patterns"]
    assert sorted(second["allow_patterns"]) == shards
    assert first["local_files_only"] is False and first["cache_dir"] == os.environ["HF_HUB_CACHE"]
    assert package.metadata["source"]["revision"] == PIN


def test_explicit_revision_overrides_the_pin(recorder: RecordingHub):
    mobius_lite.build(PINNED_ID, revision="main")
    assert recorder.calls[0]["revision"] == "main"
    assert recorder.calls[1]["revision"] == PIN  # snapshot folder name = resolved commit


def test_bad_config_stops_before_any_weight_request(recorder: RecordingHub):
    config = recorder.snapshot / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "llama"}))
    with pytest.raises(ConfigError, match="model_type 'llama' is not supported"):
        mobius_lite.build(PINNED_ID)
    assert len(recorder.calls) == 1  # config only; no shard was requested


def test_route_error_makes_no_hub_request(recorder: RecordingHub):
    with pytest.raises(RouteError, match="--ep cuda"):
        mobius_lite.build(PINNED_ID, dtype="bf16")
    assert recorder.calls == []


def test_environment_is_read_at_call_time(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert hub.hub_cache_dir() == str(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub.hub_cache_dir() == str(tmp_path / "elsewhere")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_offline() is True
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert hub.hub_offline() is False


# --------------------------------------------------------------------------- checks
def test_verify_and_qualify_default_to_the_recorded_source(offline_cache: Path, tmp_path: Path):
    """A package built from a hub id is checked against the exact commit it came from (from
    its manifest), not against whatever `main` is now; --revision main checks the other."""
    from mobius_lite.cli.main import main as cli
    from mobius_lite.weights.package_source import source_for_package

    out = mobius_lite.build(PINNED_ID).save(tmp_path / "pkg", quiet=True)
    resolved = source_for_package(out)
    assert (resolved.model, resolved.revision) == (PINNED_ID, PIN)
    assert cli(["verify", str(out), "-q"]) == 0
    assert cli(["verify", str(out), "--source", PINNED_ID, "--revision", "main", "-q"]) == 1
    code = cli(["qualify", str(out), "--steps", "1", "--output", str(tmp_path / "q")])
    assert code == 0
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    assert {v: report[v]["status"] for v in ("source_fidelity", "numerical_parity")} == {
        "source_fidelity": "PASS",
        "numerical_parity": "PASS",
    }


def test_a_package_without_a_recorded_source_needs_source(tmp_path: Path, capsys):
    from mobius_lite.cli.main import main as cli

    model = make_reference(LAYERS, seed=3)
    out = mobius_lite.build_from_module(model).save(tmp_path / "pkg", quiet=True)
    assert cli(["verify", str(out)]) == 2
    assert "records no source checkpoint" in capsys.readouterr().err
