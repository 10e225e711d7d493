"""The typed re-layout plan (formats/parts.py): formats create part parameters that carry
their part, binding converts through the storage, and verify's catalog (part_catalog.py)
finds the same part from the name it was written under."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.formats.ggml.relayout.exact_parts import ExactRelayoutPart
from mobius_lite.formats.ggml.relayout.qmoe_experts import QMoEExperts
from mobius_lite.formats.ggml.storage import GGMLStorage, RelayoutPart
from mobius_lite.formats.ggml.types import GGML_TYPES
from mobius_lite.formats.ggml.weight import GGMLWeight
from mobius_lite.formats.part_catalog import part_of_parameter, written_parts
from mobius_lite.formats.parts import CodeLayout, Operand, PartParameter

F32 = ir.DataType.FLOAT


def test_catalog_suffixes_name_one_part_each() -> None:
    parts = written_parts()
    assert len({part.suffix for part in parts.values()}) == len(parts)
    for suffix, part in parts.items():
        assert part_of_parameter(f"backbone.layers.1.mixer.experts.up_proj{suffix}") == part
    assert part_of_parameter("backbone.layers.1.mixer.in_proj.weight") is None


def test_formats_create_part_parameters_binding_can_convert() -> None:
    q4_k, q8_0 = GGML_TYPES["Q4_K"], GGML_TYPES["Q8_0"]
    shape = (8, 256, 512)
    exact = GGMLWeight.choose(q4_k, F32, "ort", shape)
    up = QMoEExperts(q4_k, F32, shape, "fc1", exact, int8=True)
    down = QMoEExperts(q4_k, F32, (8, 512, 256), "fc2", exact, int8=True)
    paired = up.paired_with(down)
    assert not isinstance(paired, str), paired
    stored = (8, 256, q4_k.row_bytes(512))
    for suffix, parameter in paired[0].parameters(shape).items():
        assert isinstance(parameter, PartParameter) and parameter.part_of.suffix == suffix
        assert part_of_parameter("w" + suffix) == parameter.part_of  # verify finds it back
        conversion = GGMLStorage(q4_k).part_conversion(parameter.part_of, stored, np.float32)
        assert tuple(conversion.converted_shape(stored)) == tuple(parameter.shape)
    linear = GGMLWeight.choose(q8_0, F32, Backend.ORT, (64, 64))
    for parameter in linear.parameters((64, 64)).values():
        assert isinstance(parameter, PartParameter)
        conversion = GGMLStorage(q8_0).part_conversion(parameter.part_of, (64, 68), np.float32)
        assert isinstance(conversion, RelayoutPart)
    exact_linear = linear.on_exact_layout(4)
    assert not isinstance(exact_linear, str)
    parts = {p.part_of for p in exact_linear.parameters((64, 64)).values()}
    assert parts == {
        CodeLayout(Operand.MATMUL).part("b"),
        CodeLayout(Operand.MATMUL).part("scales"),
    }
    conversion = GGMLStorage(q8_0).part_conversion(next(iter(parts)), (64, 68), np.float32)
    assert isinstance(conversion, ExactRelayoutPart)
