r"""The GPU check: every CUDA route this checkout builds, on one GPU, one verdict line each.

Routes (each line starts PASS, FAIL, SKIP or, in a dry run, BUILT):
- parity, f16 and bf16, of each package kind built for --ep cuda (standard backend): the demo
  checkpoints (text, moe, puzzle, mtp, omni; gguf: the demo's Q8_0 file), ModelOpt NVFP4 and
  FP8 checkpoints (reference_fixtures/modelopt_fixtures.py), against the f32 package of the
  same source on the CPU: prefill and 4 decode calls fed the reference's tokens, every logit
  within the release gates (NRMSE <= 0.03, cosine >= 0.999); an Omni package also its vision
  encoder's output;
- the packed kernels (--backend ort): GGUF Q8_0 on MatMulNBits (f16) and on MatMulPacked
  (bf16), ModelOpt NVFP4 on MatMulBlockQuantizedFp4Weight and FP8 on
  MatMulBlockQuantizedFp8Weight (f16 and bf16), against the same f32 reference;
- `--quantize int4 | int8` (f16, --backend ort: MatMulNBits with f16 activations and scales,
  symmetric and asymmetric) against the same quantization built for the CPU in f32, same
  greedy tokens required;
- the speculation windows of onnxruntime's `state_window` attribute (issue 29,
  docs/speculative.md) on the demo MTP checkpoint, against the scan route: every present
  after a 5-position call and every window slot against the scan route's states rewound from
  its window inputs (FP32 gates), then speculative greedy decoding on both routes at K = 4
  with a scripted drafter wrong at every fifth position, batch 1 and 2: tokens identical to
  plain decoding, rejections cut back from the windows or the window inputs (no re-run),
  final states equal;
- `mobius generate` run as a command (the decoder and head on onnxruntime's shared thread
  pool) on the demo MTP checkpoint built for --ep cuda, f16: the same tokens with and without
  `--speculative 2`;
- decode speed: the mid model without MLP layers (benchmarks/common.py) in f16 and bf16 on
  the GPU, through mobius_lite.bench (prompt 128, 32 decode calls, 3 rounds): ms/token.

The exit status is 1 when any route fails. Without a GPU (no CUDAExecutionProvider, or no
device) it prints one line and exits 0. `--cpu-dry-run` builds every package the GPU run
builds and runs the same checks on CPUExecutionProvider where the CPU has the kernels (f16
standard graphs; bf16 graphs, the CUDA-only contrib kernels and the state_window kernel are
BUILT: made and loaded as files, not run); its speed line times the tiny widths. A GPU run
takes at most 8 minutes (the builds dominate); each line ends with its seconds.

Usage:
    python benchmarks/gpu_check.py [--workdir /tmp/gpu_check] [--only SUBSTRING ...]
    python benchmarks/gpu_check.py --cpu-dry-run
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from common import make_checkpoint

from mobius_lite.bench.workdir import claim_workdir, release_workdir
from mobius_lite.evaluation.metrics import (
    FP32_COSINE,
    FP32_NRMSE,
    RELEASE_COSINE,
    RELEASE_NRMSE,
    compare,
)
from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the root: reference_fixtures

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]
DTYPES = ("f16", "bf16")
DEMO_KINDS = ("text", "moe", "puzzle", "mtp", "omni", "gguf")
MODELOPT_KINDS = ("nvfp4", "fp8")
STEPS = 4  # decode calls after the prefill in a parity run
PROMPT = 12
# a tiny Nemotron-H whose rows hold whole blocks of 32 to 128 elements (--quantize)
TINY = {
    "vocab_size": 256,
    "hidden_size": 256,
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "ssm_state_size": 16,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 16,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "moe_shared_expert_intermediate_size": 128,
    "n_group": 1,
    "topk_group": 1,
}
QUANTIZE_ROUTES: dict[str, dict[str, Any]] = {
    "int4": {"quantize": "int4"},
    "int4-asym": {"quantize": "int4", "quantize_asymmetric": True},
    "int8-b64": {"quantize": "int8", "quantize_block_size": 64},
}
SPECULATION_TOKENS = 32
SPEED = {"prompt": 128, "decode": 32, "rounds": 3}
# what onnxruntime's CPU provider says when a graph holds an op or type it has no kernel for
NO_CPU_KERNEL = (
    "NOT_IMPLEMENTED",
    "Could not find an implementation",
    "bfloat16",
    "BFloat16",
    "does not support state_window > 0",
)


class NoKernelHere(Exception):
    """The dry run's CPU provider cannot run this graph (bf16, a CUDA-only kernel)."""


