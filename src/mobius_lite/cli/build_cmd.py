"""`mobius build`: export a checkpoint to an ONNX package."""

from __future__ import annotations

import argparse

from mobius_lite.build import build


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "build",
        help="export a Nemotron-H checkpoint to an ONNX package",
        description="Export a Nemotron-H checkpoint (config.json + safetensors) to an ONNX "
        "package: model.onnx, external data, genai_config.json.",
    )
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--output", required=True, help="package directory to create")
    p.add_argument(
        "--dtype", default="f32", choices=["f32", "f16", "bf16"], help="weight/activation dtype"
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing package")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    package = build(args.model, dtype=args.dtype)
    out = package.save(args.output, overwrite=args.overwrite)
    print(f"wrote {out}")
    return 0
