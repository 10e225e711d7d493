"""A bench result as the table `mobius bench` prints and as the JSON `--json` writes."""

from __future__ import annotations

import os
import platform
from typing import Any

from mobius_lite.bench.rounds import BenchResult

MIB = 2**20
COLUMNS = ("peer", "prefill ms", "decode ms/token", "tokens/s", "load s", "RSS MiB", "tokens")


def leading_equal(tokens: list[int], reference: list[int]) -> int:
    """How many tokens from the start agree with `reference`."""
    equal = 0
    for a, b in zip(tokens, reference, strict=False):
        if a != b:
            break
        equal += 1
    return equal


def _load_range(result: BenchResult) -> str:
    loads = [run.load_1min for run in result.runs if run.load_1min is not None]
    return f"{min(loads):.1f} to {max(loads):.1f}" if loads else "unknown"


def table(result: BenchResult) -> str:
    """The summary: one row per peer (medians over the rounds), the ratios, the encoders."""
    s = result.settings
    lines = [
        f"prompt {s.prompt_tokens} tokens, {s.decode_tokens} decode tokens, {s.rounds} rounds "
        f"(order rotating), {s.threads} threads, 1-minute load {_load_range(result)}",
    ]
    lines += [f"  {peer.name}: {peer.description}" for peer in result.peers]
    rows = [list(COLUMNS)]
    reference = result.peers[0].tokens
    for peer in result.peers:
        m = result.medians(peer.name)
        same = leading_equal(peer.tokens, reference)
        rows.append(
            [
                peer.name,
                f"{m['prefill_ms']:.2f}",
                f"{m['decode_ms_per_token']:.2f}",
                f"{m['tokens_per_s']:.1f}",
                f"{peer.load_s:.2f}",
                f"{peer.rss_growth_bytes / MIB:.1f}",
                "-" if peer is result.peers[0] else f"{same} of {len(reference)} same",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
    ratios = result.ratios()
    if ratios:
        lines.append("peer time / package time (above 1: the package is faster):")
        for name, r in ratios.items():
            lines.append(
                f"  {name}: prefill {r['prefill_ms']:.2f}x, decode {r['decode_ms_per_token']:.2f}x"
            )
    encoders = {
        k[: -len("_ms")]: v
        for k, v in result.medians(result.peers[0].name).items()
        if k.endswith("_encoder_ms")
    }
    if encoders:
        lines.append(
            "encoders (synthetic inputs): "
            + ", ".join(f"{name} {ms:.2f} ms" for name, ms in encoders.items())
        )
    return "\n".join(lines)


def to_json(result: BenchResult, command: str) -> dict[str, Any]:
    """Every figure: settings, machine, the prompt, each peer's facts and medians, the ratios
    and every round's pass (each decode call's milliseconds and the tokens chosen)."""
    s = result.settings
    reference = result.peers[0].tokens
    return {
        "command": command,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
        },
        "settings": {
            "prompt_tokens": s.prompt_tokens,
            "decode_tokens": s.decode_tokens,
            "rounds": s.rounds,
            "threads": s.threads,
            "ep": s.ep,
        },
        "prompt": result.prompt,
        "peers": {
            peer.name: {
                "description": peer.description,
                "load_s": peer.load_s,
                "session_rss_growth_mib": peer.rss_growth_bytes / MIB,
                "tokens": peer.tokens,
                "tokens_equal_to_package": leading_equal(peer.tokens, reference),
                "median": result.medians(peer.name),
            }
            for peer in result.peers
        },
        "ratios": result.ratios(),
        "rounds": [
            {
                "round": run.round,
                "peer": run.peer,
                "load_1min": run.load_1min,
                "prefill_ms": run.timed.prefill_s * 1e3,
                "decode_ms": [t * 1e3 for t in run.timed.decode_s],
                "decode_ms_per_token": run.timed.ms_per_token,
                "encoders_ms": {k: v * 1e3 for k, v in run.timed.encoders_s.items()},
                "tokens": run.timed.tokens,
            }
            for run in result.runs
        ],
    }
