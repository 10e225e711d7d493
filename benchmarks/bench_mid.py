"""Side-by-side CPU benchmark on the "mid" random Nemotron-H config (issue 2).

One run measures, for the same random checkpoint:
  export wall time and peak RSS (`mobius build` under /usr/bin/time -v), node count,
  onnxruntime session-creation time, prefill latency (128 tokens) and per-token decode latency
  (medians) for onnxruntime CPU next to transformers eager (torch CPU, FP32).

Usage:
    python benchmarks/bench_mid.py --workdir /tmp/bench_mid --threads 2 --json docs/bench_mid.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from bench_common import (
    claim_workdir,
    median_time,
    open_package,
    release_workdir,
    session_options,
    timed_decode,
    timed_export,
)

MID = dict(
    vocab_size=32000,
    hidden_size=1024,
    layers_block_type=[
        {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}[c]
        for c in "ME*-MEME*ME-"
    ],
    mamba_num_heads=32,
    mamba_head_dim=64,
    ssm_state_size=64,
    n_groups=4,
    conv_kernel=4,
    chunk_size=128,
    num_attention_heads=16,
    num_key_value_heads=4,
    head_dim=64,
    intermediate_size=2048,
    n_routed_experts=64,
    num_experts_per_tok=4,
    moe_intermediate_size=512,
    moe_shared_expert_intermediate_size=1024,
    moe_latent_size=None,
    n_group=1,
    topk_group=1,
)


def make_checkpoint(directory: Path, seed: int = 0):
    import torch
    from transformers import NemotronHConfig, NemotronHForCausalLM

    config = NemotronHConfig(**MID)
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = NemotronHForCausalLM(config).eval()
    with torch.no_grad():  # spread router scores so routing is not degenerate
        for layer in model.model.layers:
            if layer.block_type == "moe":
                layer.mixer.gate.weight.normal_(0.0, 0.05)
    model.save_pretrained(directory)
    params = sum(p.numel() for p in model.parameters())
    return model, params


def bench_onnxruntime(
    package: Path, prompt: np.ndarray, decode_tokens: int, threads: int, repeats: int
) -> dict:
    import onnx

    from mobius_lite.layout import DECODER_FILE

    graph = onnx.load(str(package / DECODER_FILE), load_external_data=False)
    top_nodes = len(graph.graph.node)
    sub_nodes = sum(
        len(a.g.node)
        for n in graph.graph.node
        for a in n.attribute
        if a.type == onnx.AttributeProto.GRAPH
    )
    session, created = open_package(package, session_options(threads))

    def prefill():
        session.reset(prompt.shape[0])
        return session.step(prompt)

    prefill()  # warm-up
    prefill_s = median_time(prefill, repeats)
    decoded = timed_decode(session, prefill()["logits"], decode_tokens)
    return {
        "nodes_top_level": top_nodes,
        "nodes_in_subgraphs": sub_nodes,
        "session_create_s": created,
        "prefill_s": prefill_s,
        "decode_token_s": decoded.median_after_first,
        "tokens": decoded.tokens,
    }


def bench_transformers(
    model, prompt: np.ndarray, decode_tokens: int, threads: int, repeats: int
) -> dict:
    import torch

    torch.set_num_threads(threads)
    ids = torch.from_numpy(prompt)
    positions = torch.arange(ids.shape[1])[None]

    def prefill():
        with torch.no_grad():
            return model(ids, use_cache=True, position_ids=positions)

    prefill()
    prefill_s = median_time(prefill, repeats)
    out = prefill()
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    token = out.logits[:, -1].argmax(-1)[:, None]
    steps, tokens = [], []
    length = ids.shape[1]
    with torch.no_grad():
        for _ in range(decode_tokens):
            start = time.perf_counter()
            out = model(token, cache=cache, use_cache=True, position_ids=torch.tensor([[length]]))
            steps.append(time.perf_counter() - start)
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            token = out.logits[:, -1].argmax(-1)[:, None]
            tokens.append(int(token[0, 0]))
            length += 1
    return {
        "prefill_s": prefill_s,
        "decode_token_s": statistics.median(steps[1:]),
        "tokens": tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_mid"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    claim_workdir(args.workdir)
    checkpoint, package = args.workdir / "checkpoint", args.workdir / "package"
    model, params = make_checkpoint(checkpoint)
    export = timed_export(checkpoint, package, ["--dtype", "f32"])
    prompt = np.random.default_rng(0).integers(3, MID["vocab_size"], size=(1, args.prompt_length))
    ours = bench_onnxruntime(package, prompt, args.decode_tokens, args.threads, args.repeats)
    ref = bench_transformers(model, prompt, args.decode_tokens, args.threads, args.repeats)
    results = {
        "config": "mid (" + "".join("ME*-MEME*ME-") + ")",
        "parameters": params,
        "checkpoint_bytes": sum(f.stat().st_size for f in checkpoint.glob("*.safetensors")),
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        **export,
        "onnxruntime": ours,
        "transformers_eager": ref,
        "decode_ratio": ours["decode_token_s"] / ref["decode_token_s"],
        "prefill_ratio": ours["prefill_s"] / ref["prefill_s"],
        "same_greedy_tokens": ours["tokens"] == ref["tokens"],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    release_workdir(args.workdir)


if __name__ == "__main__":
    main()
