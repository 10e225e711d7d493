"""`mobius verify`: compare a package's weights with the checkpoint it was exported from."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from mobius_lite.cli import COMMANDS
from mobius_lite.cli.source_args import add_source_arguments, resolve_source

EPILOG = textwrap.dedent(
    """\
    what is checked:
      - every external-data reference in model.onnx (subgraphs included) names a regular
        file of the package (no links) and a range of the right length inside it; the data
        files are exactly those the model references
      - every checkpoint tensor is bound exactly once or listed in manifest.json as unused
      - every binding, re-read from both sides: byte-exact for identity and stack; for casts
        the source is cast again (round to nearest even) and the bytes compared; a tensor
        quantized at export (build --quantize) is quantized again by an independent quantizer
        (gguf-py for q8_0 / q4_0, onnxruntime's for int4 / int8) and the bytes compared
      - the sha256 of the source and written bytes recorded at export time

    exit status: 0 when everything matches, 1 when anything mismatches (each mismatch is
    printed on its own line), 2 on an error (not a package; a graph or data file missing,
    truncated or linked, checked before the source is read; unreadable checkpoint).

    examples:
      mobius verify ./nano9b --source ./NVIDIA-Nemotron-Nano-9B-v2
      mobius verify ./nano9b --source ./NVIDIA-Nemotron-Nano-9B-v2 --json > verify.json
    """
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help=COMMANDS["verify"],
        description="Re-read a package and the checkpoint it was exported from and compare "
        "every weight binding recorded in the package's manifest.json.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("package", metavar="PACKAGE", help="package directory (with manifest.json)")
    add_source_arguments(p)
    p.add_argument(
        "--json", action="store_true", help="print the report as JSON on stdout instead of text"
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="no progress bar; print only mismatches"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mobius_lite.run.package_reader import open_package
    from mobius_lite.weights.verify import verify_package

    open_package(args.package)  # every file there and complete, before the source is resolved
    report = verify_package(Path(args.package), resolve_source(args), quiet=args.quiet or args.json)
    if args.json:
        json.dump(report.as_dict(), sys.stdout, indent=2)
        print()
    else:
        for mismatch in report.mismatches:
            print(f"MISMATCH {mismatch}")
        if report.ok and not args.quiet:
            print(
                f"ok: {report.checked} source tensors match ({report.bytes_compared} bytes "
                f"compared) in {report.package}"
            )
        elif not report.ok:
            print(
                f"FAILED: {len(report.mismatches)} mismatches; {report.checked} source tensors "
                f"compared in {report.package}",
                file=sys.stderr,
            )
    return 0 if report.ok else 1
