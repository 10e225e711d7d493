"""Export a local Nemotron-H checkpoint with mobius_lite and greedy-generate with onnxruntime-genai.

    python examples/generate_with_genai.py CHECKPOINT_DIR [--output PACKAGE_DIR]
        [--prompt TEXT | --prompt-ids 1,2,3] [--max-new-tokens N] [--speculative K]

The package (model.onnx + external data + genai_config.json) is written to --output (default:
CHECKPOINT_DIR-onnx next to the checkpoint) unless it already exists there. --prompt needs a
tokenizer in the checkpoint (its files are copied into the package); --prompt-ids works for
any checkpoint, including the tiny test ones that have no tokenizer. --speculative K drafts K
tokens per round with the package's MTP head through og.MtpGenerator (docs/genai.md: 0.18 on
the CPU provider refuses float32 logits).
"""

from __future__ import annotations

import argparse
import json
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


def generate_mtp(
    package: Path, prompt_ids: list[int], max_new_tokens: int, draft_tokens: int | None = None
) -> tuple[list[int], dict]:
    """Greedy generation with og.MtpGenerator: the package's decoder verifies drafts of its
    MTP head (mtp.onnx), whose og.Model is genai_config.json with genai_mtp_overlay.json
    applied; `draft_tokens` per round (default: the package's, the head's depth). Returns the
    new tokens and MtpGenerator's statistics."""
    main_model = og.Model(og.Config(str(package)))
    head_config = og.Config(str(package))
    head_config.overlay((Path(package) / "genai_mtp_overlay.json").read_text())
    head_model = og.Model(head_config)
    params = og.GeneratorParams(main_model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + max_new_tokens)
    if draft_tokens is not None:
        params.set_speculative_options(max_draft_tokens=draft_tokens)
    generator = og.MtpGenerator(main_model, head_model, params)
    generator.append_tokens(np.array(prompt_ids, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    new = [int(t) for t in generator.get_sequence()[len(prompt_ids) :]]
    return new, dict(generator.get_stats())


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
    parser.add_argument(
        "--speculative", type=int, metavar="K", help="draft K tokens a round with the MTP head"
    )
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
    if args.speculative:
        new, stats = generate_mtp(package, prompt_ids, args.max_new_tokens, args.speculative)
        shown = {k: stats.get(k) for k in ("rounds", "accepts", "trials")}
        print("MtpGenerator:", json.dumps(shown))
    else:
        new = generate(package, prompt_ids, args.max_new_tokens)
    print("prompt ids:", prompt_ids)
    print("new tokens:", new)
    if tokenizer is not None:
        print("text:", tokenizer.decode(np.array(new, dtype=np.int32)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
