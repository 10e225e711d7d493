"""`--quantize q8_0 / q4_0` against llama.cpp's quantizer itself (issue 28; not CI).

CI checks the export's blocks against gguf-py's quantizer (tests/test_quantize_export.py).
This script checks them against llama.cpp's own `llama_model_quantize` (llama-cpp-python):
1. a tiny random Nemotron-H MoE model is saved twice: as a safetensors checkpoint and as an
   F32 GGUF written the way llama.cpp's converter writes it (reference_fixtures/gguf_fixtures.py);
2. llama.cpp quantizes the GGUF with `--pure` to Q8_0 and to Q4_0, and to Q4_0 with
   `--output-tensor-type q8_0`;
3. `mobius build` exports each llama.cpp file, and the checkpoint with the matching
   `--quantize` / `--quantize-output`;
4. every initializer of the two packages is compared byte for byte (the GGUF's stored
   A = -exp(A_log) against the checkpoint's A_log aside), and one verdict line is printed
   per type. Exit status 1 when any differs.
Needs the `llamacpp` extra (pip install llama-cpp-python); without it, one line and exit 0.

Usage:
    python benchmarks/investigations/quantize_vs_llamacpp.py --workdir /tmp/quantize_vs_llamacpp
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mobius_lite.bench.workdir import claim_workdir, release_workdir

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import llama_quantize  # noqa: E402

MODEL = {
    "layers_block_type": ["mamba", "moe", "attention", "moe"],
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
# name -> (llama_cpp file type constant, output tensor type or None, mobius flags)
CASES = {
    "Q8_0": ("LLAMA_FTYPE_MOSTLY_Q8_0", None, ["--quantize", "q8_0"]),
    "Q4_0": ("LLAMA_FTYPE_MOSTLY_Q4_0", None, ["--quantize", "q4_0"]),
    "Q4_0+output-Q8_0": (
        "LLAMA_FTYPE_MOSTLY_Q4_0",
        "GGML_TYPE_Q8_0",
        ["--quantize", "q4_0", "--quantize-output", "q8_0"],
    ),
}


def initializers(package: Path) -> dict[str, bytes]:
    manifest = json.loads((package / "manifest.json").read_text())
    out = {}
    for graph in manifest["graphs"].values():
        for name, entry in graph["initializers"].items():
            with open(package / entry["file"], "rb") as handle:
                handle.seek(entry["offset"])
                out[name] = handle.read(entry["length"])
    return out


def compare(ours: Path, theirs: Path) -> list[str]:
    """Names whose bytes differ or that only one package has (A / A_log aside)."""
    a, b = initializers(ours), initializers(theirs)
    problems = [n for n in set(a) & set(b) if a[n] != b[n]]
    problems += [f"only ours: {n}" for n in set(a) - set(b) if not n.endswith("mixer.A_log")]
    problems += [f"only llama.cpp's: {n}" for n in set(b) - set(a) if not n.endswith("mixer.A")]
    return sorted(problems)


def build(model: Path, out: Path, flags: list[str]) -> None:
    from mobius_lite.cli.main import main

    if main(["build", "--model", str(model), "--output", str(out), "-q", *flags]) != 0:
        raise RuntimeError(f"mobius build {model.name} {' '.join(flags)} failed")


def run(workdir: Path) -> int:
    from reference_fixtures.gguf_fixtures import write_gguf
    from reference_fixtures.nemotron_reference import make_reference

    model = make_reference(MODEL, seed=1)
    checkpoint = workdir / "checkpoint"
    model.save_pretrained(checkpoint)
    (f32,) = write_gguf(workdir / "model-F32.gguf", model, "nemotron_h_moe", {})
    failed = 0
    for name, (ftype, output_type, flags) in CASES.items():
        quantized = workdir / f"model-{name}.gguf"
        llama_quantize(f32, quantized, ftype, output_type, threads=2)
        build(quantized, workdir / f"{name}-llamacpp", [])
        build(checkpoint, workdir / f"{name}-mobius", flags)
        problems = compare(workdir / f"{name}-mobius", workdir / f"{name}-llamacpp")
        failed += bool(problems)
        verdict = "FAIL" if problems else "PASS"
        shown = ", ".join(problems[:5]) if problems else "every initializer byte-identical"
        print(f"{verdict} {name}: {shown}", flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default="/tmp/quantize_vs_llamacpp")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("SKIP: llama-cpp-python is not installed (pip install llama-cpp-python)")
        return 0
    workdir = claim_workdir(Path(args.workdir))
    try:
        return run(workdir)
    finally:
        if not args.keep:
            release_workdir(workdir)


if __name__ == "__main__":
    sys.exit(main())
