"""mobius_lite: export NVIDIA Nemotron-H hybrid models to ONNX.

The entry points are imported on first use (PEP 562), so importing a light submodule (the
command line's `--help`, errors, version) does not import onnx, onnxscript or numpy.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from mobius_lite.errors import MobiusError
from mobius_lite.version import __version__

if TYPE_CHECKING:
    from mobius_lite.build import build, build_from_module
    from mobius_lite.configs import NemotronHConfig
    from mobius_lite.enums import LayerKind, Precision, StateRole
    from mobius_lite.package import ModelPackage

_LAZY = {
    "build": "mobius_lite.build",
    "build_from_module": "mobius_lite.build",
    "NemotronHConfig": "mobius_lite.configs",
    "LayerKind": "mobius_lite.enums",
    "Precision": "mobius_lite.enums",
    "StateRole": "mobius_lite.enums",
    "ModelPackage": "mobius_lite.package",
}

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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mobius_lite' has no attribute {name!r}")


class _Package(types.ModuleType):
    """The package module: `mobius_lite.build` stays the build function even after the
    submodule of the same name is imported (the import system then sets the attribute to the
    submodule, which would shadow the function)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "build" and isinstance(value, types.ModuleType):
            value = value.build
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
