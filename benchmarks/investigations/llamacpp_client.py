r"""llama.cpp as a real client of the same GGUF file (issues 10, 20; not part of the CI suite).

Writes small random nemotron_h_moe models as GGUF files the way llama.cpp's converter does
(reference_fixtures/gguf_fixtures.py and gguf_nvfp4_fixtures.py, with a BPE vocabulary):
- F32, quantized by llama.cpp's own quantizer (llama_model_quantize) to Q8_0, the Q4_K_M
  preset, MXFP4_MOE (stacked experts MXFP4, the rest Q8_0), TQ1_0, TQ2_0 and Q1_0 (each where
  the installed binding has the file type; fallbacks included);
- the converter's files from ModelOpt NVFP4 and MIXED_PRECISION checkpoints (NVFP4 with
  `.scale` / `.input_scale`, FP8 dequantized to F32);
- the mixed file (IQ2_XXS experts, Q8_0 Mamba / attention, NVFP4 shared experts, latent
  projections and output, F16 embeddings), its latent projections without `.scale`, which
  llama.cpp's loader refuses;
- a Puzzle file (per-layer expert widths and top-k).
Each file is exported with `mobius build` (standard and ort weight backends) and the same
prompt runs through llama.cpp (llama_cpp.Llama, logits_all) and through the package
(onnxruntime CPU): greedy tokens for `--steps` steps, each fed its own previous token, and the
cosine of the last-token logits, per file. Gates (fixed): equal greedy tokens for F32 files;
last-token cosine >= 0.999 for the others (llama.cpp quantizes activations for its quantized
dot products). A file llama.cpp cannot load is reported with its error, not gated.

Needs the `llamacpp` extra (pip install llama-cpp-python, which compiles llama.cpp);
`--no-llamacpp` runs everything else (the converter-layout files and the packages' own
tokens), without it.

Usage:
    python benchmarks/investigations/llamacpp_client.py --workdir /tmp/llamacpp_client --threads 2 \
        --json benchmarks/investigations/runs/llamacpp_client.json
    python benchmarks/investigations/llamacpp_client.py --no-llamacpp --steps 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures

from common import open_package  # noqa: E402

from mobius_lite.bench.workdir import claim_workdir  # noqa: E402

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
SPECIAL = {"pad": 0, "bos": 1, "eos": 2}
# The same sizes as ModelOpt fixture overrides (its own six-layer pattern) and for the mix.
WIDTHS = {k: MODEL[k] for k in ("vocab_size", "hidden_size", "mamba_num_heads", "mamba_head_dim")}
MODELOPT = {
    **WIDTHS,
    "head_dim": 64,
    "moe_intermediate_size": 256,
    "moe_shared_expert_intermediate_size": 256,
}
MIXED = {**MODEL, "moe_latent_size": 256, "moe_shared_expert_intermediate_size": 64}
# llama-quantize file types (llama_cpp constant names) applied to the F32 file.
QUANTIZED = {
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "MXFP4_MOE": "LLAMA_FTYPE_MOSTLY_MXFP4_MOE",
    "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0",
    "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
    "Q1_0": "LLAMA_FTYPE_MOSTLY_Q1_0",
}
F32_FILES = ("F32", "puzzle")  # gated on equal greedy tokens


def write_fixture_files(workdir: Path) -> dict[str, Path]:
    """The files written in the converter's layout (no llama.cpp needed): F32, the ModelOpt
    NVFP4 / MIXED_PRECISION conversions, the mixed file and a Puzzle file."""
    from reference_fixtures import modelopt_fixtures as mf
    from reference_fixtures.gguf_fixtures import (
        PUZZLE_GGUF_BLOCKS,
        PUZZLE_GGUF_GLOBALS,
        build_bpe_tokenizer,
        write_gguf,
    )
    from reference_fixtures.gguf_nvfp4_fixtures import write_mixed_gguf, write_modelopt_gguf
    from reference_fixtures.nemotron_reference import make_reference
    from reference_fixtures.puzzle_fixtures import puzzle_raw_config, write_puzzle_checkpoint

    tokenizer = build_bpe_tokenizer(CORPUS, vocab_size=400)
    vocab = {"tokenizer": tokenizer, "special_tokens": SPECIAL}
    model = make_reference(MODEL, seed=1)
    files = {"F32": write_gguf(workdir / "model-F32.gguf", model, "nemotron_h_moe", {}, **vocab)}
    for variant, name in (("nvfp4", "NVFP4-modelopt"), ("mixed", "MIXED_PRECISION-modelopt")):
        checkpoint = workdir / f"{variant}-checkpoint"
        mf.write_checkpoint(variant, checkpoint, seed=1, overrides=MODELOPT)
        files[name], _ = write_modelopt_gguf(
            checkpoint, workdir / f"model-{name}.gguf", workdir / variant, **vocab
        )
    mixed = make_reference(MIXED, seed=1)
    files["mixed"] = write_mixed_gguf(
        workdir / "model-mixed.gguf", mixed, latent_scales=False, **vocab
    )
    raw = puzzle_raw_config(PUZZLE_GGUF_BLOCKS, **PUZZLE_GGUF_GLOBALS, vocab_size=512)
    _, puzzle = write_puzzle_checkpoint(raw, workdir / "puzzle-checkpoint", seed=1)
    files["puzzle"] = write_gguf(
        workdir / "model-puzzle.gguf", puzzle, "nemotron_h_moe", {}, puzzle=True, **vocab
    )
    return {name: paths[0] for name, paths in files.items()}


def quantize_files(f32: Path, workdir: Path) -> tuple[dict[str, Path], dict[str, str]]:
    """llama.cpp's own quantizations of the F32 file, and the types it could not write."""
    import llama_cpp

    files, skipped = {}, {}
    for name, constant in QUANTIZED.items():
        ftype = getattr(llama_cpp, constant, None)
        if ftype is None:
            skipped[name] = f"llama_cpp has no {constant}"
            continue
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = ftype
        params.nthread = 2
        out = workdir / f"model-{name}.gguf"
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), params) != 0:
            skipped[name] = f"llama.cpp could not quantize {f32.name} to {name}"
            continue
        files[name] = out
    return files, skipped


