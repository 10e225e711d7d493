"""Benchmark children in fresh processes, their order rotating from round to round: how the
investigation scripts time setups that must not share a process (sessions, thread pools)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def alternating_rounds(children: dict[str, list[str]], rounds: int) -> list[dict[str, Any]]:
    """Run each child (label -> its command line) once a round in a fresh process, the order
    rotating by one each round; each child prints its figures as one JSON object on its last
    stdout line. Returns the rounds: the 1-minute load when each began, and each child's
    figures under its label. Prints each round as it ends; exits naming a child that fails."""
    labels = list(children)
    done_rounds = []
    for r in range(rounds):
        row: dict[str, Any] = {"load_average": os.getloadavg()}
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            done = subprocess.run(children[label], capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"{label}: {done.stderr.strip().splitlines()[-1]}")
            row[label] = json.loads(done.stdout.strip().splitlines()[-1])
        print(json.dumps(row), flush=True)
        done_rounds.append(row)
    return done_rounds


def write_rounds(script: str, rounds: list[dict[str, Any]], path: Path | None) -> dict[str, Any]:
    """The run's record (the command that made it, the rounds, the load after) written to
    `path` as JSON when given."""
    result = {
        "command": " ".join([f"python {script}", *sys.argv[1:]]),
        "rounds": rounds,
        "load_average_after": os.getloadavg(),
    }
    if path:
        path.write_text(json.dumps(result, indent=2) + "\n")
    return result
