"""The instrumented twin of a package's decoder: the package's own graph, unchanged, plus extra
outputs for each block's output (hidden_states.{i}) and each MoE router's choice
(routing.{i}.indices / routing.{i}.weights).

Which values to expose is read from build_decoder(config, hidden_state_outputs=True): its
hidden_states.{i} outputs name the block outputs, and the package graph must hold the same
values, produced by nodes of the same name. Where a package's nodes are named otherwise
(packed GGUF / ModelOpt weights decode in extra nodes, so the numbering moves), a tap is found
by its place in its block instead (`scoped_taps`). Only Cast-to-FP32 nodes and graph
outputs are appended; no existing node, value or initializer is touched, and the graph keeps
reading the package's own external data in place (nothing is copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import onnx

from mobius_lite.components.context import BuildContext
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind, Precision
from mobius_lite.graphs.decoder import build_decoder
from mobius_lite.io_contract import LAYER_HIDDEN_PREFIX, PAST_PREFIX
from mobius_lite.models.nemotron_h_names import EMBEDDING_WEIGHT, LM_HEAD_WEIGHT, router_scope

EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
_ONNX_TO_PRECISION = {
    onnx.TensorProto.FLOAT: Precision.F32,
    onnx.TensorProto.FLOAT16: Precision.F16,
    onnx.TensorProto.BFLOAT16: Precision.BF16,
}


@dataclass
class Instrumentation:
    """The instrumented model (serialized, external data left in the package) and its taps."""

    model_bytes: bytes | None
    taps: dict[str, str] = field(default_factory=dict)  # new output -> package value name
    tap_producers: dict[str, str] = field(default_factory=dict)  # new output -> producer node
    missing: list[str] = field(default_factory=list)  # why a wanted tap could not be placed
    # Whether the package's nodes (name, op type, in order) are what this version builds for
    # the config, and the first node where they are not: evidence, not a gate.
    matches_build: bool = True
    first_difference: str | None = None


def package_precision(model: onnx.ModelProto) -> Precision:
    """The package's precision, read from the embedding table's element type."""
    for init in model.graph.initializer:
        if init.name == EMBEDDING_WEIGHT:
            return _ONNX_TO_PRECISION.get(init.data_type, Precision.F32)
    for value in model.graph.input:
        if value.name.startswith(PAST_PREFIX):
            elem = value.type.tensor_type.elem_type
            return _ONNX_TO_PRECISION.get(elem, Precision.F32)
    return Precision.F32


def _wanted_taps(
    config: NemotronHConfig, precision: Precision, logits_from_embeddings: bool
) -> tuple[dict[str, tuple[str, str, int]], list[tuple[str, str]]]:
    """New output name -> (value, producer node, output index) in a freshly built graph, and
    that graph's nodes as (name, op type) without the hidden-state Identity outputs."""
    built, _ = build_decoder(
        config,
        BuildContext.dense(precision),
        hidden_state_outputs=True,
        logits_from_embeddings=logits_from_embeddings,
    )
    wanted: dict[str, tuple[str, str, int]] = {}
    exposing = set()
    for out in built.graph.outputs:
        if out.name.startswith(LAYER_HIDDEN_PREFIX):
            exposing.add(out.producer().name)
            source = out.producer().inputs[0]
            wanted[out.name] = (source.name, source.producer().name, 0)
    nodes = list(built.graph)
    plain_nodes = [(n.name, n.op_type) for n in nodes if n.name not in exposing]
    for layer in config.layers:
        if layer.kind is not LayerKind.MOE:
            continue
        prefix = router_scope(layer.index)
        gate_nodes = [n for n in nodes if n.name.startswith(prefix)]
        topk = [n for n in gate_nodes if n.op_type == "TopK"]
        if not topk or not gate_nodes:
            continue
        chooser = topk[-1]
        wanted[f"routing.{layer.index}.indices"] = (chooser.outputs[1].name, chooser.name, 1)
        last = gate_nodes[-1]
        wanted[f"routing.{layer.index}.weights"] = (last.outputs[0].name, last.name, 0)
    return wanted, plain_nodes


def block_scope(layer: int) -> str:
    """The node-name prefix of decoder block `layer` (its norm, mixer and residual add)."""
    return f"backbone/layers.{layer}/"


def _scope_kind(nodes: list[onnx.NodeProto], layer: int) -> LayerKind:
    """The mixer kind block `layer` of a graph computes, read from the ops in its scope."""
    scope = block_scope(layer)
    ops = {n.op_type for n in nodes if n.name.startswith(scope)}
    if "LinearAttention" in ops:
        return LayerKind.MAMBA
    if "Attention" in ops:
        return LayerKind.ATTENTION
    if any(n.name.startswith(router_scope(layer)) and n.op_type == "TopK" for n in nodes):
        return LayerKind.MOE
    return LayerKind.MLP


