"""`mobius qualify`: separate verdicts on whether a package is its source model."""

from __future__ import annotations

import argparse
import textwrap

from mobius_lite.cli import COMMANDS
from mobius_lite.cli.source_args import add_source_arguments, resolve_source
from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.qualify import DEFAULT_STEPS
from mobius_lite.optional import require
from mobius_lite.routes import EXECUTION_PROVIDERS
from mobius_lite.run.package_reader import open_package

EPILOG = textwrap.dedent(
    """\
    examples:
      mobius qualify ./pkg --source ./checkpoint --prompt-ids 5,17,33,8 --steps 5 --output ./q
      mobius qualify ./pkg --source ./checkpoint --prompt "The capital of France is"
      mobius qualify ./q8_pkg --source ./model-Q8_0.gguf --steps 3
      mobius qualify --rescore ./q

    report.json holds each verdict's evidence; arrays.npz every compared array. See
    docs/qualify.md."""
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "qualify",
        help=COMMANDS["qualify"],
        description="Run PACKAGE in onnxruntime and the source checkpoint in transformers "
        "(torch FP32; a GGUF file's or ModelOpt checkpoint's weights decoded to FP32) on the "
        "same prompt: prefill, then --steps cached greedy decode steps, each "
        "side fed its own previous token and state. Writes report.json (graph_validity, "
        "source_fidelity, numerical_parity, generation: each PASS / FAIL / NOT_RUN with its "
        "evidence) and arrays.npz. Gates are fixed: finite, NRMSE <= 0.03, cosine >= 0.999, "
        "exact greedy tokens; a package built with --activations int8 (not exact by design) "
        "has its numerical_parity and generation reported NOT_GATED. Exit status 1 when any "
        "verdict is FAIL.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("package", nargs="?", help="package directory (model.onnx, config.json)")
    add_source_arguments(p)
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt-ids",
        help="prompt token ids, comma-separated (e.g. 1,2,3); default: 16 ids drawn with numpy "
        "seed 0",
    )
    prompt.add_argument("--prompt", help="prompt text (needs a tokenizer in PACKAGE or --source)")
    p.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="cached greedy decode steps after prefill (default: %(default)s)",
    )
    p.add_argument(
        "--output",
        metavar="DIR",
        help="new or empty directory for report.json and arrays.npz (default: a new temporary "
        "directory, printed at the end)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier qualify output at --output (a directory with report.json) "
        "when the run ends; without it a non-empty --output is refused",
    )
    p.add_argument(
        "--ep",
        default="cpu",
        choices=EXECUTION_PROVIDERS,
        help="onnxruntime execution provider for the package (default: %(default)s; cuda needs "
        "onnxruntime-gpu); the reference always runs in torch FP32 on the CPU",
    )
    p.add_argument(
        "--quiet", "-q", action="store_true", help="no progress messages, only the verdict table"
    )
    p.add_argument(
        "--rescore",
        metavar="DIR",
        help="re-decide the verdicts of a saved qualify output offline from its arrays",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from mobius_lite.evaluation.qualify import parse_prompt_ids, qualify, rescore
    from mobius_lite.evaluation.qualify_report import format_table
    from mobius_lite.run.runnable import check_runnable

    if args.rescore:
        if args.package or args.source or args.overwrite:
            raise ConfigError(
                "--rescore DIR works offline on a saved output: give no PACKAGE, --source or "
                "--overwrite with it"
            )
        report = rescore(args.rescore)
    else:
        if not args.package:
            raise ConfigError("give PACKAGE (and optionally --source CHECKPOINT), or --rescore DIR")
        for module in ("onnxruntime", "torch", "transformers"):  # before any run or download
            require(module, "qualify")
        files = open_package(args.package)  # every graph and data file, before the source
        check_runnable(files, args.ep)  # its recorded dtype and operators against --ep
        ids = parse_prompt_ids(args.prompt_ids) if args.prompt_ids is not None else None
        report = qualify(
            args.package,
            resolve_source(args),
            prompt_ids=ids,
            prompt=args.prompt,
            steps=args.steps,
            output=args.output,
            ep=args.ep,
            quiet=args.quiet,
            overwrite=args.overwrite,
        )
    print(format_table(report))
    return report.exit_code
