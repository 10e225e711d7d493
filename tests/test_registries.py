"""Dispatch as data (docs/architecture.md, "the registries"): a new model type or source kind is
one registry entry, and build, verify and the task checks reach it through that entry alone."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

import mobius_lite
from mobius_lite.build import check_task
from mobius_lite.configs import loader, model_types
from mobius_lite.configs.nemotron_h import NemotronHConfig
from mobius_lite.errors import ConfigError
from mobius_lite.source_kinds import SAFETENSORS_KIND, SOURCE_KINDS, open_checkpoint
from mobius_lite.sources.open import OpenedCheckpoint, open_safetensors
from mobius_lite.weights.verify import verify_package

NEW_TYPE = "nemotron_h_v3"


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(["mamba", "moe", "attention", "mlp"]).path


def test_a_new_decoder_model_type_is_one_entry(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = Path(shutil.copytree(checkpoint, tmp_path / "checkpoint"))
    config = json.loads((checkpoint / "config.json").read_text())
    config["model_type"] = NEW_TYPE
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=f"model_type '{NEW_TYPE}' is not supported"):
        mobius_lite.build(checkpoint)

    entry = dataclasses.replace(loader.NEMOTRON_H, name=NEW_TYPE)
    monkeypatch.setattr(loader, "DECODER_TYPES", (*loader.DECODER_TYPES, entry))
    monkeypatch.setitem(model_types.MODEL_TYPES, NEW_TYPE, entry)
    assert check_task(None, NEW_TYPE) == "text-generation"
    assert isinstance(loader.load_text_config(config), NemotronHConfig)
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package")
    assert json.loads((out / "config.json").read_text())["model_type"] == NEW_TYPE
    assert verify_package(out, checkpoint).ok
    assert package.graphs[0].model.graph.outputs[0].name == "logits"


def test_a_new_source_kind_is_one_entry(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kind claiming names ending in .fake (here: a safetensors directory under another
    name) is opened by its own opener; other names still open as before."""
    link = tmp_path / "weights.fake"
    link.symlink_to(checkpoint, target_is_directory=True)
    opened_by: list[str] = []

    def open_fake(model, revision, gguf_file, config_json) -> OpenedCheckpoint:
        opened_by.append(str(model))
        return dataclasses.replace(open_safetensors(model, revision), kind="fake")

    fake = dataclasses.replace(
        SAFETENSORS_KIND,
        name="fake",
        claims_name=lambda model, gguf_file: str(model).endswith(".fake"),
        open=open_fake,
    )
    monkeypatch.setitem(SOURCE_KINDS, "fake", fake)
    opened = open_checkpoint(link)
    assert (opened.kind, opened_by) == ("fake", [str(link)])
    assert open_checkpoint(checkpoint).kind == "safetensors"
