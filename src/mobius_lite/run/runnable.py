"""Whether a package can run on an execution provider, decided before any session is created
(which reads every weight): its recorded dtype has kernels there, and every operator of
onnxruntime's own domains its graphs use has a kernel there. Requires the `runtime` extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mobius_lite.run.ort_session import PROVIDERS, ort_module
from mobius_lite.run.package_reader import PackageFiles


def provider_kernels(providers: Sequence[str]) -> set[tuple[str, str]] | None:
    """(domain, op type) of every kernel this onnxruntime registers for `providers` (domain
    "" is the ONNX standard one); None when this onnxruntime does not list them all (a
    provider loaded from a shared library may list none until a session loads it)."""
    ort_module()
    try:
        state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
        kernels = state.get_all_opkernel_def()
    except (ImportError, AttributeError, RuntimeError):
        return None
    if not set(providers) <= {k.provider for k in kernels}:
        return None
    return {(k.domain, k.op_name) for k in kernels if k.provider in providers}


def check_runnable(files: PackageFiles, ep: str) -> None:
    """RouteError, before any session is created (which reads every weight), when the
    package cannot run on `ep`: its recorded dtype has no kernels on that provider (bf16 on
    the CPU), or a graph uses an operator of onnxruntime's own domains that has no kernel
    there (the CUDA-only NVFP4 / FP8 kernels of a ModelOpt --weights-backend ort package on
    the CPU)."""
    from mobius_lite.enums import Precision
    from mobius_lite.errors import RouteError
    from mobius_lite.routes import PROVIDER_PRECISIONS, parse_provider

    provider = parse_provider(ep)
    built = _built_for(files.directory)
    dtype = files.manifest.get("dtype")
    precision = Precision.parse(dtype) if dtype else None
    if precision is not None and precision not in PROVIDER_PRECISIONS[provider]:
        others = [p for p, runs in PROVIDER_PRECISIONS.items() if precision in runs]
        stay = " or ".join(p.value for p in PROVIDER_PRECISIONS[provider])
        raise RouteError(
            f"{files.directory} holds {precision.value} weights (manifest dtype "
            f"{precision.value}{built}), and onnxruntime's {provider} provider has no "
            f"{precision.value} kernels for MatMul, Gemm or Add; run it with "
            f"{' or '.join(f'--ep {o}' for o in others)}, or rebuild it with --dtype {stay}"
        )
    kernels = provider_kernels(PROVIDERS[provider])
    if kernels is None:
        return
    for role, path in files.graphs.items():
        # Standard ONNX ops are left out: onnxruntime expands those without a kernel
        # (LinearAttention, CausalConvWithState) into their function bodies.
        missing = sorted(op for op in graph_operators(path) if op[0] and op not in kernels)
        if missing:
            shown = ", ".join(f"{d}.{o}" if d else o for d, o in missing[:4])
            raise RouteError(
                f"{files.directory}'s {role} graph ({path.name}{built}) uses {shown}, which "
                f"this onnxruntime has no {provider} kernel for; run it with the execution "
                "provider it was built for (--ep cuda needs onnxruntime-gpu), or rebuild it "
                f"for {provider} (a ModelOpt checkpoint: --weights-backend standard)"
            )


def _built_for(directory: Path) -> str:
    """'; built for cuda' when genai_config.json records the CUDA provider, else ''."""
    import json

    from mobius_lite.layout import GENAI_CONFIG_FILE

    try:
        genai = json.loads((directory / GENAI_CONFIG_FILE).read_text())
        options = genai["model"]["decoder"]["session_options"]["provider_options"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    names = [name for entry in options if isinstance(entry, dict) for name in entry]
    return f"; built for {names[0]}" if names else ""


def graph_operators(path: Path) -> set[tuple[str, str]]:
    """(domain, op type) of every node of a graph file, subgraphs and the bodies of the
    model's local functions included (read without its external data)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    functions = {(f.domain, f.name): f for f in proto.functions}
    found: set[tuple[str, str]] = set()

    def visit(nodes: Any) -> None:
        for node in nodes:
            key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
            if key in functions:
                visit(functions.pop(key).node)
                continue
            found.add(key)
            for attr in node.attribute:
                for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    visit(graph.node)

    visit(proto.graph.node)
    return found
