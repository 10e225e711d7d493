"""`mobius`: the command-line front end. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mobius_lite import __version__
from mobius_lite.cli import build_cmd
from mobius_lite.errors import MobiusError

SUBCOMMANDS = (build_cmd,)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mobius",
        description="Export NVIDIA Nemotron-H models (Mamba2 + attention + MoE) to ONNX packages "
        "that run in onnxruntime and onnxruntime-genai.",
    )
    parser.add_argument("--version", action="version", version=f"mobius {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except MobiusError as exc:
        print(f"mobius {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
