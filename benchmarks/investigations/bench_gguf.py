r"""GGUF export benchmark (issue 10): the mid nemotron_h_moe model as F32, Q8_0, Q4_K_M and
IQ2_XXS GGUF (and, with --types, llama.cpp's MXFP4_MOE / TQ1_0 / TQ2_0 / Q1_0 presets, and
NVFP4: every projection as the converter writes a ModelOpt NVFP4 checkpoint, with its `.scale`
sidecars, Q8_0 elsewhere; issue 28 compares its int8 route with llama.cpp on the Q8_0 file;
and Q4_0: llama.cpp's `--pure` Q4_0), exported per weight route and run on onnxruntime CPU next
to llama.cpp; with the safetensors+ort and quantize-* routes (issue 28), also the same model
as a safetensors checkpoint built plain or with `mobius build --quantize TYPE`, timed next to
llama.cpp on its own F32 / Q4_0 / Q8_0 file of those weights (docs/cpu_routes.md is the
table these runs fill).

One run:
  1. builds common.py (MID)'s mid config without its dense MLP layers (llama.cpp builds every
     nemotron_h_moe FFN layer as MoE) as a random transformers model, writes it as an F32 GGUF
     in the converter's layout (reference_fixtures/gguf_fixtures.py) and quantizes it with
     llama.cpp's own quantizer to Q8_0 and Q4_K_M (the presets, fallbacks included); IQ2_XXS
     needs an importance matrix in llama.cpp, so that file is written by the fixtures (random
     valid IQ2_XXS blocks, IQ4_NL / F16 where rows do not hold whole 256-element blocks);
     with a route built from the checkpoint, the same model also as a safetensors checkpoint
     (save_pretrained, F32: the source of `--quantize`);
  2. per file and route (standard, ort = --backend ort, --dequantize, and --dequantize with
     --backend ort; F32 files have no packed weights: standard and ort only): `mobius build`
     wall time and peak RSS (/usr/bin/time -v), package weight bytes and package bytes (every
     file of the package), then in a fresh process: session creation time and the RSS it
     added (session_rss_mib), prefill of --prompt-length tokens and decode ms/token
     (medians), and that process's peak RSS;
  3. llama.cpp (llama_cpp.Llama) on the same file with the same thread count, in a fresh
     process too: load time and the RSS it added (load_rss_mib), prefill and decode
     ms/token, that process's peak RSS; the file's bytes (file_bytes). With --rounds N every
     route's process and llama.cpp run N times, in rotating order, after all of the file's
     exports (synced to disk); medians.
  4. accuracy beside speed (issue 22): every route's greedy tokens and logits against the
     exact `ort` route of the same file (the f32 reference on the same weights; for a route
     built from the checkpoint, on the llama.cpp file's weights): prefill last-position NRMSE
     / cosine, tokens equal, and at the first disagreement the exact route's top-2 logit margin
     (vs_exact_ort); and the same against the source, the F32 file's `ort` route
     (vs_source: the error of the quantization and the kernels together); llama.cpp's tokens
     and logits both ways.

Routes (--routes, comma-separated; F32 files have no packed weights, so only the ones marked *):
  standard*          mobius build (standard ONNX ops)
  ort*               --backend ort (today's CPU route: the exact reference of the comparison)
  dequantize         --dequantize
  dequantize+ort     --dequantize --backend ort
  ort+exact-fused*   --backend ort --activations exact-fused (MatMulNBits at accuracy 0 over the
                     exact re-layouts, experts on MoE / QMoE in the SwiGLU form of ReLU^2)
  ort+int8           --backend ort --activations int8 (int8 activations, llama.cpp's accuracy)
Built from the safetensors checkpoint (with `--quantize`: docs/quantize.md), each beside
llama.cpp on the file named (which must be in --types; F32 always is):
  safetensors+ort*   --backend ort (the plain f32 build of the source)                 (F32)
  quantize-q8_0+int8 --quantize q8_0 --backend ort --activations int8          (Q8_0)
  quantize-q4_0+ort  --quantize q4_0 --backend ort                             (Q4_0)
  quantize-q4_0+int8 --quantize q4_0 --backend ort --activations int8          (Q4_0)
  quantize-int8+ort  --quantize int8 --backend ort   (onnxruntime-genai style)  (Q8_0)
  quantize-int8+int8 --quantize int8 --backend ort --activations int8          (Q8_0)
  quantize-int4+ort  --quantize int4 --backend ort                             (Q4_0)
  quantize-int4+exact-fused  --quantize int4 --backend ort --activations exact-fused
                     (int4 experts on QMoE at f32 activations)                  (Q4_0)
  quantize-int4+int8 --quantize int4 --backend ort --activations int8          (Q4_0)
  quantize-int4asym+ort   --quantize int4 --quantize-asymmetric --backend ort   (Q4_0)
  quantize-int4asym+int8  --quantize int4 --quantize-asymmetric --backend ort
                     --activations int8 (uint8 zero points per block)          (Q4_0)

--profile adds onnxruntime's per-node profile of the decode steps (SessionOptions.
enable_profiling; exclusive kernel time by op type, by layer kind / op, and the MoE layers'
nodes: profile_decoder.py's aggregation) for each route run.

Usage:
    python benchmarks/investigations/bench_gguf.py --workdir /tmp/bench_gguf --threads 2 \
        --json benchmarks/investigations/runs/bench_gguf.json
    python benchmarks/investigations/bench_gguf.py --types Q8_0,Q4_K_M,IQ2_XXS \
        --routes ort,dequantize+ort,ort+exact-fused,ort+int8 --json /tmp/bench_gguf_22.json
    python benchmarks/investigations/bench_gguf.py --types F32 --routes ort,ort+exact-fused \
        --profile
    python benchmarks/investigations/bench_gguf.py --config tiny --without-llamacpp --types Q8_0 \
        --routes ort,ort+int8 --repeats 1 --decode-tokens 3 --prompt-length 16   # smoke run
    # a smoke run with llama.cpp (--llamacpp-no-extra-bufts where its batches crash)
    python benchmarks/investigations/bench_gguf.py --config tiny --types Q8_0,Q4_0 \
        --routes ort,ort+int8,safetensors+ort,quantize-int8+int8,quantize-int4+int8 \
        --repeats 1 --decode-tokens 3 --prompt-length 16 --llamacpp-no-extra-bufts
    # docs/cpu_routes.md's table, every row in one run (a quiet machine)
    python benchmarks/investigations/bench_gguf.py --workdir /tmp/bench_cpu_routes --threads 2 \
        --types Q8_0,Q4_0,Q4_K_M,IQ2_XXS,MXFP4_MOE,NVFP4 --rounds 3 --decode-tokens 32 \
        --routes ort,ort+int8,safetensors+ort,quantize-q8_0+int8,quantize-q4_0+ort,\
quantize-q4_0+int8,quantize-int8+ort,quantize-int8+int8,quantize-int4+ort,\
quantize-int4+exact-fused,quantize-int4+int8 \
        --json benchmarks/investigations/runs/bench_cpu_routes.json
    # int4 asymmetric's error against q4_0's and int4's (no llama.cpp: the errors, and the
    # int8 routes' times beside each other)
    python benchmarks/investigations/bench_gguf.py --workdir /tmp/bench_int4asym --threads 2 \
        --without-llamacpp --types Q4_0 --rounds 3 --decode-tokens 16 --repeats 2 \
        --routes ort,quantize-q4_0+ort,quantize-q4_0+int8,quantize-int4+ort,quantize-int4+int8,\
quantize-int4asym+ort,quantize-int4asym+int8 \
        --json benchmarks/investigations/runs/bench_int4asym_error.json
"""

