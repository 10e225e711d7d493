"""Edited copies of a package's decoder for attributing decode time: every layer of some kinds
knocked out (its residual passes through, its caches unchanged, the nodes only it used dropped),
each kind's weight bytes read per decode step, and a package copy around an edited graph.

The knocked-out graphs compute wrong numbers on purpose; only their time is read
(benchmarks/investigations/decode_attribution.py, f32_expert_paths.py, decode_breakdown.py).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.enums import LayerKind
from mobius_lite.layout import DECODER_FILE

RESIDUAL_ADD = re.compile(r"^backbone/layers\.(\d+)/Add(_node_\d+)?$")
LAYER_SCOPE = re.compile(r"(?:^|/)layers\.(\d+)/")
PRESENT = re.compile(r"^present\.(\d+)\.(.+)$")
TOP = "top"
# ops that read one table row per token (the packed and block-quantized tables' too)
EMBEDDING_LOOKUPS = ("Gather", "GatherPacked", "GatherBlockQuantized")


def values_read(node: Any) -> set[str]:
    """Every value a node reads, including what its If / Loop / Scan bodies take from outside."""
    import onnx

    names = set(node.input)
    for attribute in node.attribute:
        if attribute.type == onnx.AttributeProto.GRAPH:
            for inner in attribute.g.node:
                names |= values_read(inner)
    return names


def needed_nodes(nodes: Any, outputs: set[str], inputs: set[str] = frozenset()) -> tuple[list, set]:
    """The nodes, in graph order, that the values `outputs` depend on, not looking past the
    values `inputs`; and every value those nodes read."""
    needed, kept = set(outputs), []
    for node in reversed(list(nodes)):
        if any(name in needed and name not in inputs for name in node.output):
            kept.append(node)
            needed |= values_read(node)
    return kept[::-1], needed


def knock_out(model: Any, layers: set[int]) -> Any:
    """A copy of the decoder in which each layer of `layers` passes its residual through and
    its caches unchanged; nodes no graph output needs any more are removed."""
    import onnx
    from onnx import helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    replaced = set()
    for node in graph.node:
        match = RESIDUAL_ADD.match(node.name)
        if node.op_type == "Add" and match and int(match.group(1)) in layers:
            node.op_type, node.name = "Identity", node.name + "_knocked_out"
            del node.input[1:]
            replaced.add(int(match.group(1)))
    if replaced != layers:
        raise SystemExit(f"no residual Add found for layers {sorted(layers - replaced)}")
    presents = {
        o.name for o in graph.output if (m := PRESENT.match(o.name)) and int(m.group(1)) in layers
    }
    for node in graph.node:
        for i, name in enumerate(node.output):
            if name in presents:
                node.output[i] = name + "_knocked_out"
    for name in sorted(presents):
        past = "past_key_values." + name.removeprefix("present.")
        graph.node.append(helper.make_node("Identity", [past], [name], name=name + "_pass"))
    kept, needed = needed_nodes(graph.node, {o.name for o in graph.output})
    del graph.node[:]
    graph.node.extend(kept)
    used = [t for t in graph.initializer if t.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(used)
    return out


def step_weight_bytes(model: Any, kinds: list[LayerKind], experts: int, k: int) -> dict[str, int]:
    """Weight bytes each layer kind (and "top") reads in one decode step: every initializer
    but shape / index constants; a stacked routed-experts tensor (leading axis E, read inside
    the experts' scope) counts k / E."""
    import onnx
    from onnx import helper

    sizes: dict[str, tuple[int, bool]] = {}
    index_types = {onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL}
    for t in model.graph.initializer:
        if t.data_type in index_types:
            continue  # shape and index constants, not weights
        count = int(np.prod(t.dims)) if t.dims else 1
        itemsize = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        stacked = len(t.dims) >= 3 and t.dims[0] == experts
        sizes[t.name] = (count * itemsize, stacked)
    totals: dict[str, float] = {}
    seen: set[tuple[str, str]] = set()

    def walk(graph: Any, scope: str | None) -> None:
        for node in graph.node:
            match = LAYER_SCOPE.search(node.name)
            owner = scope or (kinds[int(match.group(1))].value if match else TOP)
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    walk(attribute.g, owner)
            if node.op_type in EMBEDDING_LOOKUPS and "embeddings" in node.name:
                continue  # one row per token
            for name in node.input:
                if name not in sizes or (owner, name) in seen:
                    continue
                seen.add((owner, name))
                size, stacked = sizes[name]
                routed = stacked and "experts" in node.name and "shared" not in node.name
                totals[owner] = totals.get(owner, 0.0) + (size * k / experts if routed else size)

    walk(model.graph, None)
    return {key: int(value) for key, value in totals.items()}


def package_with_graph(package: Path, out: Path, model: Any) -> Path:
    """A copy of `package` in `out` whose decoder is `model` (an edited graph, timing only):
    model.onnx written there beside hard links of the package's other files."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / DECODER_FILE))
    for f in package.iterdir():
        if f.name != DECODER_FILE and not (out / f.name).exists():
            os.link(f, out / f.name)
    return out