def scoped_taps(
    nodes: list[onnx.NodeProto], config: NemotronHConfig
) -> dict[str, tuple[str, str, int]]:
    """The taps found by scope in a graph's own nodes: each block's output is its residual add
    (the last Add directly in the block's scope), each router's choice the last TopK in its
    scope (indices) and its scope's last node (weights). For a package whose nodes differ from
    this version's dense build (packed weight formats add nodes), where name-for-name matching
    cannot work; a block whose ops are not those of its configured kind gets no tap."""
    wanted: dict[str, tuple[str, str, int]] = {}
    for layer in config.layers:
        scope = block_scope(layer.index)
        if _scope_kind(nodes, layer.index) is not layer.kind:
            continue  # not the block the config describes: tapping it would compare the wrong
        direct = [
            n
            for n in nodes
            if n.name.startswith(scope) and "/" not in n.name[len(scope) :] and n.op_type == "Add"
        ]
        if direct:
            wanted[f"{LAYER_HIDDEN_PREFIX}{layer.index}"] = (
                direct[-1].output[0],
                direct[-1].name,
                0,
            )
        if layer.kind is not LayerKind.MOE:
            continue
        gate = [n for n in nodes if n.name.startswith(router_scope(layer.index))]
        topk = [n for n in gate if n.op_type == "TopK"]
        if topk:
            wanted[f"routing.{layer.index}.indices"] = (topk[-1].output[1], topk[-1].name, 1)
            wanted[f"routing.{layer.index}.weights"] = (gate[-1].output[0], gate[-1].name, 0)
    return wanted


def instrument(package_model: Path, config: NemotronHConfig) -> Instrumentation:
    """Add the hidden-state and routing taps to the package graph at `package_model`."""
    model = onnx.load(str(package_model), load_external_data=False)
    precision = package_precision(model)
    producers = {}
    for node in model.graph.node:
        for index, output in enumerate(node.output):
            producers[output] = (node, index)
    result = Instrumentation(model_bytes=None)
    # The package computes logits with the embedding table exactly when it has no lm_head.
    from_embeddings = all(init.name != LM_HEAD_WEIGHT for init in model.graph.initializer)
    wanted, built_nodes = _wanted_taps(config, precision, from_embeddings)
    package_nodes = [(n.name, n.op_type) for n in model.graph.node]
    if package_nodes != built_nodes:
        result.matches_build = False
        at = next(
            (i for i, (a, b) in enumerate(zip(package_nodes, built_nodes, strict=False)) if a != b),
            min(len(package_nodes), len(built_nodes)),
        )
        got = package_nodes[at] if at < len(package_nodes) else "(end of graph)"
        want = built_nodes[at] if at < len(built_nodes) else "(end of graph)"
        result.first_difference = f"node {at}: package has {got}, this version builds {want}"
    scoped = scoped_taps(list(model.graph.node), config)
    for name, (value, node_name, index) in wanted.items():
        found = producers.get(value)
        if (found is None or found[0].name != node_name) and name in scoped:
            value, node_name, index = scoped[name]  # packed formats: other node names
            found = producers.get(value)
        if found is None or found[0].name != node_name or found[1] != index:
            result.missing.append(
                f"{name}: value {value} (from node {node_name}) is not in the package graph"
            )
            continue
        node = found[0]
        to = onnx.TensorProto.INT64 if name.endswith(".indices") else onnx.TensorProto.FLOAT
        model.graph.node.append(
            onnx.helper.make_node("Cast", [value], [name], to=to, name=f"qualify/tap/{name}")
        )
        model.graph.output.append(onnx.helper.make_tensor_value_info(name, to, None))
        result.taps[name] = value
        result.tap_producers[name] = node.name
    result.model_bytes = model.SerializeToString()
    return result


def external_data_session_options(package_dir: Path, base: object | None = None) -> object:
    """Session options that resolve external data next to the package's model file."""
    import onnxruntime as ort

    options = base if base is not None else ort.SessionOptions()
    options.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(package_dir.resolve()))
    return options


def execution_order(package_model: Path, taps: dict[str, str] | None = None) -> dict[str, int]:
    """Position of the node producing each graph output (and each tapped value) in the package
    graph's node list, which ONNX requires to be a topological order."""
    model = onnx.load(str(package_model), load_external_data=False)
    position = {}
    for i, node in enumerate(model.graph.node):
        for output in node.output:
            position[output] = i
    order = {o.name: position.get(o.name, -1) for o in model.graph.output}
    for name, value in (taps or {}).items():
        order[name] = position.get(value, -1)
    return order
