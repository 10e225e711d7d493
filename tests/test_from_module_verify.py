"""build_from_module packages verify against the checkpoint the same model saves.

Before the fix the manifest recorded transformers' in-memory names (`model.*`, stacked
experts, RADIO's separate q/k/v), which no saved checkpoint holds, so `mobius verify --source`
reported every tensor. The checkpoint side here is transformers' own save_pretrained output,
read back with safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
    NemotronH_Omni_Reasoning_V3,
)

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.weights.verify import verify_package
from reference_fixtures.nemotron_reference import make_reference
from reference_fixtures.omni_fixtures import omni_config

PATTERN = ["moe", "mamba", "attention", "mlp"]


def _saved_names(checkpoint: Path) -> set[str]:
    names: set[str] = set()
    for shard in checkpoint.glob("*.safetensors"):
        with safe_open(shard, "np") as handle:
            names.update(handle.keys())
    return names


def test_text_package_from_module_verifies_against_save_pretrained(tmp_path: Path, capsys):
    model = make_reference(dict(layers_block_type=PATTERN), seed=1)
    package = mobius_lite.build_from_module(model).save(tmp_path / "pkg", quiet=True)
    model.save_pretrained(tmp_path / "checkpoint")
    saved = _saved_names(tmp_path / "checkpoint")
    assert any(n.startswith("backbone.") for n in saved)  # the released names, not model.*

    manifest = json.loads((package / "manifest.json").read_text())
    assert set(manifest["sources"]) | set(manifest["unused"]) == saved
    report = verify_package(package, tmp_path / "checkpoint")
    assert report.ok, report.mismatches[:5]
    assert report.checked == len(saved)

    code = main(["verify", str(package), "--source", str(tmp_path / "checkpoint")])
    assert code == 0, capsys.readouterr().err


def test_omni_package_from_module_verifies_against_save_pretrained(tmp_path: Path) -> None:
    config = omni_config(final_layernorm=False, pruning_rate=0.4)
    config.image_token_id, config.video_token_id = 45, 46  # the package needs both
    model = NemotronH_Omni_Reasoning_V3(config).eval()
    package = mobius_lite.build_from_module(model).save(tmp_path / "pkg", quiet=True)
    model.save_pretrained(tmp_path / "checkpoint")
    saved = _saved_names(tmp_path / "checkpoint")
    manifest = json.loads((package / "manifest.json").read_text())
    assert set(manifest["sources"]) | set(manifest["unused"]) == saved
    report = verify_package(package, tmp_path / "checkpoint")
    assert report.ok, report.mismatches[:5]
    assert report.checked == len(manifest["sources"])
