"""Byte counts in and out of text: '512MB' -> 512000000, 1536 -> '1.50 KiB'."""

from __future__ import annotations

import re

SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}


def parse_size(text: str | int) -> int:
    """'1GiB', '512MB', '1048576' -> bytes (decimal kB/MB/GB, binary KiB/MiB/GiB)."""
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in SIZE_UNITS:
            raise ValueError(
                f"invalid size {text!r}: use a byte count or a number with a unit "
                "(KB, MB, GB, KiB, MiB, GiB), e.g. 512MB or 1GiB"
            )
        value = int(float(match.group(1)) * SIZE_UNITS[unit])
    if value <= 0:
        raise ValueError(f"size must be positive, found {text!r}")
    return value


def human_bytes(n: float | None) -> str:
    """1536 -> '1.50 KiB'; None -> "-"."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError
