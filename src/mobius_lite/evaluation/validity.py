"""graph_validity and source_fidelity: the two verdicts that do not compare numbers.

graph_validity: the ONNX checker (full check, with shape inference), onnxruntime session
creation, and which execution providers actually ran the nodes (from onnxruntime's profile of
the first call). source_fidelity: the weight manifest verify (weights/verify.py).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import onnx

from mobius_lite.enums import Activations
from mobius_lite.evaluation.scoring import FAIL, NOT_RUN, PASS, Verdict
from mobius_lite.layout import MANIFEST_FILE
from mobius_lite.weights.manifest import read_manifest

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


def check_graph(model_path: Path) -> dict[str, Any]:
    """onnx.checker.check_model(full_check=True) on the model file (external data by path)."""
    try:
        onnx.checker.check_model(str(model_path), full_check=True)
    except Exception as exc:  # the checker raises several exception types
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}".strip()[:2000]}
    proto = onnx.load(str(model_path), load_external_data=False)
    return {
        "ok": True,
        "nodes": len(proto.graph.node),
        "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
        "ir_version": proto.ir_version,
        "int8_activation_kernels": int8_activation_kernels(proto.graph),
    }


# The block-wise kernels whose accuracy_level 4 quantizes their activations to int8.
INT8_CAPABLE_OPS = ("MatMulNBits", "QMoE")


def int8_activation_kernels(graph: onnx.GraphProto) -> int:
    """Nodes (subgraphs included) that compute with int8 activations: a package built with
    `--activations int8`, which is not exact by design."""
    count = 0
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                count += int8_activation_kernels(attr.g)
        if node.op_type in INT8_CAPABLE_OPS and any(
            a.name == "accuracy_level" and a.i == Activations.INT8.accuracy_level
            for a in node.attribute
        ):
            count += 1
    return count


def profiled_session_options(prefix: Path) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    return options


def providers_from_profile(profile_file: str | Path) -> dict[str, int]:
    """Nodes per execution provider, counted from an onnxruntime profile (kernel events)."""
    path = Path(profile_file)
    try:
        events = json.loads(path.read_text())
    finally:
        if path.exists():
            os.unlink(path)
    nodes: dict[str, str] = {}
    for event in events:
        if event.get("cat") != "Node":
            continue
        provider = event.get("args", {}).get("provider")
        if provider:
            nodes[event.get("name", "").removesuffix("_kernel_time")] = provider
    return dict(Counter(nodes.values()))


def graph_verdict(
    checker: dict[str, Any],
    session: dict[str, Any],
    requested: tuple[str, ...] = DEFAULT_PROVIDERS,
) -> Verdict:
    evidence = {"checker": checker, "session": session, "providers_requested": list(requested)}
    if not checker.get("ok"):
        return Verdict(FAIL, f"ONNX checker: {checker.get('error', '')[:120]}", evidence)
    if not session.get("ok"):
        return Verdict(FAIL, f"session creation: {session.get('error', '')[:120]}", evidence)
    ran = session.get("nodes_by_provider", {})
    if not ran:
        return Verdict(FAIL, "no node ran in the profiled first call", evidence)
    foreign = sorted(p for p in ran if p not in requested)
    if foreign:
        return Verdict(FAIL, f"nodes ran on providers not requested: {foreign}", evidence)
    counts = ", ".join(f"{n} nodes on {p}" for p, n in sorted(ran.items()))
    return Verdict(PASS, f"checker ok; session ok; {counts}", evidence)


def source_fidelity(package_dir: Path, source: Path | None) -> Verdict:
    """The manifest verify of every exported tensor against the source, when available."""
    if source is None:
        return Verdict(NOT_RUN, "no --source given", {})
    try:
        from mobius_lite.weights.verify import verify_package
    except ImportError as exc:
        return Verdict(
            NOT_RUN,
            "weight verification is not available in this installation",
            {"reason": f"cannot import mobius_lite.weights.verify.verify_package: {exc}"},
        )
    if not (package_dir / MANIFEST_FILE).is_file():
        return Verdict(
            NOT_RUN,
            f"the package has no {MANIFEST_FILE}: nothing records which source bytes it holds",
            {
                "reason": f"{package_dir / MANIFEST_FILE} does not exist; re-export the package "
                "with this version to get one"
            },
        )
    try:
        report = verify_package(package_dir, source)
    except Exception as exc:  # a verify that cannot run is a failed verification
        return Verdict(
            FAIL, f"verify could not complete: {exc}", {"error": f"{type(exc).__name__}: {exc}"}
        )
    evidence = report.as_dict()
    mismatches = list(report.mismatches)
    if report.ok:
        return Verdict(
            PASS,
            f"{report.checked} source tensors verified (copies byte-exact, casts recomputed)",
            evidence,
        )
    first = mismatches[0] if mismatches else ""
    # mismatches are problems (a name absent from the checkpoint, bytes that differ, ...), not
    # tensors: count the package's source tensors, and say how many were compared
    total = len(read_manifest(package_dir)["sources"])
    return Verdict(
        FAIL,
        f"{len(mismatches)} problems over the package's {total} source tensors, "
        f"{report.checked} of them compared byte by byte (first: {first})",
        evidence,
    )
