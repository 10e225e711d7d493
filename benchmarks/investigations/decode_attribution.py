r"""Where a package's decode step goes, per layer kind, without the profiler.

onnxruntime's profiler adds ~10 us to every node it times, which on a decode step of a few
hundred small nodes hides where the time goes. This script times the real package against
copies of it with every layer of one kind knocked out (the layer's residual Add passes its
input through, its caches pass through unchanged, and every node only those layers used is
dropped), each in its own session, in alternating blocks of decode steps from the same
prefilled caches. A kind's cost is the full step's median minus the knocked-out one's;
"top" is what is left with every layer knocked out (embedding, final norm, lm_head and the
session's own input / output). Beside each cost: the weight bytes that kind reads per decode
step (stacked routed experts and QMoE operands at k / E of their bytes) and the rate that
implies. With --gguf, llama.cpp's decode on the same file, in the same process afterwards.

The knocked-out graphs compute wrong numbers on purpose; only their time is read.

Usage (the mid GGUF files of bench_gguf.py, one package of them, then its attribution):
    python benchmarks/investigations/decode_attribution.py --write-gguf DIR \
        [--types F32,Q8_0,Q4_K_M,IQ2_XXS]
    mobius build --model DIR/mid-Q8_0.gguf --output DIR/q8_0-int8 --backend ort --activations int8
    python benchmarks/investigations/decode_attribution.py DIR/q8_0-int8 \
        [--gguf DIR/mid-Q8_0.gguf] [--steps 16] [--rounds 3] [--threads 2] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import open_package, run_llamacpp  # noqa: E402

from mobius_lite.bench.attribution import (  # noqa: E402
    TOP,
    knock_out,
    package_with_graph,
    step_weight_bytes,
)
from mobius_lite.bench.package_peer import session_options  # noqa: E402
from mobius_lite.bench.workdir import claim_workdir  # noqa: E402
from mobius_lite.configs.nemotron_h import NemotronHConfig  # noqa: E402
from mobius_lite.layout import DECODER_FILE  # noqa: E402


def decode_times(session: Any, past: dict, mask: np.ndarray, steps: int) -> list[float]:
    """Seconds per decode step from the given caches, the first two steps left out."""
    session.past, session.mask = {k: v.copy() for k, v in past.items()}, mask.copy()
    token = np.array([[5]], dtype=np.int64)
    seconds = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        session.step(token)
        seconds.append(time.perf_counter() - start)
    return seconds[2:]


def llamacpp_decode(gguf: Path, prompt: np.ndarray, steps: int, threads: int) -> float:
    return run_llamacpp(gguf, [int(t) for t in prompt.reshape(-1)], steps, threads)[
        "decode_ms_per_token"
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "package", type=Path, nargs="?", help="a text-generation package directory (mobius build)"
    )
    parser.add_argument(
        "--write-gguf",
        type=Path,
        metavar="DIR",
        help="write bench_gguf.py's mid GGUF files (--types) into DIR (new or empty) and stop",
    )
    parser.add_argument(
        "--types",
        default="F32,Q8_0,Q4_K_M,IQ2_XXS",
        help="with --write-gguf: the files to write (default: %(default)s)",
    )
    parser.add_argument("--gguf", type=Path, help="time llama.cpp's decode on this file too")
    parser.add_argument("--steps", type=int, default=16, help="decode steps per block")
    parser.add_argument("--rounds", type=int, default=3, help="alternating blocks per variant")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (and llama.cpp's)")
    parser.add_argument(
        "--prompt-length", type=int, default=128, help="tokens prefilled before the decode steps"
    )
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if args.write_gguf is not None:
        from bench_gguf import write_files  # benchmarks/investigations/

        quantized = [t for t in args.types.split(",") if t != "F32"]  # F32 is always written
        written = write_files(claim_workdir(args.write_gguf), quantized)
        print("\n".join(str(path) for path in written.values()))
        return
    if args.package is None:
        parser.error("give a PACKAGE (or --write-gguf DIR)")
    import onnx

    config = NemotronHConfig.from_file(args.package / "config.json")
    kinds = list(config.layers_block_type)
    model = onnx.load(str(args.package / DECODER_FILE), load_external_data=False)
    weights = step_weight_bytes(
        model, kinds, config.n_routed_experts or 1, config.num_experts_per_tok or 1
    )
    present = sorted({k.value for k in kinds})
    variants = {"full": set()} | {
        f"without {kind}": {i for i, k in enumerate(kinds) if k.value == kind} for kind in present
    }
    variants["without every layer"] = set(range(len(kinds)))
    prompt = np.random.default_rng(0).integers(3, 400, size=(1, args.prompt_length))
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {}
        for name, layers in variants.items():
            path = args.package
            if layers:
                edited = knock_out(model, layers)
                path = package_with_graph(args.package, Path(tmp) / str(len(sessions)), edited)
            sessions[name] = open_package(path, session_options(args.threads))[0]
            print(f"{name}: session ready", flush=True)
        full = sessions["full"]
        full.reset(1)
        full.step(prompt, logits_to_keep=1)
        past, mask = dict(full.past), full.mask.copy()
        seconds: dict[str, list[float]] = {name: [] for name in sessions}
        for _ in range(args.rounds):
            for name, session in sessions.items():
                time.sleep(0.2)  # the previous session's threads stop spinning
                seconds[name] += decode_times(session, past, mask, args.steps)
    medians = {name: statistics.median(s) * 1e3 for name, s in seconds.items()}
    rows = []
    for kind in present:
        ms = medians["full"] - medians[f"without {kind}"]
        rows.append({"part": kind, "ms": ms, "weight_mb": weights.get(kind, 0) / 1e6})
    rows.append(
        {"part": TOP, "ms": medians["without every layer"], "weight_mb": weights.get(TOP, 0) / 1e6}
    )
    result: dict[str, Any] = {
        "command": " ".join(
            ["python benchmarks/investigations/decode_attribution.py", *sys.argv[1:]]
        ),
        "package": str(args.package),
        "decode_ms_median": medians,
        "parts": rows,
    }
    if args.gguf is not None:
        result["llamacpp_decode_ms"] = llamacpp_decode(args.gguf, prompt, 32, args.threads)
    print(f"decode, full package: {medians['full']:.2f} ms/step")
    print("| part | ms per step | weight MB per step | GB/s |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        rate = row["weight_mb"] / row["ms"] if row["ms"] > 0 else float("nan")
        print(f"| {row['part']} | {row['ms']:.2f} | {row['weight_mb']:.1f} | {rate:.1f} |")
    if "llamacpp_decode_ms" in result:
        print(f"llama.cpp decode on {args.gguf.name}: {result['llamacpp_decode_ms']:.2f} ms/step")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
