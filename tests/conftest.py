"""Fixtures every test module may use: tiny Nemotron-H checkpoints and packages, each built once
per test session for its arguments.

`tiny_checkpoint(layers, seed=0, **overrides)` gives a TinyCheckpoint: the randomised
transformers reference (FP32, eager; nemotron_reference.make_reference) and the directory
save_pretrained wrote. `tiny_package(layers, seed=0, dtype="f32", **build_kwargs)` gives the
directory of the package mobius_lite.build made from that checkpoint. Both are shared: treat
them as read-only (copy a checkpoint or package before editing it, and never modify the
model).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# the layers most tests need: one of each kind (transformers 5.x spellings)
ONE_OF_EACH = ("mamba", "moe", "attention", "mlp")


@dataclass(frozen=True)
class TinyCheckpoint:
    model: Any  # transformers NemotronHForCausalLM, FP32, eval
    path: Path


def _key(*parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


@pytest.fixture(scope="session")
def tiny_checkpoint(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[..., TinyCheckpoint]:
    from reference_fixtures.nemotron_reference import make_reference

    built: dict[str, TinyCheckpoint] = {}

    def make(
        layers: Sequence[str] = ONE_OF_EACH, seed: int = 0, **overrides: Any
    ) -> TinyCheckpoint:
        key = _key(list(layers), seed, overrides)
        if key not in built:
            model = make_reference({"layers_block_type": list(layers), **overrides}, seed)
            path = tmp_path_factory.mktemp("tiny-checkpoint") / "checkpoint"
            model.save_pretrained(path)
            built[key] = TinyCheckpoint(model, path)
        return built[key]

    return make


@pytest.fixture(scope="session")
def tiny_package(
    tiny_checkpoint: Callable[..., TinyCheckpoint], tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., Path]:
    import mobius_lite

    built: dict[str, Path] = {}

    def make(
        layers: Sequence[str] = ONE_OF_EACH, seed: int = 0, dtype: str = "f32", **build: Any
    ) -> Path:
        key = _key(list(layers), seed, dtype, build)
        if key not in built:
            checkpoint = tiny_checkpoint(layers, seed).path
            target = tmp_path_factory.mktemp("tiny-package") / "package"
            built[key] = mobius_lite.build(checkpoint, dtype=dtype, **build).save(
                target, quiet=True
            )
        return built[key]

    return make