from __future__ import annotations

import argparse
import json
import os
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from common import (  # noqa: E402
    CORPUS,
    MID,
    TINY,
    cpu_description,
    median_time,
    open_package,
    timed_decode,
    timed_export,
)

from mobius_lite.bench.package_peer import session_options  # noqa: E402
from mobius_lite.bench.workdir import claim_workdir, release_workdir  # noqa: E402
from mobius_lite.layout import MANIFEST_FILE  # noqa: E402

ROUTES: dict[str, list[str]] = {
    "standard": [],
    "ort": ["--backend", "ort"],
    "dequantize": ["--dequantize"],
    "dequantize+ort": ["--dequantize", "--backend", "ort"],
    "ort+exact-fused": ["--backend", "ort", "--activations", "exact-fused"],
    "ort+int8": ["--backend", "ort", "--activations", "int8"],
    "safetensors+ort": ["--backend", "ort"],
    "quantize-q8_0+int8": ["--quantize", "q8_0", "--backend", "ort", "--activations", "int8"],
    "quantize-q4_0+ort": ["--quantize", "q4_0", "--backend", "ort"],
    "quantize-q4_0+int8": ["--quantize", "q4_0", "--backend", "ort", "--activations", "int8"],
    "quantize-int8+ort": ["--quantize", "int8", "--backend", "ort"],
    "quantize-int8+int8": ["--quantize", "int8", "--backend", "ort", "--activations", "int8"],
    "quantize-int4+ort": ["--quantize", "int4", "--backend", "ort"],
    "quantize-int4+exact-fused": ["--quantize", "int4", "--backend", "ort"]
    + ["--activations", "exact-fused"],
    "quantize-int4+int8": ["--quantize", "int4", "--backend", "ort", "--activations", "int8"],
    "quantize-int4asym+ort": ["--quantize", "int4", "--quantize-asymmetric", "--backend", "ort"],
    "quantize-int4asym+int8": ["--quantize", "int4", "--quantize-asymmetric", "--backend", "ort"]
    + ["--activations", "int8"],
}
F32_ROUTES = ("standard", "ort", "ort+exact-fused", "safetensors+ort")
REFERENCE_ROUTE = "ort"
SOURCE_FILE = "F32"  # its REFERENCE_ROUTE is the source's logits (vs_source)
# the routes built from the safetensors checkpoint, each timed beside llama.cpp on this file
FROM_CHECKPOINT = {"safetensors+ort": "F32"} | {
    route: "Q8_0" if flags[1] in ("q8_0", "int8") else "Q4_0"
    for route, flags in ROUTES.items()
    if route.startswith("quantize-")
}
CHECKPOINT = "mid-safetensors"  # the checkpoint directory in the workdir

