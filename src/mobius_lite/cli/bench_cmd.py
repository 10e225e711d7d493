"""`mobius bench`: how fast a package runs, and against what (llama.cpp on a GGUF file,
transformers eager on a checkpoint), in alternating rounds in one run."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import textwrap
from pathlib import Path

from mobius_lite.cli import COMMANDS
from mobius_lite.errors import ConfigError
from mobius_lite.routes import EXECUTION_PROVIDERS

EPILOG = textwrap.dedent(
    """\
    examples:
      mobius bench ./nano9b
      mobius bench ./nano9b-q8 --gguf nano9b-Q8_0.gguf --checkpoint ./nano9b-hf --rounds 5
      mobius bench ./nano9b --decode-tokens 64 --json bench.json --chart bench.png

    Every peer runs the same synthetic prompt (token ids drawn with a fixed seed) greedily:
    one prefill call, then --decode-tokens calls of one token, without stopping at the
    end-of-sequence token. Each peer is loaded once and warmed up once (its RSS is the
    resident-set growth over both), then timed --rounds times in rotating order; the table
    gives the medians, --json every round with the machine's 1-minute load. llama.cpp needs
    the llamacpp extra (pip install 'mobius-lite[llamacpp]'), transformers the reference
    extra."""
)


def _check_counts(args: argparse.Namespace) -> None:
    """ConfigError naming the first count below 1."""
    for flag in ("prompt_tokens", "decode_tokens", "rounds", "threads"):
        value = getattr(args, flag)
        if value < 1:
            name = "--" + flag.replace("_", "-")
            raise ConfigError(f"{name} must be 1 or more, found {value}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help=COMMANDS["bench"],
        description="Time a package's prefill and decode (an Omni package's encoders too, on "
        "synthetic inputs) on onnxruntime, optionally next to llama.cpp on a GGUF file and "
        "transformers eager on a checkpoint: ms/token, tokens/s, prefill time, session RSS "
        "and the ratios.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("package", metavar="PACKAGE", help="package directory written by mobius build")
    p.add_argument("--gguf", type=Path, metavar="FILE", help="also time llama.cpp on this GGUF")
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="also time transformers eager (torch FP32) on this checkpoint folder",
    )
    numbers = (
        ("--prompt-tokens", 128, "N", "prompt length"),
        ("--decode-tokens", 32, "N", "timed decode calls after the prefill"),
        ("--rounds", 3, "R", "timed passes of every peer"),
        ("--threads", os.cpu_count() or 1, "T", "threads every peer uses (the CPU count)"),
    )
    for flag, default, metavar, text in numbers:
        p.add_argument(
            flag, type=int, default=default, metavar=metavar, help=f"{text} (default: {default})"
        )
    p.add_argument(
        "--ep",
        default="cpu",
        choices=EXECUTION_PROVIDERS,
        help="onnxruntime execution provider; cuda also puts transformers on the GPU and "
        "offloads llama.cpp's layers (default: %(default)s)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="write every round as JSON")
    p.add_argument("--chart", type=Path, metavar="FILE.png", help="write a PNG bar chart")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def _check_output(path: Path | None, flag: str) -> None:
    """ConfigError now, not after the run, when `path` cannot be written."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file name")
    if not path.parent.is_dir():
        raise ConfigError(f"{flag} {path}: the folder {path.parent} does not exist; create it")


def run(args: argparse.Namespace) -> int:
    from mobius_lite.bench import BenchSettings, run_bench
    from mobius_lite.bench.report import table, to_json

    package, others = _peers(args)
    if getattr(args, "process_entry", False):
        # as `mobius generate` runs a package: its sessions on the process's shared pool
        from mobius_lite.bench.package_peer import session_options
        from mobius_lite.run.ort_session import on_shared_pool

        on_shared_pool(session_options(args.threads))  # sized to --threads, before any session
    settings = BenchSettings(
        args.prompt_tokens, args.decode_tokens, args.rounds, args.threads, args.ep
    )
    result = run_bench(package, others, settings, progress=not args.no_progress)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(to_json(result, _command(args)), indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    if args.chart:
        from mobius_lite.bench.chart import write_chart

        write_chart(result, args.chart)
        print(f"wrote {args.chart}", file=sys.stderr)
    return 0


def _command(args: argparse.Namespace) -> str:
    """The command line that repeats this run, every setting spelled out (defaults too)."""
    words = ["mobius", "bench", str(args.package)]
    for flag in ("gguf", "checkpoint", "prompt_tokens", "decode_tokens", "rounds", "threads"):
        value = getattr(args, flag)
        if value is not None:
            words += ["--" + flag.replace("_", "-"), str(value)]
    return shlex.join([*words, "--ep", args.ep])


def _peers(args: argparse.Namespace) -> tuple:
    """Every input checked (package, GGUF, checkpoint, output paths, the extras each needs)
    before any model is loaded; then the peers, the package's first."""
    from mobius_lite.bench.llamacpp_peer import LlamaCppPeer, check_gguf
    from mobius_lite.bench.peers import package_peer
    from mobius_lite.bench.transformers_peer import TransformersPeer, check_checkpoint
    from mobius_lite.run.package_reader import open_package

    _check_counts(args)
    files = open_package(Path(args.package))
    if args.gguf is not None:
        check_gguf(args.gguf)
    device = "cuda" if args.ep == "cuda" else "cpu"
    if args.checkpoint is not None:
        check_checkpoint(args.checkpoint, device)
    _check_output(args.json, "--json")
    _check_output(args.chart, "--chart")
    if args.chart:
        from mobius_lite.bench.chart import check_pillow

        check_pillow()
    package = package_peer(files, args.ep, args.threads, args.decode_tokens)
    others = []
    if args.gguf is not None:
        gpu = args.ep == "cuda"
        others.append(
            LlamaCppPeer(args.gguf, gpu, args.threads, args.prompt_tokens, args.decode_tokens)
        )
    if args.checkpoint is not None:
        others.append(TransformersPeer(args.checkpoint, device, args.threads, args.decode_tokens))
    return package, others
