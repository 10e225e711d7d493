"""GGUF export benchmark (issue 10): the mid nemotron_h_moe model as F32, Q8_0, Q4_K_M and
IQ2_XXS GGUF, exported per weight route and run on onnxruntime CPU next to llama.cpp.

One run:
  1. builds bench_mid.py's mid config without its dense MLP layers (llama.cpp builds every
     nemotron_h_moe FFN layer as MoE) as a random transformers model, writes it as an F32 GGUF
     in the converter's layout (tests/gguf_fixtures.py) and quantizes it with llama.cpp's own
     quantizer to Q8_0 and Q4_K_M (the presets, fallbacks included); IQ2_XXS needs an
     importance matrix in llama.cpp, so that file is written by the fixtures (random valid
     IQ2_XXS blocks, IQ4_NL / F16 where rows do not hold whole 256-element blocks);
  2. per file and route (standard, ort = --backend ort, --dequantize, and --dequantize with
     --backend ort; F32 files have no packed weights: standard and ort only): `mobius build`
     wall time and peak RSS (/usr/bin/time -v), package weight bytes,
     then in a fresh process: session creation time, prefill of --prompt-length tokens and
     decode ms/token (medians), and that process's peak RSS;
  3. llama.cpp (llama_cpp.Llama) on the same file with the same thread count: load time,
     prefill and decode ms/token.

Usage:
    python benchmarks/bench_gguf.py --workdir /tmp/bench_gguf --threads 2 \
        --json docs/bench_gguf.json
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests"))

from bench_common import session_options  # noqa: E402
from bench_mid import MID  # noqa: E402

PATTERN = "ME*MEME*ME"
KINDS = {"M": "mamba", "E": "moe", "*": "attention"}
CORPUS = ["The quick brown fox jumps over the lazy dog.", "state space models, 1234!"] * 8


def mid_moe() -> dict[str, Any]:
    return {**MID, "layers_block_type": [KINDS[c] for c in PATTERN]}


def write_files(workdir: Path, names: list[str]) -> dict[str, Path]:
    import llama_cpp
    import torch

    from gguf_fixtures import build_bpe_tokenizer, write_gguf
    from nemotron_reference import make_reference

    model = make_reference(mid_moe(), seed=0)
    with torch.no_grad():  # spread router scores so routing is not degenerate (as bench_mid)
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.weight.normal_(0.0, 0.05)
    tokenizer = build_bpe_tokenizer(CORPUS, vocab_size=400)
    special = {"pad": 0, "bos": 1, "eos": 2}
    f32 = write_gguf(
        workdir / "mid-F32.gguf", model, "nemotron_h_moe", {}, tokenizer, special_tokens=special
    )[0]
    files = {"F32": f32}
    ftypes = {
        "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
        "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    }
    for name in names:
        out = workdir / f"mid-{name}.gguf"
        if name in ftypes:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = ftypes[name], 2
            if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params):
                raise RuntimeError(f"llama.cpp could not quantize to {name}")
        elif name == "IQ2_XXS":
            types = {r"\.weight$": "IQ2_XXS"}
            write_gguf(out, model, "nemotron_h_moe", types, tokenizer, special_tokens=special)
        else:
            continue
        files[name] = out
    del model
    return files


def gguf_facts(path: Path) -> dict[str, Any]:
    import gguf

    tensors = gguf.GGUFReader(path).tensors
    mix: dict[str, int] = {}
    for t in tensors:
        mix[t.tensor_type.name] = mix.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {"tensor_bytes": sum(int(t.n_bytes) for t in tensors), "bytes_by_type": mix}


def timed_export(path: Path, output: Path, flags: list[str]) -> dict[str, Any]:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "mobius_lite.cli.main", "build"]
    cmd += ["--model", str(path), "--output", str(output), "--overwrite", "--quiet", *flags]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    manifest = json.loads((output / "manifest.json").read_text())
    return {
        "command": " ".join(["mobius build --model", path.name, *flags]),
        "export_wall_s": wall,
        "export_peak_rss_mib": rss / 1024,
        "package_weight_bytes": manifest["totals"]["bytes_written"],
    }


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as handle:
        line = next(x for x in handle if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def ort_child(package: Path, prompt: np.ndarray, decode: int, threads: int, repeats: int) -> dict:
    """Run in a fresh process (--child): session creation, prefill, decode; peak RSS."""

    from mobius_lite.runtime import DecoderSession

    options = session_options(threads)
    before = rss_mib()
    start = time.perf_counter()
    session = DecoderSession(package / "model.onnx", session_options=options)
    created = time.perf_counter() - start
    after_session = rss_mib() - before

    def prefill():
        session.reset(1)  # last position's logits only, as llama.cpp computes
        return session.step(prompt, logits_to_keep=1)

    prefill()
    prefill_s = median_time(prefill, repeats)
    token = prefill()["logits"][:, -1].argmax(-1)[:, None]
    steps = []
    for _ in range(decode):
        start = time.perf_counter()
        out = session.step(token)
        steps.append(time.perf_counter() - start)
        token = out["logits"][:, -1].argmax(-1)[:, None]
    return {
        "session_create_s": created,
        "session_rss_mib": after_session,
        "prefill_ms": prefill_s * 1e3,
        "decode_ms_per_token": statistics.median(steps[1:]) * 1e3,
        "peak_rss_mib": peak_rss_mib(),
    }


def run_ort(package: Path, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", str(package), "--threads", str(args.threads)]
    cmd += ["--prompt-length", str(args.prompt_length), "--decode-tokens", str(args.decode_tokens)]
    cmd += ["--repeats", str(args.repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_llamacpp(path: Path, prompt: np.ndarray, args: argparse.Namespace) -> dict:
    import llama_cpp

    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=args.threads,
        n_threads_batch=args.threads, verbose=False,
    )  # fmt: skip
    loaded = time.perf_counter() - start
    ids = [int(t) for t in prompt[0]]

    def prefill():
        llm.reset()
        llm.eval(ids)

    prefill()
    prefill_s = median_time(prefill, args.repeats)
    token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    steps = []
    for _ in range(args.decode_tokens):
        start = time.perf_counter()
        llm.eval([token])
        steps.append(time.perf_counter() - start)
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
    return {
        "load_s": loaded,
        "prefill_ms": prefill_s * 1e3,
        "decode_ms_per_token": statistics.median(steps[1:]) * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gguf"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--types", default="Q8_0,Q4_K_M,IQ2_XXS")
    parser.add_argument(
        "--routes",
        default="",
        help="comma-separated subset of standard, ort, dequantize, dequantize+ort (default: all)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    prompt = np.random.default_rng(0).integers(3, 400, size=(1, args.prompt_length))
    if args.child is not None:
        result = ort_child(args.child, prompt, args.decode_tokens, args.threads, args.repeats)
        print(json.dumps(result))
        return

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    files = write_files(args.workdir, args.types.split(","))
    results: dict[str, Any] = {
        "command": " ".join(["python benchmarks/bench_gguf.py", *sys.argv[1:]]),
        "config": f"mid without dense MLP layers ({PATTERN}), nemotron_h_moe",
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "decode_tokens": args.decode_tokens,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "files": {},
    }
    for name, path in files.items():
        entry: dict[str, Any] = {**gguf_facts(path), "routes": {}}
        routes = {"standard": [], "ort": ["--backend", "ort"]} if name == "F32" else {
            "standard": [], "ort": ["--backend", "ort"], "dequantize": ["--dequantize"],
            "dequantize+ort": ["--dequantize", "--backend", "ort"],
        }  # fmt: skip
        wanted = set(args.routes.split(",")) if args.routes else set(routes)
        for route, flags in routes.items():
            if route not in wanted:
                continue
            package = args.workdir / f"pkg-{name}-{route}"
            entry["routes"][route] = {
                **timed_export(path, package, flags),
                **run_ort(package, args),
            }
            shutil.rmtree(package)
            print(name, route, json.dumps(entry["routes"][route]), flush=True)
        entry["llamacpp"] = run_llamacpp(path, prompt, args)
        print(name, "llama.cpp", json.dumps(entry["llamacpp"]), flush=True)
        results["files"][name] = entry
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