def cuda_available() -> str | None:
    """None when a CUDA device runs onnxruntime, else why not (one sentence)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return f"onnxruntime {ort.__version__} has no CUDAExecutionProvider"
    try:
        import torch

        if not torch.cuda.is_available():
            return "torch sees no CUDA device"
    except ImportError:
        pass
    return None


# ----------------------------------------------------------------------------- the run
@dataclass
class Run:
    """The workdir, where the routes run (the GPU, or the CPU in a dry run), and every source
    and package made so far (a package is built once and shared by the routes needing it)."""

    workdir: Path
    dry_run: bool
    sources: dict[str, Path] = field(default_factory=dict)
    packages: dict[str, Path] = field(default_factory=dict)

    @property
    def providers(self) -> list[str]:
        return CPU if self.dry_run else CUDA

    def source(self, kind: str) -> Path:
        """The checkpoint (or GGUF file) of `kind`, written on first use."""
        if kind not in self.sources:
            self.sources[kind] = write_source(kind, self.workdir / f"source-{kind}")
        return self.sources[kind]

    def package(self, kind: str, **kwargs: Any) -> Path:
        """mobius_lite.build(source, **kwargs) saved in the workdir, once per settings."""
        import mobius_lite

        key = kind + json.dumps(kwargs, sort_keys=True)
        if key not in self.packages:
            out = self.workdir / f"package-{len(self.packages)}"
            built = mobius_lite.build(str(self.source(kind)), **kwargs)
            self.packages[key] = built.save(out, overwrite=True, quiet=True)
        return self.packages[key]

    def guarded(self, fn: Callable[[], Any]) -> Any:
        """fn(); in a dry run, the CPU provider's refusal of a graph (bf16, a CUDA-only
        kernel) becomes NoKernelHere with onnxruntime's first line."""
        try:
            return fn()
        except Exception as exc:
            text = " ".join(str(exc).split())
            found = [text.index(m) for m in NO_CPU_KERNEL if m in text]
            if self.dry_run and found:
                why = text[min(found) :].split("; check that")[0][:140]
                raise NoKernelHere(why.rstrip(")")) from exc
            raise


def write_source(kind: str, path: Path) -> Path:
    """A tiny random checkpoint: a demo kind, a ModelOpt variant (fixtures), the --quantize
    model (TINY), or the mid model's widths without MLP layers for the speed check."""
    if kind in DEMO_KINDS:
        from mobius_lite.demo import write_demo

        return write_demo(kind, path.with_suffix(".gguf") if kind == "gguf" else path)
    if kind in MODELOPT_KINDS:
        from reference_fixtures.modelopt_fixtures import write_checkpoint

        write_checkpoint(kind, path)
        return path
    if kind == "quantize":
        import torch
        from transformers import NemotronHConfig, NemotronHForCausalLM

        torch.manual_seed(0)
        model = NemotronHForCausalLM(NemotronHConfig(**TINY)).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim > 1:
                    p.normal_(0, p.shape[-1] ** -0.5)
        model.save_pretrained(path)
        return path
    if kind in ("speed-mid", "speed-tiny"):
        make_checkpoint(path, "no-mlp", kind.removeprefix("speed-"))
        return path
    raise ValueError(kind)