def type_mix(path: Path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def llamacpp_greedy(path: Path, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
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


def package_greedy(package: Path, prompt: list[int], steps: int, threads: int) -> dict[str, Any]:
    import onnxruntime as ort

    from mobius_lite.run.greedy import greedy

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session, _ = open_package(package, options)
    generation = greedy(session, np.array([prompt], dtype=np.int64), steps)
    logits = [out["logits"][0, -1].astype(np.float32) for out in generation.outputs]
    return {"tokens": generation.tokens, "logits": logits}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def compare_file(
    name: str, path: Path, args: argparse.Namespace, prompt: list[int]
) -> tuple[dict[str, Any], bool]:
    """One file: its packages' tokens on both backends, against llama.cpp's unless told not to.
    Returns (report, passed)."""
    import mobius_lite

    entry: dict[str, Any] = {"types": type_mix(path), "routes": {}}
    reference = None
    if not args.no_llamacpp:
        try:
            reference = llamacpp_greedy(path, prompt, args.steps, args.threads)
        except Exception as err:  # noqa: BLE001  (llama.cpp's refusal is the finding)
            entry["llamacpp_error"] = f"{type(err).__name__}: {err}"
    ok = True
    for backend in ("standard", "ort"):
        package = args.workdir / f"{name}-{backend}"
        mobius_lite.build(path, dtype="f32", weights_backend=backend).save(package, quiet=True)
        ours = package_greedy(package, prompt, args.steps, args.threads)
        finite = all(bool(np.isfinite(step).all()) for step in ours["logits"])
        route: dict[str, Any] = {"tokens": ours["tokens"], "finite": finite}
        passed = finite
        if reference is not None:
            cosines = [
                cosine(a, b) for a, b in zip(ours["logits"], reference["logits"], strict=True)
            ]
            same = ours["tokens"] == reference["tokens"]
            passed &= same if name in F32_FILES else cosines[0] >= COSINE_GATE
            route.update(
                same_greedy_tokens=same,
                prefill_last_token_cosine=cosines[0],
                min_step_cosine=min(cosines),
            )
        route["passed"] = passed
        ok &= passed
        entry["routes"][backend] = route
    if reference is not None:
        entry["llamacpp_tokens"] = reference["tokens"]
    return entry, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/llamacpp_client"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-llamacpp",
        action="store_true",
        help="only the converter-layout files and the packages (no llama-cpp-python needed)",
    )
    args = parser.parse_args()

    claim_workdir(args.workdir)
    files = write_fixture_files(args.workdir)
    skipped: dict[str, str] = {}
    if not args.no_llamacpp:
        quantized, skipped = quantize_files(files["F32"], args.workdir)
        files.update(quantized)
    prompt = [int(t) for t in np.random.default_rng(0).integers(3, 400, size=12)]
    results: dict[str, Any] = {
        "prompt": prompt,
        "steps": args.steps,
        "llamacpp": not args.no_llamacpp,
        "not_written": skipped,
        "files": {},
    }
    ok = True
    for name, path in files.items():
        entry, passed = compare_file(name, path, args, prompt)
        results["files"][name] = entry
        ok &= passed
    results["passed"] = ok
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
