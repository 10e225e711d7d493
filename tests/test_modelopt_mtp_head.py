"""A ModelOpt NVFP4 checkpoint with a multi-token-prediction head (docs/modelopt.md): the head's
linears stored as NVFP4 (quantized like the decoder's), or left dense and excluded by the
config (`mtp*`). Either way the package carries mtp.onnx, the head's packed bytes survive
unchanged, verify passes, and the head computes what the independent head reference
(reference_fixtures/mtp_reference.py) computes on the weights decoded with ml_dtypes, under the
FP32 gates.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import GraphRole
from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE
from mobius_lite.weights.verify import verify_package
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.mtp_fixtures import (
    drive_head_parity,
    global_head_shape,
    head_reference,
    head_tensors,
)
from reference_fixtures.nemotron_reference import make_reference

pytestmark = pytest.mark.slow

HEAD = {**mf.OVERRIDES, "num_nextn_predict_layers": 1}
# the head's linears that ModelOpt quantizes with the decoder's (the router stays dense)
PACKED = ("eh_proj.weight", "_proj.weight")


def _write(directory: Path, packed: bool) -> dict[str, np.ndarray]:
    """The tiny NVFP4 checkpoint with a random head added; returns the head as written."""
    shape = global_head_shape(make_reference(HEAD).config)
    head = head_tensors(shape, np.random.default_rng(3))
    written: dict[str, np.ndarray] = {}

    def add_head(tensors: dict[str, Any], config: dict[str, Any], hf: Any) -> None:
        config["num_nextn_predict_layers"] = 1
        for name, weight in head.items():
            module = name.removesuffix(".weight")
            if packed and name.endswith(PACKED) and weight.ndim == 2:
                for suffix, value in mf.quantize_nvfp4(weight).items():
                    tensors[f"{module}.{suffix}"] = written[f"{module}.{suffix}"] = value
            else:
                tensors[name] = written[name] = weight
        if not packed:
            for section in (config["quantization_config"], (hf or {}).get("quantization")):
                if section is not None:
                    key = "ignore" if "ignore" in section else "exclude_modules"
                    section[key] = [*section.get(key, []), "mtp*"]

    mf.write_checkpoint("nvfp4", directory, edit=add_head, overrides=HEAD)
    return written


def head_tensors_of(written: dict[str, np.ndarray]) -> set[str]:
    """The head's weights (a packed linear's codes and scales count once)."""
    return {n for n in written if not n.endswith(mf.SCALE_SUFFIXES)}


@pytest.mark.parametrize("packed", [True, False], ids=["nvfp4-head", "excluded-head"])
def test_head_of_a_modelopt_checkpoint(tmp_path: Path, packed: bool) -> None:
    checkpoint = tmp_path / "checkpoint"
    written = _write(checkpoint, packed)
    package = mobius_lite.build(checkpoint)
    out = package.save(tmp_path / "package", quiet=True)
    assert [g.role for g in package.graphs] == [GraphRole.DECODER, GraphRole.MTP]

    head_graph = package.graph(GraphRole.MTP).model.graph.initializers
    eh_proj = "mtp.layers.0.eh_proj.weight"
    if packed:  # the NVFP4 codes as stored, not a widened copy
        codes = head_graph[eh_proj].const_value.numpy()
        assert codes.tobytes() == written[eh_proj].tobytes()
    else:
        assert head_graph[eh_proj].const_value.numpy().dtype == np.float32
    assert verify_package(out, checkpoint).ok

    decoder = mf.dense_reference(checkpoint, tmp_path / "reference")
    dense = mf.read_tensors(tmp_path / "reference")  # the weights it wrote, decoded
    head = {k: v for k, v in dense.items() if k.startswith("mtp.")}
    assert len(head) == len(head_tensors_of(written))
    config = NemotronHConfig.from_file(checkpoint)
    with torch.no_grad():
        comparisons = drive_head_parity(decoder, head_reference(decoder, head), out, config)
    assert comparisons
    failing = [c.name for c in comparisons if not c.passes(FP32_NRMSE, FP32_COSINE)]
    assert failing == []