PATTERN = "ME*MEME*ME"
KINDS = {"M": "mamba", "E": "moe", "*": "attention"}


def mid_moe(size: str = "mid") -> dict[str, Any]:
    return {**(TINY if size == "tiny" else MID), "layers_block_type": [KINDS[c] for c in PATTERN]}


def write_files(
    workdir: Path,
    names: list[str],
    size: str = "mid",
    llamacpp: bool = True,
    checkpoint: bool = False,
) -> dict[str, Path]:
    """The F32 file and its quantizations (and with `checkpoint`, the safetensors checkpoint
    of the same model at workdir / CHECKPOINT); without llama.cpp, Q8_0 and Q4_0 are gguf-py's
    quantizations (the same block definitions, bit for bit) and Q4_K_M is skipped (it needs
    llama.cpp's quantizer)."""
    import torch

    from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, write_gguf
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference(mid_moe(size), seed=0)
    with torch.no_grad():  # spread router scores so routing is not degenerate
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.weight.normal_(0.0, 0.05)
    tokenizer = build_bpe_tokenizer(CORPUS, vocab_size=400)
    special = {"pad": 0, "bos": 1, "eos": 2}
    f32 = write_gguf(
        workdir / "mid-F32.gguf", model, "nemotron_h_moe", {}, tokenizer, special_tokens=special
    )[0]
    files = {"F32": f32}
    if checkpoint:
        model.save_pretrained(workdir / CHECKPOINT)
    ftypes = {}
    if llamacpp:
        import llama_cpp

        # the presets; issue 20's FP4 / ternary / 1-bit file types where the binding has them
        presets = ("Q8_0", "Q4_0", "Q4_K_M", "MXFP4_MOE", "TQ1_0", "TQ2_0", "Q1_0")
        ftypes = {
            name: getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
            for name in presets
            if hasattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}")
        }
    for name in names:
        out = workdir / f"mid-{name}.gguf"
        if name in ("Q8_0", "Q4_0") and not llamacpp:
            types = {r"\.weight$": name}
            write_gguf(out, model, "nemotron_h_moe", types, tokenizer, special_tokens=special)
        elif name in ftypes:
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype, params.nthread = ftypes[name], 2
            # Q4_0 as llama-quantize --pure: the file `--quantize q4_0` equals (docs/quantize.md)
            params.pure = name == "Q4_0"
            if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params):
                raise RuntimeError(f"llama.cpp could not quantize to {name}")
        elif name == "IQ2_XXS":
            types = {r"\.weight$": "IQ2_XXS"}
            write_gguf(out, model, "nemotron_h_moe", types, tokenizer, special_tokens=special)
        elif name == "NVFP4":
            write_nvfp4(out, model, tokenizer, special)
        else:
            print(f"{name}: not written (needs llama.cpp's quantizer)", flush=True)
            continue
        files[name] = out
    del model
    return files


