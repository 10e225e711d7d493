"""Dispatch as data (docs/architecture.md, "the registries"): a new model type or source kind is
one registry entry, and build, verify, qualify and the task checks reach it through that entry
alone."""

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
from mobius_lite.evaluation.dense_reference import ReferenceRequest
from mobius_lite.evaluation.qualify import qualify
from mobius_lite.source_kinds import SAFETENSORS_KIND, SOURCE_KINDS, SourceKind, open_checkpoint
from mobius_lite.sources.open import OpenedCheckpoint, open_safetensors
from mobius_lite.weights.verify import verify_package

NEW_TYPE = "nemotron_h_v3"
FAKE_REFERENCE = "the fake source's tensors, copied by its reference function"
# the requests the fake kind's reference function received (test_qualify_reaches_...)
FAKE_REQUESTS: list[ReferenceRequest] = []


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

    monkeypatch.setitem(SOURCE_KINDS, "fake", _fake_kind(open_fake))
    opened = open_checkpoint(link)
    assert (opened.kind, opened_by) == ("fake", [str(link)])
    assert open_checkpoint(checkpoint).kind == "safetensors"


def fake_reference(request: ReferenceRequest) -> Path:
    """The fake kind's reference checkpoint: a copy of the safetensors directory it hides."""
    FAKE_REQUESTS.append(request)
    return Path(shutil.copytree(request.source, request.workdir / "dense"))


def _fake_kind(open_fake) -> SourceKind:
    """A kind claiming names ending in .fake, opened by `open_fake`, with its own reference."""
    return dataclasses.replace(
        SAFETENSORS_KIND,
        name="fake",
        claims_name=lambda model, gguf_file: str(model).endswith(".fake"),
        open=open_fake,
        reference=f"{__name__}:fake_reference",
        reference_description=FAKE_REFERENCE,
    )


def test_every_source_kind_names_an_evaluation_reference() -> None:
    """A kind names its reference checkpoint function (evaluation sits above source_kinds)."""
    for kind in SOURCE_KINDS.values():
        assert kind.reference.startswith("mobius_lite.evaluation."), kind.reference
        assert callable(kind.reference_checkpoint()), kind.reference
        assert kind.reference_description


def test_qualify_reaches_a_new_source_kind_through_its_entry(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package built from a new kind's source is qualified against the checkpoint that
    kind's reference function makes, described as the entry says."""
    link = tmp_path / "weights.fake"
    link.symlink_to(checkpoint, target_is_directory=True)

    def open_fake(model, revision, gguf_file, config_json) -> OpenedCheckpoint:
        return dataclasses.replace(open_safetensors(model, revision), kind="fake")

    monkeypatch.setitem(SOURCE_KINDS, "fake", _fake_kind(open_fake))
    FAKE_REQUESTS.clear()
    package = mobius_lite.build(link).save(tmp_path / "package", quiet=True)
    report = qualify(package, link, prompt_ids=[5, 17, 33, 8], steps=2, output=tmp_path / "q")
    assert [r.source for r in FAKE_REQUESTS] == [link]
    assert report.run["reference"]["weights"] == FAKE_REFERENCE
    statuses = {name: verdict.status for name, verdict in report.verdicts.items()}
    assert statuses == dict.fromkeys(statuses, "PASS"), report.run["reference"]
