"""mobius_lite: export NVIDIA Nemotron-H hybrid models to ONNX."""

from mobius_lite.build import build, build_from_module
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind, Precision, StateRole
from mobius_lite.errors import MobiusError
from mobius_lite.package import ModelPackage
from mobius_lite.version import __version__

__all__ = [
    "LayerKind",
    "MobiusError",
    "ModelPackage",
    "NemotronHConfig",
    "Precision",
    "StateRole",
    "__version__",
    "build",
    "build_from_module",
]
