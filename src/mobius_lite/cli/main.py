"""`mobius`: the command-line front end. Each subcommand lives in its own module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from mobius_lite.cli import build_cmd, generate_cmd, inspect_cmd, qualify_cmd, verify_cmd
from mobius_lite.errors import MobiusError
from mobius_lite.version import __version__

SUBCOMMANDS = (build_cmd, inspect_cmd, verify_cmd, qualify_cmd, generate_cmd)

EPILOG = """\
examples:
  mobius build --model nvidia/NVIDIA-Nemotron-Nano-9B-v2 --output ./nano9b
  mobius build --model ./my-checkpoint --output ./pkg --dtype f16 --shard-size 512MB
  mobius inspect ./nano9b
  mobius inspect ./nano9b --json
  mobius generate ./omni --prompt "<image> Describe it." --image photo.jpg

Run `mobius COMMAND --help` for each command's options. Errors are printed as one line
(what was found, what is supported, what to do) and exit with status 2.
Documentation: docs/cli.md."""


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mobius",
        description="Export NVIDIA Nemotron-H models (Mamba2 + attention + MoE) to ONNX packages "
        "that run in onnxruntime and onnxruntime-genai.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"mobius {__version__}", help="print the version"
    )
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