# ----------------------------------------------------------------------------- parity
def op_count(package: Path, op_type: str) -> int:
    """Nodes of `op_type` in the package's decoder, subgraphs included."""
    import onnx

    def walk(graph: Any) -> int:
        count = 0
        for node in graph.node:
            count += node.op_type == op_type
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    count += walk(attribute.g)
        return count

    return walk(onnx.load(str(package / DECODER_FILE), load_external_data=False).graph)


def outputs(package: Path, providers: list[str], forced: list[int] | None = None) -> dict:
    """The logits of the prefill's last position and of STEPS decode calls, concatenated (fed
    `forced` tokens when given), the greedy token after each call, and for an Omni package
    its vision encoder's output on a synthetic image."""
    from mobius_lite.enums import GraphRole
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.package_reader import open_package

    files = open_package(package)
    arrays: dict[str, np.ndarray] = {}
    if GraphRole.EMBEDDING.value in files.graphs:
        from mobius_lite.bench.omni_peer import synthetic_inputs
        from mobius_lite.run.omni_session import OmniSession
        from mobius_lite.run.ort_session import create_session, input_dtypes

        omni = OmniSession(package, providers)
        decoder, embed = omni.decoder, omni.embed_token
        prompt = omni.embed(prompt_ids(decoder.vocab_size))
        if GraphRole.VISION_ENCODER.value in files.graphs:
            session = create_session(files.graph(GraphRole.VISION_ENCODER), providers)
            feeds = synthetic_inputs(omni.config.vision_tower, None)[GraphRole.VISION_ENCODER]
            dtypes = input_dtypes(session)
            feeds = {k: v.astype(dtypes[k], copy=False) for k, v in feeds.items()}
            arrays["vision"] = session.run(None, feeds)[0].astype(np.float32).reshape(-1)
        generation = greedy(decoder, prompt, STEPS + 1, next_input=embed, forced=forced)
    else:
        decoder = DecoderSession(files.graph(GraphRole.DECODER), providers)
        prompt = prompt_ids(decoder.vocab_size)
        generation = greedy(decoder, prompt, STEPS + 1, forced=forced)
    last = [out["logits"][0, -1].astype(np.float32) for out in generation.outputs]
    arrays["logits"] = np.concatenate(last)
    return {"arrays": arrays, "tokens": [int(row.argmax()) for row in last]}


def prompt_ids(vocab_size: int | None) -> np.ndarray:
    """PROMPT ids below the byte range (no special or media token), fixed seed."""
    high = min(vocab_size or 256, 256)
    return np.random.default_rng(0).integers(3, high, size=(1, PROMPT)).astype(np.int64)


def parity(
    run: Run,
    label: str,
    kind: str,
    build: dict[str, Any],
    reference: dict[str, Any] | None = None,
    op: str | None = None,
    same_tokens: bool = False,
) -> str:
    """One route against the f32 CPU package of the same source (`reference`: its build
    settings beyond f32 / cpu): every array within the release gates; `op` must be in the
    route's decoder; with `same_tokens` the greedy tokens must agree too."""
    ref = outputs(run.package(kind, dtype="f32", **(reference or {})), CPU)
    package = run.package(kind, ep="cuda", **build)
    ops = ""
    if op is not None:
        count = op_count(package, op)
        if count == 0:
            return f"FAIL {label}: no {op} in the decoder (the route was not taken)"
        ops = f" ({count} {op})"
    try:
        ours = run.guarded(lambda: outputs(package, run.providers, forced=ref["tokens"]))
    except NoKernelHere as why:
        return f"BUILT {label}{ops}: the CPU cannot run it ({why})"
    comparisons = [compare(name, ours["arrays"][name], a) for name, a in ref["arrays"].items()]
    agree = sum(a == b for a, b in zip(ours["tokens"], ref["tokens"], strict=True))
    ok = all(c.passes(RELEASE_NRMSE, RELEASE_COSINE) for c in comparisons)
    ok = ok and (agree == len(ref["tokens"]) or not same_tokens)
    figures = ", ".join(f"{c.name} nrmse {c.nrmse:.2e} cosine {c.cosine:.6f}" for c in comparisons)
    tokens = f"greedy tokens {agree}/{len(ref['tokens'])} agree"
    return f"{'PASS' if ok else 'FAIL'} {label}{ops} vs f32 cpu: {figures}, {tokens}"


