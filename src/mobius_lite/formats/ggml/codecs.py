"""Every ggml block type's codec (numpy reference decode and standard-ONNX graph decode), by
type name."""

from __future__ import annotations

from mobius_lite.errors import RouteError
from mobius_lite.formats.ggml import dense as ggml_dense
from mobius_lite.formats.ggml import (
    iq1,
    iq2,
    iq3,
    iq4,
    kquants,
    legacy,
    mxfp4,
    nvfp4,
    q1_0,
    ternary,
)
from mobius_lite.formats.ggml.types import BlockCodec

CODECS: dict[str, BlockCodec] = {
    codec.type.name: codec
    for module in (ggml_dense, legacy, kquants, iq1, iq2, iq3, iq4, ternary, mxfp4, nvfp4, q1_0)
    for codec in module.CODECS
}


def codec_of(type_name: str) -> BlockCodec:
    """The codec of a ggml type; RouteError naming the type when there is none."""
    try:
        return CODECS[type_name]
    except KeyError:
        raise RouteError(
            f"no decoder for ggml type {type_name}; supported: {', '.join(CODECS)}"
        ) from None
