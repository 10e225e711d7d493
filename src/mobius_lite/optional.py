"""The optional packages some commands need, and the pip extra (pyproject.toml) of each.

A command imports them only when it runs, so `mobius --help` starts without them; a missing
one is one MissingPackageError naming the package and the extra that brings it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from mobius_lite.errors import MobiusError

# import name -> (pip distribution, extra of mobius-lite that installs it)
OPTIONAL_PACKAGES: dict[str, tuple[str, str]] = {
    "onnxruntime": ("onnxruntime", "runtime"),
    "tokenizers": ("tokenizers", "runtime"),
    "PIL": ("pillow", "runtime"),
    "torch": ("torch", "reference"),
    "transformers": ("transformers", "reference"),
    "onnxruntime_genai": ("onnxruntime-genai", "genai"),
    "llama_cpp": ("llama-cpp-python", "llamacpp"),
}


class MissingPackageError(MobiusError, ImportError):
    """An optional package a command needs is not installed."""


def missing_package_message(module: str, purpose: str | None = None) -> str:
    """'<purpose> needs <pip name>, which is not installed: pip install "mobius-lite[extra]"'."""
    distribution, extra = OPTIONAL_PACKAGES[module.split(".")[0]]
    what = f"{purpose} needs" if purpose else "this command needs"
    return (
        f"{what} {distribution}, which is not installed here: pip install "
        f"'mobius-lite[{extra}]' (or pip install {distribution})"
    )


def require(module: str, purpose: str | None = None) -> ModuleType:
    """Import an optional package, or raise MissingPackageError naming its extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != module.split(".")[0]:
            raise  # the package is there, one of its own imports failed
        raise MissingPackageError(missing_package_message(module, purpose)) from None