# ----------------------------------------------------------------------------- state_window
def gates(name: str, actual: np.ndarray, expected: np.ndarray) -> dict[str, Any]:
    c = compare(name, actual, expected)
    return {"name": name, "nrmse": c.nrmse, "passes": c.passes(FP32_NRMSE, FP32_COSINE)}


def window_slots(packages: dict[str, Path], providers: list[str]) -> list[dict[str, Any]]:
    """Check 1: the kernel route's presents and windows against the scan route's presents and
    its states rewound from its window inputs after each position (run/state_rewind.py)."""
    from mobius_lite.io_contract import PRESENT_PREFIX, window_of
    from mobius_lite.run.decoder_session import DecoderSession

    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 80, size=(2, 9)).astype(np.int64)
    fed = rng.integers(3, 80, size=(2, 5)).astype(np.int64)
    outs, decoders = {}, {}
    for route, package in packages.items():
        decoders[route] = decoder = DecoderSession(package / DECODER_FILE, providers)
        decoder.reset(2)
        decoder.step(prompt)
        outs[route] = decoder.step(fed)
    results = [
        gates(name, outs["kernel"][name], expected)
        for name, expected in outs["scan"].items()
        if name.startswith(PRESENT_PREFIX)
    ]
    scan = decoders["scan"]
    assert scan.rewind is not None, "the scan route's decoder has no window inputs"
    positions = fed.shape[1]
    for kept in range(1, positions + 1):
        rewound = scan.rewind.states(scan.call_past, outs["scan"], positions, kept)
        assert rewound is not None, "the scan route returned no window inputs"
        for past_name, state in rewound.items():
            name = window_of(past_name)
            results.append(gates(f"{name} slot {kept - 1}", outs["kernel"][name][kept - 1], state))
    return results


def speculation(package: Path, providers: list[str]) -> list[dict[str, Any]]:
    """Check 2: speculative decoding on the kernel route against plain greedy decoding."""
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.speculative import speculative_greedy
    from reference_fixtures.speculative_fixtures import ScriptedHead, plain_greedy

    results = []
    for batch in (1, 2):
        decoder = DecoderSession(package / DECODER_FILE, providers)
        ids = np.random.default_rng(batch).integers(3, 80, size=(batch, 9)).astype(np.int64)
        mask = np.ones_like(ids)
        plain, _ = plain_greedy(decoder, ids, mask, SPECULATION_TOKENS)
        state = dict(decoder.past)
        known = np.concatenate([ids, plain], axis=1)
        head = ScriptedHead(known, decoder.vocab_size, lambda row, t: (7 * t + row) % 5 == 0)
        tokens, stats = speculative_greedy(
            decoder, head, ids, SPECULATION_TOKENS, 4, attention_mask=mask, adaptive=False
        )
        states = [gates(f"batch {batch} {n}", decoder.past[n], v) for n, v in state.items()]
        identical = bool(np.array_equal(np.array(tokens), plain))
        results.append(
            {
                "batch": batch,
                "tokens_identical": identical,
                "rewinds": stats.rewinds,
                "rollbacks": stats.rollbacks,
                "passes": identical
                and stats.rollbacks == 0
                and stats.rewinds > 0
                and all(s["passes"] for s in states),
            }
        )
    return results


