"""What every graph builder shares: the opset, the IR version, typed I/O values, and turning a
built graph into a model (names made unique across nested Loop / If scopes)."""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common.naming import NameFixPass

OPSET = 27
IR_VERSION = 11


def graph_value(name: str, dtype: ir.DataType, shape: tuple[int | str, ...] | list) -> ir.Value:
    """A graph input / output value with its element type and (symbolic) shape."""
    return ir.Value(name=name, type=ir.TensorType(dtype), shape=ir.Shape(list(shape)))


def new_graph(name: str, inputs: list[ir.Value]) -> ir.Graph:
    return ir.Graph(inputs=inputs, outputs=[], nodes=[], opset_imports={"": OPSET}, name=name)


def name_output(value: ir.Value, name: str, dtype: ir.DataType, shape: list | tuple) -> ir.Value:
    """Give a graph output its contract name, element type and shape."""
    value.name = name
    value.type = ir.TensorType(dtype)
    value.shape = ir.Shape(list(shape))
    return value


def to_model(graph: ir.Graph) -> ir.Model:
    model = ir.Model(graph, ir_version=IR_VERSION, producer_name="mobius_lite")
    # Subgraph builders number values per graph; make names unique across nested scopes.
    NameFixPass()(model)
    return model
