"""Run a graph-emitting function on concrete inputs in onnxruntime CPU (format tests)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir
import onnxruntime as ort
from onnxscript import GraphBuilder, OpBuilder

OPSET = 27


def run_emitter(
    emit: Callable[..., ir.Value | Sequence[ir.Value]],
    inputs: Sequence[np.ndarray],
    *,
    as_initializers: bool = False,
    opset_imports: dict[str, int] | None = None,
    constant_from: int | None = None,
    initializers: Sequence[np.ndarray] = (),
) -> list[np.ndarray]:
    """emit(op, *values) builds nodes over one value per array; returns its outputs computed.

    The arrays enter as graph inputs, or as initializers (as packed weights do in a package);
    with `constant_from`, the arrays from that index on are initializers and the others inputs
    (kernels that prepack constant weights take their fast path only then). `initializers`
    are further arrays passed after `inputs`, always as initializers.
    """
    if as_initializers:
        constant_from = 0
    values = [
        ir.Value(
            name=f"in{i}",
            type=ir.TensorType(ir.DataType.from_numpy(a.dtype)),
            shape=ir.Shape(list(a.shape)),
        )
        for i, a in enumerate(inputs)
    ]
    first = len(values) if constant_from is None else constant_from
    graph = ir.Graph(
        inputs=values[:first],
        outputs=[],
        nodes=[],
        opset_imports={"": OPSET, **(opset_imports or {})},
        name="emit_test",
    )
    constants = [
        ir.Value(
            name=f"init{i}",
            type=ir.TensorType(ir.DataType.from_numpy(a.dtype)),
            shape=ir.Shape(list(a.shape)),
        )
        for i, a in enumerate(initializers)
    ]
    fixed = list(zip(values, inputs, strict=True))[first:]
    for value, array in fixed + list(zip(constants, initializers, strict=True)):
        value.const_value = ir.tensor(array, name=value.name)
        graph.register_initializer(value)
    builder = GraphBuilder(graph)
    op: OpBuilder = builder.op
    result = emit(op, *values, *constants)
    outputs = [result] if isinstance(result, ir.Value) else list(result)
    for i, out in enumerate(outputs):
        out.name = f"out{i}"
    graph.outputs.extend(outputs)
    model = ir.Model(graph, ir_version=11, producer_name="emit_test")
    proto = ir.serde.serialize_model(model)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {f"in{i}": a for i, a in enumerate(inputs[:first])}
    return session.run(None, feeds)
