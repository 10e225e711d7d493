"""CPU side by side on one model: this package (DecoderSession, onnxruntime-genai), llama.cpp on
an F32 GGUF of the same weights, transformers eager; same thread count, alternating rounds.

Each side runs in its own fresh process per round (so one side's spinning threads cannot
slow the next), in an order that rotates every round. Around each run the parent records
os.getloadavg() and, from /proc/stat, how many cores other processes kept busy (system busy
time minus the child's own CPU time); a round counts as undisturbed when that stayed under
--quiet-cores for every side. Ratios are reported from undisturbed rounds only.

Usage (the mid config without dense MLP layers, the one llama.cpp can load):
    python benchmarks/bench_cpu.py --variant no-mlp --threads 2 --rounds 3 \
        --workdir /tmp/bench_cpu --json docs/bench_cpu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.layout import DECODER_FILE

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_common import open_package, session_options  # noqa: E402
from profile_decoder import PATTERNS, export, make_checkpoint  # noqa: E402

SIDES = ("package", "genai", "llama_cpp", "transformers")
VOCAB = 32000


def prompt_ids(length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(0).integers(3, VOCAB, size=length)]


# ----------------------------------------------------------------------------- sides
def timed_steps(prefill, step, prompt: list[int], decode: int) -> dict[str, Any]:
    """prefill(prompt) -> first token; step(token) -> next token. One warm-up prefill, two
    timed prefills (median), then `decode` timed steps (median of all but the first)."""
    prefill(prompt)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        token = prefill(prompt)
        times.append(time.perf_counter() - start)
    steps, tokens = [], [token]
    for _ in range(decode):
        start = time.perf_counter()
        token = step(token)
        steps.append(time.perf_counter() - start)
        tokens.append(token)
    return {
        "prefill_s": statistics.median(times),
        "decode_token_s": statistics.median(steps[1:]),
        "tokens": tokens,
    }


def package_dir(work: Path, backend: str) -> Path:
    return work / f"package-{backend}"


def run_package(
    work: Path, threads: int, prompt: list[int], decode: int, backend: str
) -> dict[str, Any]:

    session, load = open_package(package_dir(work, backend), session_options(threads))

    def prefill(ids: list[int]) -> int:
        # The last position's logits only, as llama.cpp computes by default.
        session.reset(1)
        return int(session.step(np.array([ids]), logits_to_keep=1)["logits"][0, -1].argmax())

    def step(token: int) -> int:
        return int(session.step(np.array([[token]]))["logits"][0, -1].argmax())

    return {"load_s": load, **timed_steps(prefill, step, prompt, decode)}


def run_genai(
    work: Path, threads: int, prompt: list[int], decode: int, backend: str
) -> dict[str, Any]:
    import onnxruntime_genai as og

    start = time.perf_counter()
    config = og.Config(str(package_dir(work, backend)))
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    model = og.Model(config)
    load = time.perf_counter() - start
    state: dict[str, Any] = {}

    def prefill(ids: list[int]) -> int:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + decode + 4)
        state["g"] = generator = og.Generator(model, params)
        generator.append_tokens(np.array([ids], dtype=np.int32))
        generator.generate_next_token()  # greedy pick from the prompt's logits, no model run
        return int(generator.get_next_tokens()[0])

    def step(token: int) -> int:
        generator = state["g"]
        generator.generate_next_token()  # runs the model on the last token, then picks
        return int(generator.get_next_tokens()[0])

    return {"load_s": load, **timed_steps(prefill, step, prompt, decode)}


def run_llama_cpp(work: Path, threads: int, prompt: list[int], decode: int) -> dict[str, Any]:
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(
        str(work / "model-f32.gguf"),
        n_ctx=len(prompt) + decode + 8,
        n_batch=len(prompt),
        n_ubatch=len(prompt),
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load = time.perf_counter() - start
    vocab = llm.n_vocab()

    def last_token() -> int:
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
        return int(logits.argmax())

    def prefill(ids: list[int]) -> int:
        llm.reset()
        llm._ctx.kv_cache_clear()
        llm.eval(ids)
        return last_token()

    def step(token: int) -> int:
        llm.eval([token])
        return last_token()

    return {"load_s": load, **timed_steps(prefill, step, prompt, decode)}


def run_transformers(work: Path, threads: int, prompt: list[int], decode: int) -> dict[str, Any]:
    import torch
    from transformers import NemotronHForCausalLM

    torch.set_num_threads(threads)
    start = time.perf_counter()
    model = NemotronHForCausalLM.from_pretrained(
        work / "checkpoint", dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.config._experts_implementation = "eager"
    load = time.perf_counter() - start
    state: dict[str, Any] = {}

    def forward(ids: list[int], start: int, cache: Any) -> Any:
        extra = {} if cache is None else {"cache": cache}
        with torch.no_grad():
            out = model(
                torch.tensor([ids]),
                use_cache=True,
                position_ids=torch.arange(start, start + len(ids))[None],
                **extra,
            )
        state["cache"] = out.cache if hasattr(out, "cache") else out.past_key_values
        state["length"] = start + len(ids)
        return int(out.logits[0, -1].argmax())

    def prefill(ids: list[int]) -> int:
        return forward(ids, 0, None)

    def step(token: int) -> int:
        return forward([token], state["length"], state["cache"])

    return {"load_s": load, **timed_steps(prefill, step, prompt, decode)}


RUNNERS = {
    "package": run_package,
    "genai": run_genai,
    "llama_cpp": run_llama_cpp,
    "transformers": run_transformers,
}


# ----------------------------------------------------------------------------- parent
def busy_jiffies() -> tuple[int, int]:
    """(busy, steal) jiffies of the whole machine from /proc/stat's cpu line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return user + nice + system + irq + softirq + steal, steal


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("onnxruntime", "onnxruntime_genai", "llama_cpp", "torch", "transformers"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = "not installed"
    return out


def prepare(work: Path, variant: str, with_gguf: bool, backend: str = "ort") -> None:
    """Checkpoint, package (f32) and, for llama.cpp, an F32 GGUF of the same weights."""
    pattern = PATTERNS[variant]
    if not (work / "checkpoint" / "config.json").is_file():
        model = make_checkpoint(work / "checkpoint", pattern)
    else:
        model = None
    if not (package_dir(work, backend) / DECODER_FILE).is_file():
        export(work / "checkpoint", package_dir(work, backend), backend)
    if with_gguf and not (work / "model-f32.gguf").is_file():
        sys.path.insert(0, str(HERE.parent / "tests"))
        from gguf_fixtures import build_bpe_tokenizer, write_gguf

        if model is None:
            from transformers import NemotronHForCausalLM

            model = NemotronHForCausalLM.from_pretrained(work / "checkpoint")
        # llama.cpp refuses a file without a vocabulary: a small BPE, padded to the vocab.
        tokenizer = build_bpe_tokenizer(["the quick brown fox jumps over the lazy dog"] * 8)
        write_gguf(work / "model-f32.gguf", model, "nemotron_h_moe", tokenizer=tokenizer)


def run_side(side: str, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a child process, with load and other processes' CPU around it."""
    cmd = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--workdir",
        str(args.workdir),
        "--threads",
        str(args.threads),
        "--prompt-length",
        str(args.prompt_length),
        "--decode-tokens",
        str(args.decode_tokens),
        "--backend",
        args.backend,
    ]
    load_before = os.getloadavg()
    busy0, steal0 = busy_jiffies()
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy1, steal1 = busy_jiffies()
    tick = os.sysconf("SC_CLK_TCK")
    own = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    result: dict[str, Any] = {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "other_cores": max(0.0, ((busy1 - busy0) / tick - own) / wall),
        "steal_cores": (steal1 - steal0) / tick / wall,
        "child_cpu_s": own,
        "child_wall_s": wall,
    }
    if proc.returncode != 0:
        result["error"] = proc.stderr.strip().splitlines()[-1:] or ["failed"]
        return result
    result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
    return result


def summarize(rounds: list[dict[str, Any]], sides: list[str], quiet: float) -> dict[str, Any]:
    """Per side: medians over undisturbed rounds; ratios of every side to llama.cpp and to
    transformers eager."""
    undisturbed = [
        r for r in rounds if all(s in r and r[s].get("other_cores", 9) < quiet for s in sides)
    ]
    out: dict[str, Any] = {"undisturbed_rounds": len(undisturbed), "rounds": len(rounds)}
    used = undisturbed or rounds
    out["figures_from"] = "undisturbed rounds" if undisturbed else "ALL rounds (none quiet)"
    medians = {}
    for side in sides:
        ok = [r[side] for r in used if "prefill_s" in r.get(side, {})]
        if ok:
            medians[side] = {
                k: statistics.median(x[k] for x in ok)
                for k in ("prefill_s", "decode_token_s", "load_s")
            }
    out["median"] = medians
    for base in ("llama_cpp", "transformers"):
        if base in medians:
            out[f"ratio_to_{base}"] = {
                side: {
                    k: medians[side][k] / medians[base][k] for k in ("prefill_s", "decode_token_s")
                }
                for side in medians
                if side != base
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(PATTERNS), default="no-mlp")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_cpu"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument(
        "--backend",
        choices=("standard", "ort"),
        default="ort",
        help="the package's --weights-backend (ort: onnxruntime's native Mamba kernels; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--quiet-cores",
        type=float,
        default=0.25,
        help="a round is undisturbed when other processes kept fewer cores busy than this",
    )
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    prompt = prompt_ids(args.prompt_length)
    if args.side:
        runner = RUNNERS[args.side]
        extra = {"backend": args.backend} if args.side in ("package", "genai") else {}
        result = runner(args.workdir, args.threads, prompt, args.decode_tokens, **extra)
        print(json.dumps(result))
        return

    sides = [s for s in args.sides.split(",") if s]
    if "llama_cpp" in sides and (
        importlib.util.find_spec("llama_cpp") is None or args.variant != "no-mlp"
    ):
        print("llama.cpp side left out (needs llama_cpp and --variant no-mlp)", file=sys.stderr)
        sides.remove("llama_cpp")
    if "genai" in sides and importlib.util.find_spec("onnxruntime_genai") is None:
        sides.remove("genai")
    args.workdir.mkdir(parents=True, exist_ok=True)
    prepare(args.workdir, args.variant, "llama_cpp" in sides, args.backend)

    rounds = []
    for r in range(args.rounds):
        order = sides[r % len(sides) :] + sides[: r % len(sides)]
        record: dict[str, Any] = {"order": order}
        for side in order:
            record[side] = run_side(side, args)
            fig = record[side]
            print(
                f"round {r} {side:12s} prefill {fig.get('prefill_s', float('nan')):.3f} s "
                f"decode {fig.get('decode_token_s', float('nan')) * 1e3:.2f} ms "
                f"other cores {fig['other_cores']:.2f} load {fig['load_before'][0]:.2f}"
                + (f" ERROR {fig['error']}" if "error" in fig else ""),
                file=sys.stderr,
                flush=True,
            )
        rounds.append(record)
    tokens = {s: rounds[-1][s].get("tokens") for s in sides}
    result = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "variant": f"{args.variant} ({PATTERNS[args.variant]})",
        "backend": args.backend,
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "decode_tokens": args.decode_tokens,
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus",
        "versions": versions(),
        "summary": summarize(rounds, sides, args.quiet_cores),
        "same_greedy_tokens_as_package": {s: t == tokens.get("package") for s, t in tokens.items()},
        "rounds": rounds,
    }
    text = json.dumps(result, indent=2)
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
