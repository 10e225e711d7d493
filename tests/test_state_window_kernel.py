"""The CUDA route of the speculation windows: onnxruntime's own `state_window` attribute on
the com.microsoft LinearAttention / CausalConvWithState (build(..., state_window_kernel=True),
ort backend, cuda). No GPU here: the graph is checked by the ONNX checker and its structure,
and onnxruntime's CPU refusal is pinned; benchmarks/gpu_check.py runs it on CUDA."""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest

import mobius_lite
from mobius_lite.errors import RouteError
from reference_fixtures.mtp_fixtures import write_nemotron_h_mtp_checkpoint

WINDOW = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, _, _ = write_nemotron_h_mtp_checkpoint(tmp_path_factory.mktemp("kernel") / "ck")
    return path


@pytest.fixture(scope="module")
def package(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = mobius_lite.build(
        checkpoint, ep="cuda", weights_backend="ort", state_window_kernel=True
    )
    return built.save(tmp_path_factory.mktemp("kernel_pkg") / "package", quiet=True)


def attribute(node: onnx.NodeProto, name: str) -> int | None:
    return next((a.i for a in node.attribute if a.name == name), None)


def test_graph_passes_the_checker_and_asks_the_kernels_for_windows(package: Path) -> None:
    onnx.checker.check_model(str(package / "model.onnx"), full_check=True)
    graph = onnx.load(str(package / "model.onnx"), load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}
    mamba = [n for n in graph.node if n.op_type in ("LinearAttention", "CausalConvWithState")]
    assert len(mamba) == 4  # two Mamba layers, conv and SSD each
    for node in mamba:
        assert node.domain == "com.microsoft" and attribute(node, "state_window") == WINDOW
        past = node.input[3]  # past_state: the cache given W slots
        assert producers[past].op_type == "Expand"
    outputs = {o.name: o for o in graph.output}
    for layer in (0, 3):
        for role, rank in (("conv_state", 4), ("recurrent_state", 5)):
            window = outputs[f"present_window.{layer}.{role}"]
            assert len(window.type.tensor_type.shape.dim) == rank
            # the window is a Slice of the kernel's present, the present its last slot
            assert producers[window.name].op_type == "Slice"
            present = producers[f"present.{layer}.{role}"]
            assert present.op_type == "Squeeze" or present.op_type == "Identity"
    # the scan route's If nodes (branches "window" / "no_window") are not built
    branches = {a.g.name for n in graph.node if n.op_type == "If" for a in n.attribute}
    assert branches and not branches & {"window", "no_window"}


def test_onnxruntime_cpu_refuses_the_state_window_kernels(package: Path) -> None:
    with pytest.raises(Exception, match="does not support state_window > 0"):
        ort.InferenceSession(str(package / "model.onnx"), providers=["CPUExecutionProvider"])


def test_the_kernel_route_is_refused_off_cuda_or_off_the_ort_backend(checkpoint: Path) -> None:
    with pytest.raises(RouteError, match="CUDA provider only"):
        mobius_lite.build(checkpoint, weights_backend="ort", state_window_kernel=True)
    with pytest.raises(RouteError, match="CUDA provider only"):
        mobius_lite.build(checkpoint, ep="cuda", state_window_kernel=True)