def check_state_window(run: Run) -> list[str]:
    """The state_window kernel route against the scan route, on the demo MTP checkpoint."""
    packages = {
        route: run.package(
            "mtp", ep="cuda", weights_backend="ort", state_window_kernel=route == "kernel"
        )
        for route in ("scan", "kernel")
    }
    speculating = ["scan", "kernel"]  # the scan route rewinds from its window inputs
    try:
        slots = run.guarded(lambda: window_slots(packages, run.providers))
        worst = max(slot["nrmse"] for slot in slots)
        verdict = "PASS" if all(slot["passes"] for slot in slots) else "FAIL"
        lines = [
            f"{verdict} state_window slots (kernel vs scan, {len(slots)} arrays): "
            f"worst nrmse {worst:.2e}"
        ]
    except NoKernelHere as why:
        # the dry run: the kernel route is built only; the speculation check runs on the scan
        # route alone
        lines = [f"BUILT state_window kernel package: the CPU cannot run it ({why})"]
        speculating = ["scan"]
    for route in speculating:
        for result in speculation(packages[route], run.providers):
            verdict = "PASS" if result["passes"] else "FAIL"
            lines.append(
                f"{verdict} state_window speculation batch {result['batch']} ({route} "
                "route): tokens "
                f"{'identical' if result['tokens_identical'] else 'differ'}, "
                f"{result['rewinds']} cut back, {result['rollbacks']} re-runs"
            )
    return lines


# ----------------------------------------------------------------------------- speed
def check_speed(run: Run, dtype: str) -> str:
    """The mid model (no MLP layers, ort backend) decoding on the GPU through
    mobius_lite.bench; the dry run times the tiny widths on the CPU, fewer calls."""
    import os

    from mobius_lite.bench import BenchSettings, run_bench
    from mobius_lite.bench.peers import package_peer
    from mobius_lite.run.package_reader import open_package

    kind = "speed-tiny" if run.dry_run else "speed-mid"
    package = run.package(kind, dtype=dtype, ep="cuda", weights_backend="ort")
    prompt, decode, rounds = (32, 8, 1) if run.dry_run else tuple(SPEED.values())
    ep = "cpu" if run.dry_run else "cuda"
    threads = os.cpu_count() or 1
    label = f"decode speed {dtype} ({kind.removeprefix('speed-')} no-mlp, ort backend)"

    def timed() -> dict[str, float]:
        peer = package_peer(open_package(package), ep, threads, decode)
        settings = BenchSettings(prompt, decode, rounds, threads, ep)
        return run_bench(peer, [], settings, progress=False).medians("package")

    try:
        medians = run.guarded(timed)
    except NoKernelHere as why:
        return f"BUILT {label}: the CPU cannot run it ({why})"
    ms = medians["decode_ms_per_token"]
    ok = np.isfinite(ms) and ms > 0
    return (
        f"{'PASS' if ok else 'FAIL'} {label} on {ep}: {ms:.2f} ms/token "
        f"({medians['tokens_per_s']:.0f} tokens/s), prefill {prompt} {medians['prefill_ms']:.1f} ms"
    )


def check_generate_command(run: Run) -> str:
    """`mobius generate` run as a command (its own process: the decoder and the head on
    onnxruntime's shared thread pool, run/ort_session.on_shared_pool) on the demo MTP
    checkpoint built for --ep cuda (f16, ort backend): the same tokens with and without
    --speculative 2, on the GPU (the dry run: the CPU, where the f16 standard graphs run)."""
    import subprocess

    package = run.package("mtp", ep="cuda", dtype="f16", weights_backend="ort")
    ep = "cpu" if run.dry_run else "cuda"
    label = f"generate command {ep} (shared thread pool; --speculative 2 against plain)"

    def generate(*extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "mobius_lite.cli.main", "generate", str(package)]
        return subprocess.run(
            [*command, "--ep", ep, "--prompt-ids", "5,17,33,8", "--max-new-tokens", "16", *extra],
            capture_output=True,
            text=True,
        )

    plain, drafted = generate(), generate("--speculative", "2")
    for done in (plain, drafted):
        if done.returncode:
            why = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
            if run.dry_run and any(m in why for m in NO_CPU_KERNEL):
                return f"BUILT {label}: the CPU cannot run it ({why})"
            return f"FAIL {label}: exit {done.returncode}: {why}"
    same = plain.stdout == drafted.stdout
    return f"{'PASS' if same else 'FAIL'} {label}: tokens {'equal' if same else 'differ'}"


