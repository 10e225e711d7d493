"""What one timed pass of a peer gives, and the process facts measured around it (resident
set, machine load)."""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

# A callback each peer calls after every model call (prefill, each decode step, each
# encoder): the progress bar's tick.
Tick = Callable[[], None]


@dataclass
class Timed:
    """One greedy pass: the prefill call's wall seconds, each decode call's, the tokens chosen
    (the prefill's first, then one per decode call) and, for an Omni package, each encoder's
    wall seconds by graph name."""

    prefill_s: float
    decode_s: list[float]
    tokens: list[int]
    encoders_s: dict[str, float] = field(default_factory=dict)

    @property
    def ms_per_token(self) -> float:
        """Median decode call in milliseconds (the calls after prefill)."""
        return statistics.median(self.decode_s) * 1e3


class Peer(Protocol):
    """One side of the comparison."""

    name: str  # the row label: "package", "llama.cpp", "transformers"
    description: str  # what runs, in words (file, provider, threads)
    calls_per_pass: int  # model calls in one pass (prefill + decode + encoders): the bar's unit

    def open(self) -> None:
        """Load the model (sessions, weights); called once before any pass."""

    def run(self, prompt: list[int], decode_tokens: int, tick: Tick) -> Timed:
        """One greedy pass from a fresh cache: prefill `prompt`, then `decode_tokens` calls."""


class PackageSide(Peer, Protocol):
    """The package's peer: after open(), it knows its vocabulary (the prompt is drawn from it)."""

    def vocab_size(self) -> int | None:
        """The decoder's vocabulary size (None when its graph does not declare it)."""


@dataclass
class PeerRun:
    """A peer in one round: its pass, the round, and the 1-minute load average before it."""

    peer: str
    round: int
    load_1min: float | None
    timed: Timed


def rss_bytes() -> int:
    """This process's resident set now (VmRSS); where /proc is missing, the peak
    (ru_maxrss), the best the platform offers."""
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def load_1min() -> float | None:
    """The machine's 1-minute load average (None where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def timed_call(fn: Callable[[], object]) -> tuple[object, float]:
    """fn()'s result and its wall seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start
