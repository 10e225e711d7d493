"""llama.cpp as a real client of the same GGUF file (issue 10; not part of the CI suite).

Writes a small random nemotron_h_moe model as an F32 GGUF (tests/gguf_fixtures.py, the
converter's layout, with a BPE vocabulary), quantizes it with llama.cpp's own quantizer
(llama_model_quantize: Q8_0 and the Q4_K_M preset, fallbacks included), exports each file with
`mobius build` (standard and ort weight backends) and runs the same prompt through llama.cpp
(llama_cpp.Llama, logits_all) and through the package (onnxruntime CPU): greedy tokens for
`--steps` steps, each fed its own previous token, and the cosine of the last-token logits.
Gates (fixed): equal greedy tokens at F32; last-token cosine >= 0.999 at Q8_0 and Q4_K_M
(llama.cpp quantizes activations for its quantized dot products).

Needs the `llamacpp` extra (pip install llama-cpp-python, which compiles llama.cpp).

Usage:
    python benchmarks/llamacpp_client.py --workdir /tmp/llamacpp_client --threads 2 \
        --json docs/llamacpp_client.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

COSINE_GATE = 0.999
MODEL = {
    "layers_block_type": ["mamba", "moe", "attention", "moe", "mamba", "moe"],
    "vocab_size": 512,
    "hidden_size": 256,
    "mamba_num_heads": 8,
    "mamba_head_dim": 32,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 256,
    "head_dim": 64,
    "n_group": 1,
    "topk_group": 1,
    "moe_latent_size": None,
}
CORPUS = ["The quick brown fox jumps over the lazy dog.", "state space models, 1234!"] * 8


def write_files(workdir: Path) -> dict[str, Path]:
    """The F32 GGUF (fixtures) and llama.cpp's own Q8_0 / Q4_K_M quantizations of it."""
    import llama_cpp

    from gguf_fixtures import build_bpe_tokenizer, write_gguf
    from nemotron_reference import make_reference

    model = make_reference(MODEL, seed=1)
    tokenizer = build_bpe_tokenizer(CORPUS, vocab_size=400)
    f32 = write_gguf(
        workdir / "model-F32.gguf",
        model,
        "nemotron_h_moe",
        {},
        tokenizer=tokenizer,
        special_tokens={"pad": 0, "bos": 1, "eos": 2},
    )[0]
    files = {"F32": f32}
    for name, ftype in (
        ("Q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0),
        ("Q4_K_M", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M),
    ):
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        out = workdir / f"model-{name}.gguf"
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not quantize {f32} to {name}")
        files[name] = out
    return files


def type_mix(path: Path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def run_llamacpp(path: Path, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path), logits_all=True, n_ctx=256, n_threads=threads, verbose=False
    )
    llm.eval(prompt)
    logits = [np.array(llm.scores[len(prompt) - 1], dtype=np.float32)]
    tokens = [int(logits[-1].argmax())]
    for _ in range(steps - 1):
        llm.eval([tokens[-1]])
        logits.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        tokens.append(int(logits[-1].argmax()))
    return {"tokens": tokens, "logits": logits}


def run_package(package: Path, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    from mobius_lite.runtime import DecoderSession, greedy

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = DecoderSession(package / "model.onnx", session_options=options)
    generation = greedy(session, np.array([prompt], dtype=np.int64), steps)
    logits = [out["logits"][0, -1].astype(np.float32) for out in generation.outputs]
    return {"tokens": generation.tokens, "logits": logits}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llamacpp_client"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import mobius_lite

    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    files = write_files(args.workdir)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 400, size=12)]
    results: dict[str, Any] = {"prompt": prompt, "steps": args.steps, "files": {}}
    ok = True
    for name, path in files.items():
        reference = run_llamacpp(path, prompt, args.steps, args.threads)
        entry: dict[str, Any] = {"types": type_mix(path), "routes": {}}
        for backend in ("standard", "ort"):
            package = args.workdir / f"{name}-{backend}"
            mobius_lite.build(path, dtype="f32", weights_backend=backend).save(package)
            ours = run_package(package, prompt, args.steps, args.threads)
            pairs = zip(ours["logits"], reference["logits"], strict=True)
            cosines = [cosine(a, b) for a, b in pairs]
            same = ours["tokens"] == reference["tokens"]
            passed = same if name == "F32" else cosines[0] >= COSINE_GATE
            ok &= passed
            entry["routes"][backend] = {
                "same_greedy_tokens": same,
                "prefill_last_token_cosine": cosines[0],
                "min_step_cosine": min(cosines),
                "tokens": ours["tokens"],
                "passed": passed,
            }
        entry["llamacpp_tokens"] = reference["tokens"]
        results["files"][name] = entry
    results["passed"] = ok
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
