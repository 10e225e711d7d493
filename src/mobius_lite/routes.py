"""Which dtype / execution provider / weight format combinations an export may take.

Checked before any hub request or tensor read, so an unsupported route costs nothing. Each
refusal is one RouteError naming what was asked, what is supported and what to do instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Activations, Backend, DraftHead, Precision
from mobius_lite.errors import RouteError, parse_choice
from mobius_lite.formats.dense import Cast
from mobius_lite.listing import format_names
from mobius_lite.source_kinds import SAFETENSORS_KIND, SourceKind

EXECUTION_PROVIDERS = ("cpu", "cuda")

# Precisions whose graphs each provider runs. onnxruntime 1.32's CPU provider has no bfloat16
# kernels for MatMul, Gemm or Add (NOT_IMPLEMENTED at session creation), so a bf16 graph
# cannot run there.
PROVIDER_PRECISIONS: dict[str, tuple[Precision, ...]] = {
    "cpu": (Precision.F32, Precision.F16),
    "cuda": (Precision.F32, Precision.F16, Precision.BF16),
}

# com.microsoft operators the export emits that a provider has no kernel for: a graph holding
# one cannot create a session there (onnxruntime 1.32's CPU provider: NOT_IMPLEMENTED "Could not
# find an implementation for MatMulBlockQuantizedFp4Weight(1)"; its kernels are CUDA-only).
# Each entry names the route that emits the operator. tests/test_build_inputs.py checks every
# entry against the installed onnxruntime's CPU provider.
PROVIDER_MISSING_KERNELS: dict[str, dict[str, str]] = {
    "cpu": {
        "MatMulBlockQuantizedFp4Weight": "ModelOpt NVFP4 weights on --backend ort",
        "MatMulBlockQuantizedFp8Weight": "ModelOpt FP8 weights on --backend ort",
    },
}

# Source element types that bind to dense parameters by a plain (lossless or rounding) cast.
DENSE_SOURCE_DTYPES = tuple(p.numpy_name for p in Precision)


def parse_provider(ep: str) -> str:
    """Normalise an execution-provider name ("CUDA", "CUDAExecutionProvider" -> "cuda")."""
    key = str(ep).strip().lower().removesuffix("executionprovider")
    if key not in EXECUTION_PROVIDERS:
        raise RouteError(
            f"execution provider {ep!r} is not supported; choose one of "
            f"{', '.join(EXECUTION_PROVIDERS)} (--ep cpu or --ep cuda; ep='cpu' or 'cuda' in "
            "Python)"
        )
    return key


def check_route(dtype: Precision | str, ep: str = "cpu") -> tuple[Precision, str]:
    """Validate the dtype / provider pair; returns them normalised."""
    precision = Precision.parse(dtype)
    provider = parse_provider(ep)
    allowed = PROVIDER_PRECISIONS[provider]
    if precision not in allowed:
        others = [p for p, runs in PROVIDER_PRECISIONS.items() if precision in runs]
        choices = " or ".join(f"--dtype {p.value} (dtype='{p.value}')" for p in allowed)
        raise RouteError(
            f"dtype {precision.value} cannot run on the {provider} execution provider "
            f"(onnxruntime's {provider} provider has no {precision.value} kernels for MatMul, "
            "Gemm or Add); "
            f"{provider} supports {', '.join(p.value for p in allowed)}. "
            f"Use {' or '.join(f'--ep {o} (ep={o!r})' for o in others)} to build for a provider "
            "that runs "
            f"{precision.value}, or {choices} to stay on {provider}."
        )
    return precision, provider


def check_graph_kernels(models: Iterable[ir.Model], provider: str) -> None:
    """Refuse graphs that use an operator the provider has no kernel for (checked on the built
    graphs, before any weight is read): the package could never create a session there."""
    missing = PROVIDER_MISSING_KERNELS.get(provider, {})
    for model in models:
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            route = missing.get(node.op_type) if node.domain == "com.microsoft" else None
            if route is None:
                continue
            others = [
                p
                for p in EXECUTION_PROVIDERS
                if node.op_type not in PROVIDER_MISSING_KERNELS.get(p, {})
            ]
            raise RouteError(
                f"{route} compute with onnxruntime's {node.op_type}, which has no kernel on the "
                f"{provider} execution provider (session creation fails there); build for "
                f"{' or '.join(f'--ep {o} (ep={o!r})' for o in others)}, or with --backend "
                f"standard (weights_backend='standard') to run on {provider}"
            )


def parse_backend(value: Backend | str) -> Backend:
    """--weights-backend standard | ort."""
    return parse_choice(Backend, value, "weights backend")


def check_activations(
    value: Activations | str, backend: Backend, precision: Precision, provider: str
) -> Activations:
    """--activations exact | exact-fused | int8: the fused modes are onnxruntime CPU kernels
    (com.microsoft MatMulNBits / MoE / QMoE) on f32 activations."""
    mode = parse_choice(Activations, value, "activations")
    if mode is Activations.EXACT:
        return mode
    needs, keywords = [], []
    if backend is not Backend.ORT:
        needs.append("--backend ort (the fused kernels are onnxruntime's com.microsoft ops)")
        keywords.append("weights_backend='ort'")
    if precision is not Precision.F32:
        needs.append(f"--dtype f32 (the exact layouts' scales are f32; got {precision.value})")
        keywords.append("dtype='f32'")
    if provider != "cpu":
        needs.append(
            f"--ep cpu (the route is built and tested for the CPU kernels; got {provider})"
        )
        keywords.append("ep='cpu'")
    if needs:
        raise RouteError(
            f"--activations {mode.value} needs "
            + " and ".join(needs)
            + f"; in Python: activations={mode.value!r} needs {', '.join(keywords)}"
        )
    return mode


def check_draft_head(
    value: DraftHead | str, backend: Backend, precision: Precision, provider: str
) -> DraftHead:
    """The MTP head's route, exact or fast: a fast head computes on onnxruntime's CPU
    int8-activation kernels (com.microsoft MatMulNBits / QMoE, f32 activations in and out)."""
    route = parse_choice(DraftHead, value, "draft head")
    if route is DraftHead.EXACT:
        return route
    needs = []
    if backend is not Backend.ORT:
        needs.append("the ort backend (its int8 kernels are onnxruntime's com.microsoft ops)")
    if precision is not Precision.F32:
        needs.append(f"f32 (got {precision.value})")
    if provider != "cpu":
        needs.append(f"the cpu execution provider (got {provider})")
    if needs:
        raise RouteError("a fast draft head needs " + " and ".join(needs))
    return route


def check_weight_format(raw_config: Mapping[str, Any], kind: SourceKind = SAFETENSORS_KIND) -> None:
    """Refuse checkpoints stored in a quantized format this library does not export.

    Casting packed INT4 / GPTQ / AWQ bytes to dense floats would silently drop their scales,
    so a config that declares such quantization is rejected before any weight is fetched or
    read, unless its source kind keeps that quantization packed (ModelOpt).
    """
    quant = raw_config.get("quantization_config")
    if quant is None or kind.keeps_quantization:
        return
    method = quant.get("quant_method", "unknown") if isinstance(quant, Mapping) else quant
    algo = quant.get("quant_algo") if isinstance(quant, Mapping) else None
    found = f"quant_method={method!r}" + (f", quant_algo={algo!r}" if algo else "")
    raise RouteError(
        f"config.json declares a quantized weight format ({found}); supported: dense "
        f"{', '.join(DENSE_SOURCE_DTYPES)} safetensors, ModelOpt (NVFP4, FP8, MIXED_PRECISION) "
        "and GGUF files. Export the BF16 or a ModelOpt release of this model instead (e.g. the "
        "repository whose name ends in -BF16 or -NVFP4)."
    )


def check_source_dtypes(bindings: Iterable[Any]) -> None:
    """Refuse bindings that would cast a non-float source to a float parameter (e.g. FP8 or
    int8 bytes read as plain numbers): packed sources must be bound through their format."""
    bad = [
        f"{b.sources[0]} ({np.dtype(b.source_dtype).name})"
        for b in bindings
        if isinstance(b.conversion, Cast)
        and np.dtype(b.source_dtype).name not in DENSE_SOURCE_DTYPES
    ]
    if bad:
        shown = format_names(bad, 10)
        raise RouteError(
            f"checkpoint tensors stored in a packed or integer format: {shown}; supported source "
            f"dtypes: {', '.join(DENSE_SOURCE_DTYPES)}. Export the BF16 release of this model "
            "instead."
        )
