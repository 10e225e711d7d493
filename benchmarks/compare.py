r"""The project's comparisons through `mobius bench`'s Python API (mobius_lite.bench): the random
"mid" model written here, exported, then timed next to llama.cpp on an F32 GGUF of the same
weights and transformers eager on the checkpoint, in alternating rounds in one process.

What is written first (into --workdir, deleted at the end):
  checkpoint/      the mid model (common.MID, --variant's layer pattern, --size), random weights
  package/         `mobius build` of it with --build-flags (f32 unless the flags say otherwise);
                   its wall time, peak RSS and weight bytes go into the JSON under "export"
  model-f32.gguf   with --llamacpp: the same weights as an F32 nemotron_h_moe GGUF (llama.cpp
                   builds every FFN layer of that architecture as MoE: use --variant no-mlp)
Then mobius_lite.bench.run_bench times the package and each peer (--transformers, --llamacpp).

With --package (twice or more) nothing is written: the given packages are timed against each
other (an A/B of two builds on a machine other work shares; the first is the reference of the
ratios).

Usage:
    python benchmarks/compare.py --variant mid --transformers --threads 2 --decode-tokens 32 \
        --rounds 5 --json OUT.json                      # the package against transformers eager
    python benchmarks/compare.py --variant no-mlp --build-flags="--backend ort" --llamacpp \
        --transformers --threads 2 --decode-tokens 16 --rounds 4 --json OUT.json
    python benchmarks/compare.py --package A --package B --decode-tokens 48 --rounds 5
    python benchmarks/compare.py --size tiny --variant no-mlp --transformers --rounds 1 \
        --prompt-tokens 16 --decode-tokens 4            # smoke run
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from common import PATTERNS, make_checkpoint, timed_export, write_f32_gguf

from mobius_lite.bench import BenchSettings, run_bench
from mobius_lite.bench.report import table, to_json
from mobius_lite.bench.workdir import claim_workdir, release_workdir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the root: reference_fixtures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/compare"))
    parser.add_argument("--variant", choices=sorted(PATTERNS), default="mid")
    parser.add_argument("--size", choices=("mid", "tiny"), default="mid")
    parser.add_argument("--build-flags", default="", help="extra `mobius build` flags, one string")
    parser.add_argument("--llamacpp", action="store_true", help="time llama.cpp on an F32 GGUF")
    parser.add_argument("--transformers", action="store_true", help="time transformers eager")
    parser.add_argument(
        "--package",
        type=Path,
        action="append",
        default=[],
        help="time these packages against each other instead (give it twice or more)",
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every round (mobius bench's --json)")
    parser.add_argument("--chart", type=Path, help="write mobius bench's PNG chart")
    parser.add_argument("--no-progress", action="store_true")
    return parser.parse_args(argv)


def given_packages(args: argparse.Namespace) -> tuple[Any, list[Any]]:
    """Each --package as a peer named by its folder; the first is the reference."""
    from mobius_lite.bench.peers import package_peer
    from mobius_lite.run.package_reader import open_package

    peers = []
    for i, path in enumerate(args.package):
        peer = package_peer(open_package(path), "cpu", args.threads, args.decode_tokens)
        peer.name = f"{chr(ord('A') + i)}: {path.name}"
        peers.append(peer)
    return peers[0], peers[1:]


def written_model(args: argparse.Namespace, facts: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The mid checkpoint, its package (and GGUF) in the workdir; the package peer and the
    peers asked for."""
    from mobius_lite.bench.llamacpp_peer import LlamaCppPeer, check_gguf
    from mobius_lite.bench.peers import package_peer
    from mobius_lite.bench.transformers_peer import TransformersPeer
    from mobius_lite.run.package_reader import open_package

    checkpoint, package = args.workdir / "checkpoint", args.workdir / "package"
    model = make_checkpoint(checkpoint, args.variant, args.size)
    facts["export"] = timed_export(checkpoint, package, shlex.split(args.build_flags))
    others: list[Any] = []
    if args.llamacpp:
        gguf = write_f32_gguf(args.workdir / "model-f32.gguf", model)
        check_gguf(gguf)
        others.append(
            LlamaCppPeer(gguf, False, args.threads, args.prompt_tokens, args.decode_tokens)
        )
    if args.transformers:
        others.append(TransformersPeer(checkpoint, "cpu", args.threads, args.decode_tokens))
    ours = package_peer(open_package(package), "cpu", args.threads, args.decode_tokens)
    return ours, others


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = BenchSettings(
        args.prompt_tokens, args.decode_tokens, args.rounds, args.threads, "cpu"
    )
    facts: dict[str, Any] = {}
    if args.package:
        if len(args.package) < 2:
            raise SystemExit("--package: give two packages or more (or none)")
        ours, others = given_packages(args)
        workdir = None
    else:
        workdir = claim_workdir(args.workdir)
    try:
        if workdir is not None:
            ours, others = written_model(args, facts)
        result = run_bench(ours, others, settings, progress=not args.no_progress)
    finally:
        if workdir is not None:
            release_workdir(workdir)
    print(table(result))
    if args.json:
        command = shlex.join(["python", "benchmarks/compare.py", *sys.argv[1:]])
        args.json.write_text(json.dumps({**to_json(result, command), **facts}, indent=2) + "\n")
    if args.chart:
        from mobius_lite.bench.chart import write_chart

        write_chart(result, args.chart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
