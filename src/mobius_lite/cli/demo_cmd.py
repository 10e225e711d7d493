"""`mobius demo`: write a small random checkpoint of one kind (no download, no torch)."""

from __future__ import annotations

import argparse
import textwrap

from mobius_lite.cli import COMMANDS
from mobius_lite.demo import DEMO_KINDS

EPILOG = textwrap.dedent(
    """\
    The checkpoints have random weights (their text is gibberish) and real layouts: what
    transformers' save_pretrained writes (config.json, model.safetensors under the released
    names, tokenizer.json), an MTP head's mtp.* tensors, a Puzzle's block_configs, an Omni
    vision tower, a GGUF file as llama.cpp's converter writes it. Each takes well under a
    second and about 1 MB.

    examples:
      mobius demo text demo-ckpt
      mobius build --model demo-ckpt --output demo-pkg
      mobius verify demo-pkg --source demo-ckpt
      mobius generate demo-pkg --prompt "hello"
      mobius demo gguf demo.gguf && mobius build --model demo.gguf --output demo-gguf-pkg"""
)


def register(sub: argparse._SubParsersAction) -> None:
    kinds = "\n".join(f"  {kind:<7} {text}" for kind, text in DEMO_KINDS.items())
    p = sub.add_parser(
        "demo",
        help=COMMANDS["demo"],
        description="Write a small random checkpoint of KIND at OUT, to try every command "
        f"on without a download. Kinds:\n{kinds}",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("kind", metavar="KIND", choices=list(DEMO_KINDS), help=", ".join(DEMO_KINDS))
    p.add_argument(
        "out",
        metavar="OUT",
        help="new or empty directory for the checkpoint (gguf: a new file ending in .gguf)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mobius_lite.demo import write_demo

    path = write_demo(args.kind, args.out, seed=args.seed)
    print(f"wrote the {args.kind} demo checkpoint to {path}")
    return 0
