"""Binding checkpoint tensors to parameters by name: layouts, prefixes, and errors that list
the offending names before any tensor data is read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.errors import CheckpointError
from mobius_lite.source_kinds import layout_of
from mobius_lite.sources import SafetensorsCheckpoint
from mobius_lite.tasks import text_generation_graphs
from mobius_lite.tasks.options import ExportOptions
from reference_fixtures.nemotron_reference import make_reference

PATTERN = ["linear_attention", "moe", "full_attention", "mlp"]


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(PATTERN).path


def rewrite(checkpoint: Path, target: Path, edit) -> Path:
    """Copy a checkpoint with its tensors edited by `edit(dict) -> dict`."""
    target.mkdir()
    (target / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file(edit(load_file(checkpoint / "model.safetensors")), target / "model.safetensors")
    return target


class NoReadSource(SafetensorsCheckpoint):
    """A checkpoint that fails the test if any tensor data is read."""

    def read(self, name: str) -> np.ndarray:
        raise AssertionError(f"tensor data read for {name} before validation finished")


def test_every_initializer_holds_the_source_bytes(checkpoint: Path, tmp_path: Path) -> None:
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "pkg")
    model = onnx.load(str(out / "model.onnx"))  # loads external data
    written = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    source = load_file(checkpoint / "model.safetensors")  # independent reader
    bound = set()
    for binding in package.plan.bindings:
        expected = (
            np.stack([source[s] for s in binding.sources])
            if binding.stacked
            else source[binding.sources[0]]
        )
        np.testing.assert_array_equal(written[binding.target], expected.astype(np.float32))
        bound.update(binding.sources)
    assert bound == set(source), "every source tensor is bound exactly once"
    stacked = [b for b in package.plan.bindings if b.transform == "stack"]
    assert {b.target for b in stacked} == {
        "backbone.layers.1.mixer.experts.up_proj",
        "backbone.layers.1.mixer.experts.down_proj",
    }


def test_stacked_and_model_prefixed_layouts_bind_to_the_same_bytes(
    checkpoint: Path, tmp_path: Path
) -> None:
    """transformers' in-memory layout (model.*, stacked experts) equals the released layout."""
    reference = make_reference(dict(layers_block_type=PATTERN))
    from_module = mobius_lite.build_from_module(reference).save(tmp_path / "a")
    from_disk = mobius_lite.build(checkpoint).save(tmp_path / "b")
    a = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(from_module / "model.onnx")).graph.initializer
    }
    b = {
        t.name: numpy_helper.to_array(t)
        for t in onnx.load(str(from_disk / "model.onnx")).graph.initializer
    }
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_model_prefix_on_disk(checkpoint: Path, tmp_path: Path) -> None:
    renamed = rewrite(
        checkpoint,
        tmp_path / "renamed",
        lambda t: {k.replace("backbone.", "model.", 1): v for k, v in t.items()},
    )
    package = mobius_lite.build(renamed)
    assert all(
        s.startswith(("model.", "lm_head")) for b in package.plan.bindings for s in b.sources
    )


@pytest.mark.parametrize(
    "case, edit, message",
    [
        (
            "missing",
            lambda t: {k: v for k, v in t.items() if "q_proj" not in k},
            "missing tensors: backbone.layers.2.mixer.q_proj.weight",
        ),
        (
            "unused",
            lambda t: {**t, "backbone.layers.9.mixer.extra.weight": np.zeros(3, np.float32)},
            "tensors the config does not use: backbone.layers.9.mixer.extra.weight",
        ),
        (
            "misshaped",
            lambda t: {
                **t,
                "backbone.layers.3.mixer.up_proj.weight": np.zeros((5, 32), np.float32),
            },
            "backbone.layers.3.mixer.up_proj.weight: checkpoint [5, 32], expected [48, 32]",
        ),
        (
            "missing expert",
            lambda t: {k: v for k, v in t.items() if "experts.3.up_proj" not in k},
            "missing tensors: backbone.layers.1.mixer.experts.up_proj",
        ),
    ],
)
def test_mismatches_are_listed_before_any_read(
    checkpoint: Path, tmp_path: Path, case: str, edit, message: str
) -> None:
    broken = rewrite(checkpoint, tmp_path / case, edit)
    with pytest.raises(CheckpointError) as info:
        source = NoReadSource(broken)
        text_generation_graphs(
            NemotronHConfig.from_file(broken), source, layout_of(source), ExportOptions()
        )
    assert message in str(info.value)
