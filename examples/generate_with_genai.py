"""Export a local Nemotron-H checkpoint with mobius_lite and greedy-generate with onnxruntime-genai.

    python examples/generate_with_genai.py CHECKPOINT_DIR [--output PACKAGE_DIR]
        [--prompt TEXT | --prompt-ids 1,2,3] [--max-new-tokens N]

The package (model.onnx + external data + genai_config.json) is written to --output (default:
CHECKPOINT_DIR-onnx next to the checkpoint) unless it already exists there. --prompt needs a
tokenizer in the checkpoint (its files are copied into the package); --prompt-ids works for
any checkpoint, including the tiny test ones that have no tokenizer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

import mobius_lite


def export(checkpoint: Path, output: Path) -> Path:
    """Build the package once; reuse it when it is already there."""
    if (output / "genai_config.json").is_file():
        print(f"using the existing package {output}", file=sys.stderr)
        return output
    return mobius_lite.build(checkpoint, dtype="f32").save(output)


def generate(package: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy generation in onnxruntime-genai; returns the new tokens only."""
    model = og.Model(og.Config(str(package)))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt_ids], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)[len(prompt_ids) :]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "checkpoint", type=Path, help="checkpoint directory (config.json + safetensors)"
    )
    parser.add_argument("--output", type=Path, help="package directory")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--prompt", help="prompt text (needs the checkpoint's tokenizer)")
    group.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)

    output = args.output or args.checkpoint.with_name(args.checkpoint.name + "-onnx")
    package = export(args.checkpoint, output)
    tokenizer = None
    if args.prompt_ids:
        prompt_ids = [int(t) for t in args.prompt_ids.split(",")]
    else:
        model = og.Model(og.Config(str(package)))
        tokenizer = og.Tokenizer(model)
        prompt_ids = [int(t) for t in tokenizer.encode(args.prompt or "The capital of France is")]
    new = generate(package, prompt_ids, args.max_new_tokens)
    print("prompt ids:", prompt_ids)
    print("new tokens:", new)
    if tokenizer is not None:
        print("text:", tokenizer.decode(np.array(new, dtype=np.int32)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
