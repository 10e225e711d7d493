"""Errors that reach users. Each says what was found and what to do, and is raised early."""

from __future__ import annotations

import enum
from typing import TypeVar


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


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived. A KeyboardInterrupt, so `except Exception` never swallows
    it and every `finally` / `except BaseException` cleanup (the staging directory, its lock)
    runs on the way out."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


Choice = TypeVar("Choice", bound=enum.Enum)


def parse_choice(kind: type[Choice], value: Choice | str, what: str) -> Choice:
    """`value` as a member of the string enum `kind` (case-insensitive), or one RouteError
    naming `what`, the value and every choice."""
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).lower())
    except ValueError:
        raise RouteError(
            f"{what} {value!r} is not supported; choose one of "
            f"{', '.join(str(c.value) for c in kind)}"
        ) from None
