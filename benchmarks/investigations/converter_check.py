r"""llama.cpp's own converter on ModelOpt checkpoints (issue 20; not part of the CI suite).

Writes tiny ModelOpt NVFP4 and MIXED_PRECISION checkpoints
(reference_fixtures/modelopt_fixtures.py, sizes that hold whole 64-element NVFP4 superblocks,
a byte-level BPE tokenizer), converts each with llama.cpp's `convert_hf_to_gguf.py` from a
llama.cpp source tree (`--outtype f32`, so only the
NVFP4 weights and their `.scale` tensors differ from the checkpoint's dense ones), exports the
GGUF with `mobius build` on both weight backends and the ModelOpt checkpoint directly
(standard backend, f32), and compares the two packages' logits at prefill and 5 greedy steps
under the FP32 gates (evaluation.metrics), with equal greedy tokens.

The converter identifies a BPE vocabulary by a hash of its pre-tokenizer, and the fixtures'
random vocabulary has none it knows: benchmarks/common.py's convert_command answers that one
question "gpt-2" (`get_vocab_base_pre`); the tensors are converted by the converter's own code.

llama-cpp-python's source distribution carries the tree (vendor/llama.cpp):
    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lsrc
    tar xzf /tmp/lsrc/llama_cpp_python-0.3.36.tar.gz -C /tmp/lsrc
    python benchmarks/investigations/converter_check.py \
        --llama-cpp /tmp/lsrc/llama_cpp_python-0.3.36/vendor/llama.cpp --workdir /tmp/conv
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import convert_command, save_bpe_tokenizer  # noqa: E402

# every matmul's input width a multiple of 64 (NVFP4's superblock), vocab above the tokenizer's
SIZES = dict(
    hidden_size=64,
    intermediate_size=64,
    moe_intermediate_size=64,
    moe_shared_expert_intermediate_size=64,
    head_dim=16,
    mamba_head_dim=16,
    vocab_size=320,
)
CORPUS = ["The quick brown fox jumps over the lazy dog.", "state space 1234"] * 4
PROMPT = [5, 17, 33, 2, 90, 41, 7, 250, 11]
STEPS = 6


def write_checkpoint(variant: str, directory: Path) -> None:
    from reference_fixtures import modelopt_fixtures

    modelopt_fixtures.write_checkpoint(variant, directory, overrides=SIZES)
    save_bpe_tokenizer(directory, CORPUS, vocab_size=300)


def logits_and_tokens(package: Path) -> tuple[list[int], list[np.ndarray]]:
    from mobius_lite.run.decoder_session import DecoderSession
    from mobius_lite.run.greedy import greedy

    generation = greedy(DecoderSession(package / "model.onnx"), np.array([PROMPT]), STEPS)
    return generation.tokens, [o["logits"][0, -1].astype(np.float64) for o in generation.outputs]


def build(model: Path, out: Path, backend: str) -> Path:
    from mobius_lite.cli.main import main

    shutil.rmtree(out, ignore_errors=True)
    args = ["build", "--model", str(model), "--output", str(out), "-q"]
    if main([*args, "--weights-backend", backend]) != 0:
        raise SystemExit(f"mobius build failed: {model} ({backend})")
    return out


def check(variant: str, tree: Path, work: Path) -> dict[str, Any]:
    import gguf

    from mobius_lite.evaluation.metrics import FP32_COSINE, FP32_NRMSE

    checkpoint, path = work / variant, work / f"{variant}.gguf"
    write_checkpoint(variant, checkpoint)
    subprocess.run(convert_command(tree, checkpoint, path, "f32"), check=True)
    tensors = gguf.GGUFReader(path).tensors
    report: dict[str, Any] = {
        "gguf_types": sorted({t.tensor_type.name for t in tensors}),
        "scale_tensors": sum(t.name.endswith(".scale") for t in tensors),
    }
    direct = logits_and_tokens(build(checkpoint, work / f"{variant}-modelopt", "standard"))
    for backend in ("standard", "ort"):
        converted = logits_and_tokens(build(path, work / f"{variant}-gguf-{backend}", backend))
        pairs = list(zip(converted[1], direct[1], strict=True))
        nrmse = max(float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in pairs)
        cosine = min(float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))) for a, b in pairs)
        report[backend] = {
            "max_nrmse": nrmse,
            "min_cosine": cosine,
            "tokens_equal": converted[0] == direct[0],
            "passed": nrmse <= FP32_NRMSE and cosine >= FP32_COSINE and converted[0] == direct[0],
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=__doc__.split("\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--llama-cpp", type=Path, required=True, help="a llama.cpp source tree")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/converter_check"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.llama_cpp / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"{args.llama_cpp} has no convert_hf_to_gguf.py: pass a llama.cpp tree")
    args.workdir.mkdir(parents=True, exist_ok=True)
    report = {v: check(v, args.llama_cpp, args.workdir) for v in ("nvfp4", "mixed")}
    report["passed"] = all(r[b]["passed"] for r in report.values() for b in ("standard", "ort"))
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
