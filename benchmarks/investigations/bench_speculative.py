r"""Speculative greedy decoding on the "mid" model (hidden 1024, 64 experts, vocabulary 32,000;
benchmarks/common.py (MID)'s widths in bench_gguf.py's pattern ME*MEME*ME, which llama.cpp can
load, with a one-layer MTP head), where a decoder step is memory-bound: what speculation
gains over plain greedy decoding, and what a draft costs.

Packages (one random checkpoint with a head, built here; --packages picks):
  - f32: the safetensors checkpoint, `mobius build --backend ort` (its head exact);
  - f32-fast-head: the same with `--draft-head fast` (the head's dense projections on int8
    blocks made when its session is created; the decoder and every byte the f32 package's);
  - q8_0-int8: a Q8_0 GGUF of the same weights (head included), `--backend ort
    --activations int8 --draft-head fast`.
Modes, each over the whole `speculative_greedy` call (prefill included; a 32-token prompt and
48 new tokens by default; median over --rounds, the modes' order rotating every round):
  - plain: run.greedy.greedy;
  - scripted p=P k=K: a drafter that proposes the decoder's true continuation with
    probability P per draft (p = 0, 0.5, 0.7, 0.85, 1;
    reference_fixtures/speculative_fixtures.ScriptedHead, no model call), K fixed at 1..4, and
    `adaptive` (the DraftController, K up to 4);
  - head k=K: the package's own head (random weights: its acceptance is near 0; its call cost
    is the real one), fixed K and adaptive;
  - head-cost p=P k=K: the package's own head run for its real cost on every call, drafting
    the scripted drafter's tokens (p = 0 and 0.85, K = 3 and adaptive): a head with that
    acceptance and this head's call cost (the acceptance simulated, the cost real);
  - head call cost: median seconds of one chained draft call (one position) next to one
    plain decoder step.
Every run's tokens are checked identical to plain greedy decoding's. llama.cpp's plain greedy
decode of the Q8_0 GGUF runs in the same process when llama-cpp-python (the optional
`llamacpp` extra) is installed; otherwise the report says so and the rest runs.

Timings on a shared machine are not quiet measurements: the load average is recorded.

Usage:
    python benchmarks/investigations/bench_speculative.py --workdir /tmp/bench_spec --threads 2 \
        --json benchmarks/investigations/runs/bench_speculative.json
    python benchmarks/investigations/bench_speculative.py --workdir /tmp/bench_spec_tiny \
        --size tiny --rounds 1 --new-tokens 12 --prompt-length 8      # a smoke run (seconds)
    python benchmarks/investigations/bench_speculative.py --workdir /tmp/bench_spec \
        --modes "head-cost p=0.0 adaptive,scripted p=0.0 adaptive" --rounds 9   # a few modes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from common import CORPUS, make_checkpoint  # noqa: E402

from mobius_lite.bench.package_peer import session_options  # noqa: E402
from mobius_lite.bench.workdir import claim_workdir, release_workdir  # noqa: E402
from reference_fixtures.speculative_fixtures import ScriptedHead  # noqa: E402

# bench_gguf.py's mid MoE pattern: llama.cpp's nemotron_h_moe has no dense MLP layers
PROBABILITIES = (0.0, 0.5, 0.7, 0.85, 1.0)
KS = (1, 2, 3, 4)
PACKAGES = ("f32", "f32-fast-head", "q8_0-int8")
# A smoke-test size: the mid pattern with small widths (Q8_0 needs multiples of 32).
TINY = {
    "vocab_size": 512,
    "hidden_size": 64,
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "ssm_state_size": 16,
    "n_groups": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "moe_shared_expert_intermediate_size": 64,
}


def build_packages(args: argparse.Namespace) -> dict[str, Path]:
    """The checkpoint (head tensors added), its Q8_0 GGUF, and the two packages."""
    from safetensors.numpy import load_file, save_file

    import mobius_lite
    from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, write_gguf
    from reference_fixtures.mtp_fixtures import global_head_shape, head_tensors, nextn_tensors

    checkpoint = args.workdir / "checkpoint"
    widths = TINY if args.size == "tiny" else {}
    model = make_checkpoint(checkpoint, "no-mlp", num_nextn_predict_layers=1, **widths)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(100))
    path = checkpoint / "model.safetensors"
    save_file({**load_file(path), **head}, path, metadata={"format": "pt"})
    gguf = args.workdir / "model-q8_0.gguf"
    nextn = nextn_tensors(head, model.config, {})
    # llama.cpp loads a file only with a tokenizer (tokenizer.ggml.model): bench_gguf's
    tokenizer = build_bpe_tokenizer(CORPUS, vocab_size=400)
    special = {"pad": 0, "bos": 1, "eos": 2}
    write_gguf(
        gguf,
        model,
        "nemotron_h_moe",
        {r".": "Q8_0"},
        tokenizer,
        special_tokens=special,
        nextn=nextn,
    )
    del model
    builds = {
        "f32": (checkpoint, {}),
        "f32-fast-head": (checkpoint, {"draft_head": "fast"}),
        "q8_0-int8": (gguf, {"activations": "int8", "draft_head": "fast"}),
    }
    built = {
        name: mobius_lite.build(source, weights_backend="ort", **flags).save(
            args.workdir / name, quiet=True
        )
        for name, (source, flags) in builds.items()
        if name in args.packages
    }
    return {**built, "gguf": gguf}


def scripted(known: np.ndarray, vocab: int, p: float, seed: int) -> ScriptedHead:
    """A drafter right with probability p per draft (a fixed random draw per position)."""
    wrong = np.random.default_rng(seed).random(known.shape[1] + 8) >= p
    return ScriptedHead(known, vocab, lambda row, t: bool(wrong[t]))


def modes(head_factory: Callable[[], Any]) -> dict[str, tuple[Any, int | None]]:
    """mode name -> (drafter factory taking the known continuation, K or None: adaptive)."""
    out: dict[str, tuple[Any, int | None]] = {"plain": (None, 0)}
    for p in PROBABILITIES:
        for k in (*KS, None):
            name = f"scripted p={p} " + (f"k={k}" if k else "adaptive")
            out[name] = ((lambda known, vocab, p=p: scripted(known, vocab, p, 7)), k)
    for k in (1, 3, None):
        out["head " + (f"k={k}" if k else "adaptive")] = ((lambda known, vocab: head_factory()), k)
    for p in (0.0, 0.85):
        for k in (3, None):
            name = f"head-cost p={p} " + (f"k={k}" if k else "adaptive")
            out[name] = (
                lambda known, vocab, p=p: CostedScript(
                    head_factory(), scripted(known, vocab, p, 7)
                ),
                k,
            )
    return out


class CostedScript:
    """The package's own head, run for its real cost on every call (its last-position logits,
    as speculative.py asks), drafting the scripted drafter's tokens: the speed of a head with
    the scripted acceptance and this head's call cost. The acceptance is simulated, the cost
    is not."""

    def __init__(self, head: Any, script: ScriptedHead) -> None:
        self.head, self.script = head, script

    @property
    def length(self) -> int:
        return self.script.length

    def reset(self, batch: int) -> None:
        self.head.reset(batch)
        self.script.reset(batch)

    def step(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> Any:
        self.head.step(ids, hidden, mask, logits_to_keep=1)
        return self.script.step(ids, hidden, mask)

    def truncate(self, length: int) -> None:
        self.head.truncate(length)
        self.script.truncate(length)


def run_modes(args: argparse.Namespace, package: Path) -> dict[str, Any]:
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy
    from mobius_lite.run.mtp_head import open_head
    from mobius_lite.run.ort_session import on_shared_pool, without_spinning
    from mobius_lite.run.speculative import speculative_greedy

    # the decoder takes turns with the head on the same cores (run/ort_session.py). "own":
    # each on a pool of its own, the decoder's threads not spinning between calls (the
    # Python API's default); "shared": both on the process's shared pool, as `mobius
    # generate` run as a command puts them (plain greedy then runs on that pool too)
    def options() -> Any:
        made = session_options(args.threads)
        return on_shared_pool(made) if args.threading == "shared" else made

    decoder_options = options() if args.threading == "shared" else without_spinning(options())
    decoder = DecoderSession(package / "model.onnx", session_options=decoder_options)

    # One head session for every mode and round, as the decoder's: each generation starts
    # it afresh (speculative_greedy resets it), and its first calls (onnxruntime's arena
    # growing, first-run allocations) are made in the warm-up below, not in a timed run.
    head = open_head(package, session_options=options())

    rng = np.random.default_rng(10)
    ids = rng.integers(3, decoder.vocab_size, size=(1, args.prompt_length)).astype(np.int64)
    plain = greedy(decoder, ids, args.new_tokens).tokens  # warm-up and the reference
    speculative_greedy(decoder, head, ids, 8, max(KS), adaptive=False)  # the head's warm-up
    known = np.array([[*ids[0], *plain]])
    table = modes(lambda: head)
    if args.modes:  # checked in main, before anything is built
        table = {name: table[name] for name in table if name == "plain" or name in args.modes}
    times: dict[str, list[float]] = {m: [] for m in table}
    stats: dict[str, dict[str, Any]] = {}
    differing: set[str] = set()
    names = list(table)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            make, k = table[name]
            # the drafter is made before the clock starts (the head's session once, above:
            # session creation is a one-off cost, not a per-generation one)
            drafter = None if make is None else make(known, decoder.vocab_size)
            start = time.perf_counter()
            if drafter is None:
                tokens = greedy(decoder, ids, args.new_tokens).tokens
            else:
                drafted, s = speculative_greedy(
                    decoder, drafter, ids, args.new_tokens, k or max(KS), adaptive=k is None
                )
                tokens = drafted[0]
                stats.setdefault(name, s.as_dict())
            times[name].append(time.perf_counter() - start)
            if tokens != plain:
                differing.add(name)
    base = statistics.median(times["plain"])
    results = {
        name: {
            "seconds": round(statistics.median(t), 4),
            "vs_plain": round(base / statistics.median(t), 3),
            **({"stats": stats[name]} if name in stats else {}),
        }
        for name, t in times.items()
    }
    return {
        "tokens_identical_to_plain": not differing,
        "modes_with_other_tokens": sorted(differing),
        # Mamba layers whose states a rejected draft rewinds from the call's window inputs
        "decoder_rewound_layers": len(decoder.rewind.layers) if decoder.rewind else 0,
        "decoder_state_windows": len(decoder.windows),
        "head_call_cost": head_call_cost(decoder, head, ids, args.repeats),
        "modes": results,
    }


def head_call_cost(decoder: Any, head: Any, ids: np.ndarray, repeats: int) -> dict[str, float]:
    """Median seconds of one chained draft call (one position) and one plain decoder step."""
    decoder.reset(1)
    out = decoder.step(ids, logits_to_keep=1)
    token = out["logits"][:, -1].argmax(-1)[:, None]
    head.reset(1)
    logits, hidden = head.step(
        np.concatenate([ids[:, 1:], token], 1), out["hidden_states"], np.ones_like(ids)
    )
    draft_s, step_s = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        logits, hidden = head.step(logits[:, -1:].argmax(-1), hidden[:, -1:], np.ones((1, 1)))
        draft_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        out = decoder.step(token, logits_to_keep=1)
        step_s.append(time.perf_counter() - start)
        token = out["logits"][:, -1].argmax(-1)[:, None]
    draft, step = statistics.median(draft_s), statistics.median(step_s)
    return {"draft_call_s": draft, "decoder_step_s": step, "draft_over_step": draft / step}


def llamacpp_plain_greedy(args: argparse.Namespace, gguf: Path) -> dict[str, Any]:
    """Plain greedy decode of the Q8_0 GGUF with llama.cpp, timed like the plain mode."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {
            "status": "not run: llama-cpp-python (the optional llamacpp extra) is not installed"
        }
    from llama_cpp import Llama

    try:
        llm = Llama(
            str(gguf),
            n_ctx=args.prompt_length + args.new_tokens + 8,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            verbose=False,
        )
    except ValueError as exc:  # the packages' figures are kept whatever llama.cpp says
        return {"status": f"not run: llama.cpp did not load {gguf.name} ({exc})"}
    vocab = llm.n_vocab()
    ids = np.random.default_rng(10).integers(3, vocab, size=args.prompt_length).tolist()
    times = []
    for _ in range(args.rounds):
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        for _ in range(args.new_tokens - 1):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
            llm.eval([int(logits.argmax())])
        times.append(time.perf_counter() - start)
    return {
        "status": "plain decode only (llama-cpp-python exposes no nextn (MTP) draft)",
        "seconds": round(statistics.median(times), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--size", choices=["mid", "tiny"], default="mid")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20, help="head call-cost samples")
    parser.add_argument(
        "--threading",
        choices=("own", "shared"),
        default="own",
        help="the decoder and head each on a pool of their own (the Python API's default), or "
        "both on the process's shared pool (as `mobius generate` run as a command)",
    )
    parser.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        help="comma-separated mode names to run (plain always runs; default: every mode)",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--packages",
        type=lambda text: text.split(","),
        default=list(PACKAGES),
        help=f"comma-separated, of {', '.join(PACKAGES)} (default: all)",
    )
    args = parser.parse_args()
    known = list(modes(lambda: None))
    unknown = sorted(set(args.modes or ()) - set(known))
    if unknown:
        parser.error(f"unknown modes {unknown}; the modes are: {', '.join(known)}")

    claim_workdir(args.workdir)
    load_before = os.getloadavg()
    start = time.perf_counter()
    packages = build_packages(args)
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "size": args.size,
        "prompt_length": args.prompt_length,
        "new_tokens": args.new_tokens,
        "rounds": args.rounds,
        "modes": args.modes or "all",
        "threads": args.threads,
        "threading": args.threading,
        "packages": {name: run_modes(args, packages[name]) for name in args.packages},
        "llama_cpp_q8_0": llamacpp_plain_greedy(args, packages["gguf"]),
    }
    report["wall_s"] = round(time.perf_counter() - start, 1)
    report["load_average_before_after"] = [list(load_before), list(os.getloadavg())]
    report["cpu_count"] = os.cpu_count()
    report["note"] = "timings from a shared machine unless the load average says otherwise"
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    release_workdir(args.workdir)


if __name__ == "__main__":
    main()
