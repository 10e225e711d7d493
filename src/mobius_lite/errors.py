"""Errors that reach users. Each says what was found and what to do, and is raised early."""

from __future__ import annotations


class MobiusError(Exception):
    """Base class: a user-facing problem; the CLI prints it without a traceback."""


class ConfigError(MobiusError, ValueError):
    """config.json is missing, malformed or describes something this library cannot export."""


class CheckpointError(MobiusError, ValueError):
    """The checkpoint's tensors do not match what the config says they should be."""


class RouteError(MobiusError, ValueError):
    """An unsupported dtype / execution provider / weight format combination was asked for."""


class PackageError(MobiusError):
    """The output package cannot be written (destination exists, not a package, ...)."""


class VerificationError(MobiusError):
    """Written weights differ from the source weights."""