# the projections llama.cpp's converter writes NVFP4 from a ModelOpt NVFP4 checkpoint
NVFP4_WEIGHTS = r"(ssm_(in|out)|attn_(q|k|v|output)|ffn_(up|down)(_exps|_shexp)?)\.weight$"


def write_nvfp4(out: Path, model: Any, tokenizer: Any, special: dict[str, int]) -> None:
    """The NVFP4 file (module doc): ModelOpt's quantization of each projection whose rows hold
    whole 64-element superblocks, repacked as the converter does, with its `.scale` ([E] for
    stacked experts); Q8_0 for every other matrix."""
    from reference_fixtures.gguf_fixtures import converter_tensors, write_gguf
    from reference_fixtures.gguf_nvfp4_fixtures import quantized_nvfp4

    packed, sidecars = {}, {}
    for name, values in converter_tensors(model, "nemotron_h_moe").items():
        if not re.search(NVFP4_WEIGHTS, name) or values.shape[-1] % 64:
            continue
        stem = name.removesuffix(".weight")
        parts = [quantized_nvfp4(v) for v in values.reshape(-1, *values.shape[-2:])]
        rows = np.stack([p[0] for p in parts]).reshape(*values.shape[:-1], -1)
        packed[name] = (rows, "NVFP4")
        sidecars[stem + ".scale"] = np.array([p[1] for p in parts], np.float32)
    types = {r"\.weight$": "Q8_0"}
    write_gguf(
        out,
        model,
        "nemotron_h_moe",
        types,
        tokenizer,
        special_tokens=special,
        packed=packed,
        extra_tensors=sidecars,
    )


def gguf_facts(path: Path, size: str) -> dict[str, Any]:
    import gguf

    tensors = gguf.GGUFReader(path).tensors
    mix: dict[str, int] = {}
    for t in tensors:
        mix[t.tensor_type.name] = mix.get(t.tensor_type.name, 0) + int(t.n_bytes)
    return {
        "file_bytes": path.stat().st_size,
        "tensor_bytes": sum(int(t.n_bytes) for t in tensors),
        "bytes_by_type": mix,
        "token_bytes": gguf_token_bytes(path, size),
    }


# What one decode token reads of the weights: every matrix whole, but the routed experts
# (top_k of n_routed_experts) and the embedding table (one row).
GGUF_EXPERTS = re.compile(r"\.ffn_(up|down|gate)_exps\.")
PACKAGE_EXPERTS = re.compile(r"\.mixer\.experts\.")
EMBEDDINGS = re.compile(r"(token_embd|embeddings)\.weight")


def token_bytes(
    tensors: list[tuple[str, tuple[int, ...], int]], experts: re.Pattern[str], size: str
) -> int:
    """The weight bytes one decode token reads (above), from (name, shape, bytes) rows."""
    config = mid_moe(size)
    share = config["num_experts_per_tok"] / config["n_routed_experts"]
    total = 0.0
    for name, shape, size in tensors:
        if experts.search(name):
            total += size * share
        elif EMBEDDINGS.search(name):
            total += size / max(shape) if shape else size
        else:
            total += size
    return round(total)


