"""The --source / --revision options shared by the commands that check a package."""

from __future__ import annotations

import argparse
from pathlib import Path

from mobius_lite.weights.package_source import source_for_package


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--source",
        metavar="CHECKPOINT",
        help="the checkpoint the package was built from: a directory of *.safetensors (with "
        "or without model.safetensors.index.json), one .safetensors file, a .gguf file, or a "
        "hub id "
        "(at --revision or its pinned commit); default: the model and commit recorded in the "
        "package's manifest.json",
    )
    parser.add_argument(
        "--revision", help="hub commit, branch or tag of --source (default: the pin / manifest)"
    )


def resolve_source(args: argparse.Namespace) -> Path:
    """The local path of the checkpoint named by --source / --revision or by the manifest."""
    return source_for_package(args.package, args.source, args.revision).path
