"""Speculative greedy decoding with the trained MTP head against plain greedy decoding, on the
model benchmarks/train_mtp_head.py trained: acceptance rate and decode tokens/s for each K,
tokens checked identical to plain greedy decoding on every prompt.

The `oracle_k*` modes draft with tests/speculative_fixtures.ScriptedHead, which proposes the
known plain continuation (every draft right, at the cost of a few numpy lines instead of a
head call): the ceiling of the verify-and-accept mechanism on this decoder.

Each round runs every mode (plain, then K = 1, 2, ...) on every prompt, in an order that
rotates every round; a mode's time is the median over rounds. Decode tokens/s is
(new tokens - 1) / (generation time - the median prefill time), so it leaves the 8-token
prefill out on both sides. The load average is recorded around the run: the machine is shared.

llama.cpp on the same weights runs when the optional `llamacpp` extra (llama-cpp-python) is
installed: plain greedy decode of an F32 GGUF of the same decoder. llama-cpp-python has no
entry point for llama.cpp's own nextn (MTP) draft (its `draft_model` hook takes a draft
written in Python), so no llama.cpp speculative figure is produced; the report says so.

Usage (after train_mtp_head.py wrote /tmp/mtp_bench/checkpoint):
    python benchmarks/bench_speculative.py --workdir /tmp/mtp_bench --threads 2 \
        --json docs/bench_speculative.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bench_common import session_options  # noqa: E402

from speculative_fixtures import ScriptedHead  # noqa: E402

PROMPT = 8


def prompts(count: int, vocab: int) -> list[np.ndarray]:
    """Random prompts (a seed train_mtp_head.py does not use)."""
    rng = np.random.default_rng(10)
    return [rng.integers(3, vocab, size=(1, PROMPT)).astype(np.int64) for _ in range(count)]


def run_modes(args: argparse.Namespace, package: Path) -> dict[str, Any]:
    from mobius_lite.runtime import DecoderSession, greedy
    from mobius_lite.speculative import open_head, speculative_greedy

    options = session_options(args.threads)
    decoder = DecoderSession(package / "model.onnx", session_options=options)
    head = open_head(package, session_options=session_options(args.threads))
    texts = prompts(args.prompts, decoder.vocab_size)
    modes = ["plain", *(f"k{k}" for k in args.ks), *(f"oracle_k{k}" for k in args.ks)]
    times: dict[str, list[float]] = {m: [] for m in modes}
    prefill: list[float] = []
    counts = {m: {"proposed": 0, "accepted": 0, "rounds": 0, "rollbacks": 0} for m in modes}
    plain_tokens: dict[int, list[int]] = {}
    identical = True
    for index in range(len(texts)):  # warm-up
        plain_tokens[index] = greedy(decoder, texts[index], args.new_tokens).tokens
    for r in range(args.rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for index, ids in enumerate(texts):
            decoder.reset(1)
            start = time.perf_counter()
            decoder.step(ids, logits_to_keep=1)
            prefill.append(time.perf_counter() - start)
            for mode in order:
                start = time.perf_counter()
                if mode == "plain":
                    tokens = greedy(decoder, ids, args.new_tokens).tokens
                else:
                    drafter = head
                    if mode.startswith("oracle"):  # drafts the known continuation: always right
                        known = np.array([[*ids[0], *plain_tokens[index]]])
                        drafter = ScriptedHead(known, decoder.vocab_size, lambda row, t: False)
                    drafted, stats = speculative_greedy(
                        decoder, drafter, ids, args.new_tokens, int(mode.rpartition("k")[2])
                    )
                    tokens = drafted[0]
                    if r == 0:
                        for key in counts[mode]:
                            counts[mode][key] += getattr(stats, key)
                times[mode].append(time.perf_counter() - start)
                identical &= tokens == plain_tokens[index]
    prefill_s = statistics.median(prefill)
    results: dict[str, Any] = {}
    for mode in modes:
        # per prompt: the median over rounds
        per_prompt = [statistics.median(times[mode][i :: len(texts)]) for i in range(len(texts))]
        decode_s = sum(t - prefill_s for t in per_prompt)
        results[mode] = {
            "decode_tokens_per_s": round((args.new_tokens - 1) * len(texts) / decode_s, 1),
            "generation_s_per_prompt": [round(t, 4) for t in per_prompt],
        }
        if mode != "plain":
            c = counts[mode]
            results[mode].update(c, acceptance_rate=round(c["accepted"] / c["proposed"], 3))
    plain_rate = results["plain"]["decode_tokens_per_s"]
    for mode in modes[1:]:
        results[mode]["speedup"] = round(results[mode]["decode_tokens_per_s"] / plain_rate, 2)
    return {
        "prefill_s_median": round(prefill_s, 5),
        "tokens_identical_to_plain": identical,
        "modes": results,
    }


def run_llama_cpp(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    """Plain greedy decode tokens/s of llama.cpp on an F32 GGUF of the same decoder."""
    if importlib.util.find_spec("llama_cpp") is None:
        return {
            "status": "not run: llama-cpp-python (the optional llamacpp extra) is not installed"
        }
    from llama_cpp import Llama
    from transformers import NemotronHForCausalLM

    from gguf_fixtures import build_bpe_tokenizer, write_gguf

    gguf = args.workdir / "model-f32.gguf"
    if not gguf.is_file():
        model = NemotronHForCausalLM.from_pretrained(checkpoint)
        tokenizer = build_bpe_tokenizer(["the quick brown fox jumps over the lazy dog"] * 8)
        write_gguf(gguf, model, "nemotron_h_moe", tokenizer=tokenizer)
    llm = Llama(
        str(gguf),
        n_ctx=PROMPT + args.new_tokens + 8,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )
    vocab = llm.n_vocab()
    rates = []
    for ids in prompts(args.prompts, vocab):
        llm.reset()
        llm.eval(ids[0].tolist())
        start = time.perf_counter()
        for _ in range(args.new_tokens - 1):
            logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
            llm.eval([int(logits.argmax())])
        rates.append((args.new_tokens - 1) / (time.perf_counter() - start))
    return {
        "status": "plain decode only: llama-cpp-python exposes no llama.cpp nextn (MTP) draft",
        "decode_tokens_per_s": round(statistics.median(rates), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ks", type=lambda s: [int(k) for k in s.split(",")], default=[1, 2, 3, 4])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import mobius_lite

    checkpoint = args.workdir / "checkpoint"
    package = args.workdir / "package"
    if not (package / "mtp.onnx").is_file():
        mobius_lite.build(checkpoint).save(package, quiet=True)
    load_before = os.getloadavg()
    start = time.perf_counter()
    report: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "new_tokens": args.new_tokens,
        "prompts": args.prompts,
        "rounds": args.rounds,
        "threads": args.threads,
        "package": run_modes(args, package),
        "llama_cpp": run_llama_cpp(args, checkpoint),
    }
    report["wall_s"] = round(time.perf_counter() - start, 1)
    report["load_average_before_after"] = [list(load_before), list(os.getloadavg())]
    report["cpu_count"] = os.cpu_count()
    train = args.workdir / "train_report.json"
    if train.is_file():
        report["training"] = json.loads(train.read_text())
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
