"""A fast draft head's dense projections on int8 blocks (`--draft-head fast` on dense weights).

The package keeps the source's bytes: the build only lists, in the head graph's metadata
(DRAFT_INT8_WEIGHTS), the dense projections llama.cpp would quantize
(models/nemotron_h_quant.kept_reason) whose rows hold whole 32-element blocks. When the head's
session is created (run/mtp_head.open_head) each listed `Gemm(x, W, transB=1)` becomes
`MatMulNBits(x, codes, scales)` at accuracy_level 4 (int8 activations) over W quantized in
memory by onnxruntime-genai's int8 convention: symmetric blocks of 32, zero point 128
(formats/quantize/nbits.py). A draft only decides how many tokens a round accepts, never
which, so a cheaper head changes the speed, not the output.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Activations
from mobius_lite.formats.contrib import CONTRIB_DOMAIN, CONTRIB_OPSET
from mobius_lite.formats.quantize.nbits import quantize_blocks
from mobius_lite.models.nemotron_h_quant import kept_reason

DRAFT_INT8_WEIGHTS = "mobius_lite.draft_int8_weights"  # metadata: JSON list of weight names
BLOCK = 32
BITS = 8
INT8_MATMUL = "MatMulNBits"  # its accuracy_level 4 quantizes the activations to int8


def _dense_gemms(graph: ir.Graph) -> Iterator[tuple[ir.Node, ir.Value]]:
    """Gemm(x, W, transB=1) nodes of the graph's top level without bias, alpha or beta, whose
    W [N, K] is a float32 initializer with K in whole blocks."""
    for node in graph:
        if node.op_type != "Gemm" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            continue
        attrs = {name: attr.value for name, attr in node.attributes.items()}
        if attrs.get("transB") != 1 or attrs.get("transA", 0) or {"alpha", "beta"} & set(attrs):
            continue
        weight = node.inputs[1]
        if weight is None or not weight.is_initializer() or weight.shape is None:
            continue
        if (
            weight.dtype == ir.DataType.FLOAT
            and len(weight.shape) == 2
            and weight.shape[1] % BLOCK == 0
        ):
            yield node, weight


def draft_int8_weights(graph: ir.Graph) -> list[str]:
    """The head's dense projections a fast draft head computes on int8 blocks (module doc)."""
    return [
        weight.name
        for _, weight in _dense_gemms(graph)
        if weight.name and kept_reason(weight.name, tuple(weight.shape)) is None
    ]


def mark_draft_int8(model: ir.Model, names: list[str]) -> None:
    """Record the projections the head's session re-lays (the package's bytes unchanged)."""
    model.metadata_props[DRAFT_INT8_WEIGHTS] = json.dumps(names)


def marked_draft_int8(metadata: Mapping[str, str]) -> list[str]:
    """The projections mark_draft_int8 recorded in a model's metadata (none: an exact head)."""
    return json.loads(metadata.get(DRAFT_INT8_WEIGHTS, "[]"))


def relay_draft_int8(model: ir.Model) -> int:
    """Replace each marked projection by MatMulNBits over its weight quantized in memory
    (module doc); the dense initializers leave the graph. Returns how many moved."""
    names = set(marked_draft_int8(model.metadata_props))
    graph = model.graph
    moved = 0
    for node, weight in list(_dense_gemms(graph)):
        if weight.name not in names:
            continue
        rows, k = weight.shape
        codes, scales, _ = quantize_blocks(weight.const_value.numpy(), BITS, BLOCK, True)
        b = _initializer(graph, f"{weight.name}_draft_int8_b", codes)
        s = _initializer(graph, f"{weight.name}_draft_int8_scales", scales)
        attributes = {"K": k, "N": rows, "bits": BITS, "block_size": BLOCK}
        attributes["accuracy_level"] = Activations.INT8.accuracy_level
        matmul = ir.node(
            INT8_MATMUL, [node.inputs[0], b, s], attributes=attributes, domain=CONTRIB_DOMAIN
        )
        graph.insert_before(node, matmul)
        output = node.outputs[0]
        output.replace_all_uses_with(matmul.outputs[0], replace_graph_outputs=True)
        name, output.name = output.name, None
        matmul.outputs[0].name = name
        graph.remove(node, safe=True)
        if not weight.uses():
            graph.initializers.pop(weight.name)
        moved += 1
    if moved:
        model.opset_imports.setdefault(CONTRIB_DOMAIN, CONTRIB_OPSET)
    return moved


def _initializer(graph: ir.Graph, name: str, values: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(values, name=name))
    graph.register_initializer(value)
    return value
