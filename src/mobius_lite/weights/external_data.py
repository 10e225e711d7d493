"""The one walker over a model's tensors and their external-data references.

verify, inspect and qualify all derive a package's data files from the model's own references
(main graph, every subgraph, Constant attributes, functions), never from a file-name glob.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir


@dataclass(frozen=True)
class ExternalRef:
    """One tensor's external-data reference as written in the model proto."""

    name: str
    location: str
    offset: int
    length: int | None
    data_type: int
    dims: tuple[int, ...]

    @property
    def expected_length(self) -> int:
        return int(np.prod(self.dims, dtype=np.int64)) * ir.DataType(self.data_type).itemsize


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    yield from _node_tensors(graph.node)


def _node_tensors(nodes) -> Iterator[onnx.TensorProto]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _graph_tensors(attr.g)
            for sub in attr.graphs:
                yield from _graph_tensors(sub)


def model_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor proto of a model: initializers of the main graph and every subgraph,
    sparse initializers, Constant / attribute tensors, and tensors inside functions."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def external_references(model_path: Path | str) -> list[ExternalRef]:
    """Every external tensor reference in the model file, found by walking the model itself
    (never by globbing file names)."""
    model = onnx.load(str(model_path), load_external_data=False)
    return [ref for t in model_tensors(model) if (ref := external_ref(t)) is not None]


def external_ref(tensor: onnx.TensorProto) -> ExternalRef | None:
    """The tensor's external-data reference, or None for a tensor stored inline."""
    if tensor.data_location != onnx.TensorProto.EXTERNAL:
        return None
    info = {e.key: e.value for e in tensor.external_data}
    return ExternalRef(
        name=tensor.name,
        location=info.get("location", ""),
        offset=int(info.get("offset", 0)),
        length=int(info["length"]) if "length" in info else None,
        data_type=tensor.data_type,
        dims=tuple(tensor.dims),
    )