# ----------------------------------------------------------------------------- routes
def routes() -> dict[str, Callable[[Run], list[str]]]:
    """Every check by name, in the order it runs (the names --only matches)."""
    out: dict[str, Callable[[Run], list[str]]] = {}

    def add(name: str, fn: Callable[[Run], str | list[str]]) -> None:
        out[name] = lambda run: (lambda r: r if isinstance(r, list) else [r])(fn(run))

    for kind in (*DEMO_KINDS, *MODELOPT_KINDS):
        for dtype in DTYPES:
            label = f"parity {kind} {dtype}"
            add(label, lambda run, k=kind, d=dtype, n=label: parity(run, n, k, {"dtype": d}))
    kernels = (
        ("gguf", "f16", "MatMulNBits"),
        ("gguf", "bf16", "MatMulPacked"),
        ("nvfp4", "f16", "MatMulBlockQuantizedFp4Weight"),
        ("nvfp4", "bf16", "MatMulBlockQuantizedFp4Weight"),
        ("fp8", "f16", "MatMulBlockQuantizedFp8Weight"),
        ("fp8", "bf16", "MatMulBlockQuantizedFp8Weight"),
    )
    for kind, dtype, op in kernels:
        label = f"kernel {op} {kind} {dtype}"
        build = {"dtype": dtype, "weights_backend": "ort"}
        add(label, lambda run, k=kind, b=build, o=op, n=label: parity(run, n, k, b, op=o))
    for name, flags in QUANTIZE_ROUTES.items():
        label = f"quantize {name} f16"
        build = {"dtype": "f16", "weights_backend": "ort", **flags}
        add(
            label,
            lambda run, b=build, f=flags, n=label: parity(
                run, n, "quantize", b, reference=f, op="MatMulNBits", same_tokens=True
            ),
        )
    add("state_window", check_state_window)
    add("generate command", check_generate_command)
    for dtype in DTYPES:
        add(f"decode speed {dtype}", lambda run, d=dtype: check_speed(run, d))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu_check"))
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="no GPU needed: build every package, run what the CPU can on CPUExecutionProvider",
    )
    parser.add_argument(
        "--only", nargs="+", metavar="SUBSTRING", help="the routes whose names contain one"
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.cpu_dry_run:
        missing = cuda_available()
        if missing is not None:
            print(f"no GPU here: {missing}; nothing checked (--cpu-dry-run checks the builds)")
            return 0
    selected = {
        name: fn
        for name, fn in routes().items()
        if not args.only or any(part in name for part in args.only)
    }
    run = Run(claim_workdir(args.workdir), args.cpu_dry_run)
    lines: list[str] = []
    start = time.perf_counter()
    try:
        for name, fn in selected.items():
            began = time.perf_counter()
            try:
                found = fn(run)
            except Exception as exc:  # one route's failure is its verdict, not the run's end
                found = [f"FAIL {name}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"]
            seconds = time.perf_counter() - began
            for line in found:
                lines.append(line)
                print(f"{line} [{seconds:.1f} s]", flush=True)
    finally:
        release_workdir(run.workdir)
    total = time.perf_counter() - start
    where = "CPU dry run" if args.cpu_dry_run else "GPU"
    over = " OVER BUDGET" if total > args.budget_s else ""
    counts = {v: sum(line.startswith(v) for line in lines) for v in ("PASS", "FAIL", "BUILT")}
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    print(f"{where}: {summary}; {total:.0f} s of the {args.budget_s:.0f} s budget{over}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