def gguf_token_bytes(path: Path, size: str) -> int:
    """token_bytes of a GGUF file, from gguf-py's tensor table."""
    import gguf

    tensors = gguf.GGUFReader(path).tensors
    rows = [(t.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in tensors]
    return token_bytes(rows, GGUF_EXPERTS, size)


def package_token_bytes(package: Path, size: str) -> int:
    """token_bytes of a package's decoder, from its manifest's initializer table."""
    import onnx

    manifest = json.loads((package / MANIFEST_FILE).read_text())
    initializers = manifest["graphs"]["decoder"]["initializers"]
    rows = []
    for name, entry in initializers.items():
        shape = tuple(entry["shape"])
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(
            getattr(onnx.TensorProto, entry["dtype"])
        ).itemsize
        rows.append((name, shape, int(np.prod(shape, dtype=np.int64)) * itemsize))
    return token_bytes(rows, PACKAGE_EXPERTS, size)


def directory_bytes(path: Path) -> int:
    """Every file's bytes under `path` (a package: graphs, external data, manifest)."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as handle:
        line = next(x for x in handle if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def ort_child(
    package: Path,
    prompt: np.ndarray,
    decode: int,
    threads: int,
    repeats: int,
    logits_out: Path | None = None,
    profile: bool = False,
) -> dict:
    """Run in a fresh process (--child): session creation, prefill, decode; peak RSS; the
    greedy tokens (and every step's logits to `logits_out`); with `profile`, a per-node
    profile of `decode` further steps."""

    before = rss_mib()
    session, created = open_package(package, session_options(threads))
    after_session = rss_mib() - before

    def prefill():
        session.reset(1)  # last position's logits only, as llama.cpp computes
        return session.step(prompt, logits_to_keep=1)

    prefill()
    prefill_s = median_time(prefill, repeats)
    first = prefill()["logits"]
    logits = [first[0, -1]]
    decoded = timed_decode(session, first, decode, lambda out: logits.append(out["logits"][0, -1]))
    tokens = [int(first[0, -1].argmax()), *decoded.tokens]
    token = np.array([[tokens[-1]]], dtype=np.int64)
    if logits_out is not None:
        np.save(logits_out, np.stack(logits))
    result = {
        "session_create_s": created,
        "session_rss_mib": after_session,
        "prefill_ms": prefill_s * 1e3,
        "decode_ms_per_token": decoded.median_after_first * 1e3,
        "peak_rss_mib": peak_rss_mib(),
        "tokens": tokens,
    }
    if profile:
        result["decode_profile"] = decode_profile(package, session, token, decode, threads)
    return result


def decode_profile(package: Path, plain: Any, token: np.ndarray, calls: int, threads: int) -> dict:
    """onnxruntime's profiler over `calls` decode steps continuing `plain`'s sequence:
    exclusive kernel time per op type, per layer kind / op, and the MoE layers' top nodes."""
    import tempfile

    from profile_decoder import breakdown, kernel_events, last_calls, top_level_names

    with tempfile.TemporaryDirectory() as tmp:
        options = session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "decode")
        session, _ = open_package(package, options)
        session.past, session.mask = dict(plain.past), plain.mask.copy()
        for _ in range(calls + 1):  # the first call's allocations stay out of the figure
            token = session.step(token)["logits"][:, -1].argmax(-1)[:, None]
        events = last_calls(kernel_events(Path(session.session.end_profiling())), calls)
    result = breakdown(events, PATTERN, top_level_names(package), calls)
    moe_nodes: dict[str, float] = {}
    for e in events:
        layer = e["node"].split("/mixer/")[0] if "/mixer/" in e["node"] else ""
        if any(f"layers.{i}" in layer for i, c in enumerate(PATTERN) if c == "E"):
            key = f"{e['op']} {e['node'].split('/mixer/', 1)[1]}"
            moe_nodes[key] = moe_nodes.get(key, 0.0) + e["us"] / 1000 / calls
    top = sorted(moe_nodes.items(), key=lambda kv: -kv[1])[:20]
    result["moe_nodes"] = [{"name": k, "ms": v} for k, v in top]
    return result


LLAMACPP = "llama.cpp"
TIMED = ("prefill_ms", "decode_ms_per_token")


def median_of_rounds(runs: list[dict]) -> dict[str, Any]:
    """One side's runs (rounds) as the first run's facts with the timings' medians, and
    every round's timings under "rounds" with the 1-minute load average before it (one round
    too: the load is the context of every timing)."""
    out = {key: value for key, value in runs[0].items() if key != "load_1min"}
    for key in TIMED:
        out[key] = statistics.median(run[key] for run in runs)
    out["rounds"] = [{key: run[key] for key in (*TIMED, "load_1min")} for run in runs]
    return out


def compare_to_reference(
    logits: np.ndarray, tokens: list[int], reference: np.ndarray, reference_tokens: list[int]
) -> dict[str, Any]:
    """A route's accuracy against the exact route: prefill last-position logits (NRMSE,
    cosine), greedy tokens equal, and the exact route's top-2 margin where they first part."""
    from mobius_lite.evaluation.metrics import compare

    result = compare("prefill logits", logits[0], reference[0])
    equal = 0
    while equal < min(len(tokens), len(reference_tokens)):
        if tokens[equal] != reference_tokens[equal]:
            break
        equal += 1
    out: dict[str, Any] = {
        "prefill_nrmse": result.nrmse,
        "prefill_cosine": result.cosine,
        "tokens_equal": f"{equal} of {len(reference_tokens)}",
    }
    if equal < len(reference_tokens):
        top2 = np.sort(reference[equal])[-2:]
        out["first_disagreement"] = {
            "step": equal,
            "exact_top2_margin": float(top2[1] - top2[0]),
            "logit_deviation": float(np.abs(logits[equal] - reference[equal]).max()),
        }
    return out


def run_ort(package: Path, args: argparse.Namespace, logits_out: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", str(package), "--threads", str(args.threads)]
    cmd += ["--prompt-length", str(args.prompt_length), "--decode-tokens", str(args.decode_tokens)]
    cmd += [
        "--repeats",
        str(args.repeats),
        "--logits-out",
        str(logits_out),
        "--config",
        args.config,
    ]
    cmd += ["--profile"] if args.profile else []
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def llamacpp_timed_with_logits(path: Path, prompt: np.ndarray, args: argparse.Namespace) -> dict:
    import llama_cpp

    if args.llamacpp_no_extra_bufts:  # Llama() takes its model params from this function
        import llama_cpp.llama_cpp as binding

        defaults = binding.llama_model_default_params

        def without_extra_bufts() -> Any:
            params = defaults()
            params.use_extra_bufts = False
            return params

        binding.llama_model_default_params = without_extra_bufts
    before = rss_mib()
    start = time.perf_counter()
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=args.threads,
        n_threads_batch=args.threads, verbose=False,
    )  # fmt: skip
    loaded = time.perf_counter() - start
    load_rss = rss_mib() - before
    ids = [int(t) for t in prompt[0]]

    def prefill():
        llm.reset()
        llm.eval(ids)

    def last_logits() -> np.ndarray:
        # the context's own output row: llama-cpp-python 0.3.36 fills `scores` only with
        # logits_all, which would make llama.cpp compute every prefill position's logits
        row = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()

    prefill()
    prefill_s = median_time(prefill, args.repeats)
    logits = [last_logits()]
    tokens, steps = [int(np.argmax(logits[-1]))], []
    for _ in range(args.decode_tokens):
        start = time.perf_counter()
        llm.eval([tokens[-1]])
        steps.append(time.perf_counter() - start)
        logits.append(last_logits())
        tokens.append(int(np.argmax(logits[-1])))
    np.save(args.workdir / "llamacpp-logits.npy", np.stack(logits))
    return {
        "load_s": loaded,
        "load_rss_mib": load_rss,
        "use_extra_bufts": bool(llm.model_params.use_extra_bufts),
        "prefill_ms": prefill_s * 1e3,
        "decode_ms_per_token": statistics.median(steps[1:]) * 1e3,
        "peak_rss_mib": peak_rss_mib(),
        "tokens": tokens,
    }


def run_llamacpp(path: Path, args: argparse.Namespace) -> dict:
    """llamacpp_timed_with_logits in a fresh process (--llamacpp-child), as every route runs:
    its RSS is llama.cpp's own, not this process's (which holds the model it wrote). A crash
    is recorded as {"error": ...} and the run goes on (llama-cpp-python 0.3.36 built here
    segfaults on multi-token batches of Q8_0 / Q4_0 files, tiny and mid, unless
    --llamacpp-no-extra-bufts)."""
    cmd = [sys.executable, __file__, "--llamacpp-child", str(path), "--threads", str(args.threads)]
    cmd += ["--prompt-length", str(args.prompt_length), "--decode-tokens", str(args.decode_tokens)]
    cmd += ["--repeats", str(args.repeats), "--workdir", str(args.workdir)]
    cmd += ["--llamacpp-no-extra-bufts"] if args.llamacpp_no_extra_bufts else []
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        return {"error": f"llama.cpp exited with {proc.returncode}: {proc.stderr[-400:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_gguf"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="time every route and llama.cpp this many times per file, in rotating order, "
        "each in a fresh process (medians reported, every round kept; default: %(default)s)",
    )
    parser.add_argument("--types", default="Q8_0,Q4_K_M,IQ2_XXS")
    parser.add_argument(
        "--routes",
        default="",
        help=f"comma-separated subset of {', '.join(ROUTES)} (default: the first four; the "
        "module doc says what each is)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="add onnxruntime's per-node profile of the decode steps to every route run",
    )
    parser.add_argument(
        "--config", choices=["mid", "tiny"], default="mid", help="tiny: a smoke-run size"
    )
    parser.add_argument(
        "--without-llamacpp",
        action="store_true",
        help="no llama.cpp side (Q8_0 written by gguf-py, Q4_K_M skipped): smoke runs only",
    )
    parser.add_argument(
        "--llamacpp-no-extra-bufts",
        action="store_true",
        help="llama.cpp without its extra CPU buffer types (use_extra_bufts=False: no repacked "
        "or AMX copies of the weights): where its batches crash (a llama.cpp error in the JSON)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--logits-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--llamacpp-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    prompt = np.random.default_rng(0).integers(3, 400, size=(1, args.prompt_length))
    if args.child is not None:
        result = ort_child(
            args.child,
            prompt,
            args.decode_tokens,
            args.threads,
            args.repeats,
            args.logits_out,
            args.profile,
        )
        print(json.dumps(result))
        return
    if args.llamacpp_child is not None:
        print(json.dumps(llamacpp_timed_with_logits(args.llamacpp_child, prompt, args)))
        return

    asked = set(filter(None, args.routes.split(",")))
    unknown = asked - set(ROUTES)
    if unknown:
        parser.error(f"unknown routes {sorted(unknown)}; choose from {', '.join(ROUTES)}")
    types = args.types.split(",")
    for route in sorted(asked & set(FROM_CHECKPOINT)):
        if FROM_CHECKPOINT[route] not in (SOURCE_FILE, *types):
            parser.error(f"{route} is timed beside {FROM_CHECKPOINT[route]}: add it to --types")
    checkpoint = bool(asked & set(FROM_CHECKPOINT))
    claim_workdir(args.workdir)
    files = write_files(args.workdir, types, args.config, not args.without_llamacpp, checkpoint)
    results: dict[str, Any] = {
        "command": " ".join(["python benchmarks/investigations/bench_gguf.py", *sys.argv[1:]]),
        "config": f"{args.config} without dense MLP layers ({PATTERN}), nemotron_h_moe",
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "decode_tokens": args.decode_tokens,
        "machine": cpu_description(),
        "files": {},
    }
    source: tuple[np.ndarray, list[int]] | None = None  # the F32 file's ort logits and tokens
    for name, path in files.items():
        entry: dict[str, Any] = {**gguf_facts(path, args.config), "routes": {}}
        default = list(ROUTES)[:4]
        wanted = set(args.routes.split(",")) if args.routes else set(default)
        routes = [
            r
            for r in ROUTES
            if r in wanted
            and (name != "F32" or r in F32_ROUTES)
            and FROM_CHECKPOINT.get(r, name) == name
        ]
        # the exact reference first, so every other route compares with it
        routes.sort(key=lambda r: r != REFERENCE_ROUTE)
        logits: dict[str, np.ndarray] = {}
        packages = {route: args.workdir / f"pkg-{name}-{route}" for route in routes}
        for route in routes:
            model = args.workdir / CHECKPOINT if route in FROM_CHECKPOINT else path
            entry["routes"][route] = {
                "command": " ".join(["mobius build --model", model.name, *ROUTES[route]]),
                **timed_export(model, packages[route], ROUTES[route]),
                "package_bytes": directory_bytes(packages[route]),
                "token_bytes": package_token_bytes(packages[route], args.config),
            }
        os.sync()  # the exports' pages reach the disk before any timing starts
        sides = [*routes, *([] if args.without_llamacpp else [LLAMACPP])]
        rounds: dict[str, list[dict]] = {side: [] for side in sides}
        for index in range(args.rounds if sides else 0):  # a file with nothing to run
            for side in sides[index % len(sides) :] + sides[: index % len(sides)]:
                if side == LLAMACPP:
                    run = run_llamacpp(path, args)
                else:
                    out = args.workdir / f"logits-{name}-{side}.npy"
                    run = run_ort(packages[side], args, out)
                    logits.setdefault(side, np.load(out))
                rounds[side].append({**run, "load_1min": os.getloadavg()[0]})
        if name == SOURCE_FILE and REFERENCE_ROUTE in logits:
            source = logits[REFERENCE_ROUTE], rounds[REFERENCE_ROUTE][0]["tokens"]
        for route in routes:
            entry["routes"][route].update(median_of_rounds(rounds[route]))
            shutil.rmtree(packages[route])
            if REFERENCE_ROUTE in logits and route != REFERENCE_ROUTE:
                entry["routes"][route]["vs_exact_ort"] = compare_to_reference(
                    logits[route],
                    entry["routes"][route]["tokens"],
                    logits[REFERENCE_ROUTE],
                    entry["routes"][REFERENCE_ROUTE]["tokens"],
                )
            if source is not None and (name, route) != (SOURCE_FILE, REFERENCE_ROUTE):
                entry["routes"][route]["vs_source"] = compare_to_reference(
                    logits[route], entry["routes"][route]["tokens"], *source
                )
            print(name, route, json.dumps(entry["routes"][route]), flush=True)
        failed = [run for run in rounds.get(LLAMACPP, []) if "error" in run]
        if failed:
            entry["llamacpp"] = {"error": failed[0]["error"]}
            print(name, "llama.cpp", failed[0]["error"], flush=True)
        elif not args.without_llamacpp:
            entry["llamacpp"] = median_of_rounds(rounds[LLAMACPP])
            llamacpp_logits = np.load(args.workdir / "llamacpp-logits.npy")
            if REFERENCE_ROUTE in logits:
                entry["llamacpp"]["vs_exact_ort"] = compare_to_reference(
                    llamacpp_logits,
                    entry["llamacpp"]["tokens"],
                    logits[REFERENCE_ROUTE],
                    entry["routes"][REFERENCE_ROUTE]["tokens"],
                )
            if source is not None:
                entry["llamacpp"]["vs_source"] = compare_to_reference(
                    llamacpp_logits, entry["llamacpp"]["tokens"], *source
                )
            print(name, "llama.cpp", json.dumps(entry["llamacpp"]), flush=True)
        results["files"][name] = entry
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    release_workdir(args.workdir)


if __name__ == "__main__":
    main()
