"""On a CUDA machine: the ort route (onnxruntime's NVFP4 / FP8 CUDA kernels) against the
standard route, for tiny ModelOpt checkpoints written by the test fixtures (or given ones).

For each checkpoint two f16 packages are built for --ep cuda: `--weights-backend standard`
(standard-op decode, float32 Gemm) and `--weights-backend ort` (MatMulBlockQuantizedFp4Weight /
MatMulBlockQuantizedFp8Weight for every quantized linear outside the routed experts). Both run
on CUDAExecutionProvider over the same prompt (prefill + 5 greedy steps, each side fed the
standard route's tokens), and every logits array is compared. Gates, fixed here: NRMSE <= 1e-2
and cosine >= 0.9999 per step (the kernels round the decoded weight to f16; the standard route
keeps it in f32), plus the count of steps whose greedy token differs (reported, not gated).
Exit status 0 when every gate holds, 1 otherwise, 2 without CUDA.

Usage (from the repository root, with onnxruntime-gpu installed):
    python benchmarks/cuda_modelopt_check.py --workdir /tmp/cuda_modelopt
    python benchmarks/cuda_modelopt_check.py --checkpoint /path/to/modelopt-ckpt ...
    python benchmarks/cuda_modelopt_check.py --build-only   # no GPU: build and check graphs
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from mobius_lite.layout import DECODER_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import claim_workdir  # noqa: E402

NRMSE_GATE = 1e-2
COSINE_GATE = 0.9999
STEPS = 5


def build(checkpoint: Path, output: Path, backend: str) -> Path:
    from mobius_lite.cli.main import main

    args = ["build", "--model", str(checkpoint), "--output", str(output), "--dtype", "f16"]
    args += ["--ep", "cuda", "--weights-backend", backend, "--overwrite", "-q"]
    if main(args) != 0:
        raise SystemExit(f"build failed: {' '.join(args)}")
    return output


def run(package: Path, prompt: np.ndarray, tokens: list[int] | None) -> list[np.ndarray]:
    """Logits at prefill and STEPS cached steps; fed `tokens` when given, else its own."""
    import onnxruntime as ort

    from mobius_lite.run.runtime import DecoderSession, greedy

    session = DecoderSession(
        package / DECODER_FILE,
        providers=["CUDAExecutionProvider"],
        session_options=ort.SessionOptions(),
    )
    generation = greedy(session, prompt, STEPS + 1, forced=tokens)
    return [out["logits"][:, -1].astype(np.float32) for out in generation.outputs]


def compare(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    nrmse = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    cosine = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))
    return nrmse, cosine


def check(checkpoint: Path, workdir: Path, build_only: bool) -> bool:
    import onnx

    standard = build(checkpoint, workdir / "standard", "standard")
    kernels = build(checkpoint, workdir / "ort", "ort")
    graph = onnx.load(kernels / DECODER_FILE, load_external_data=False)
    used = sorted({n.op_type for n in graph.graph.node if n.domain == "com.microsoft"})
    print(f"{checkpoint.name}: ort route uses {used}")
    if build_only:
        onnx.checker.check_model(str(kernels / DECODER_FILE))
        return True
    prompt = np.random.default_rng(0).integers(3, 90, size=(1, 11)).astype(np.int64)
    reference = run(standard, prompt, None)
    tokens = [int(r[0].argmax()) for r in reference[:-1]]
    ours = run(kernels, prompt, tokens)
    ok, flips = True, 0
    for step, (a, b) in enumerate(zip(ours, reference, strict=True)):
        nrmse, cosine = compare(a, b)
        passed = nrmse <= NRMSE_GATE and cosine >= COSINE_GATE
        flips += int(a[0].argmax() != b[0].argmax())
        ok &= passed
        print(f"  step {step}: nrmse {nrmse:.2e} cosine {cosine:.7f} {'ok' if passed else 'FAIL'}")
    print(f"  greedy token differs at {flips} of {len(ours)} steps")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/cuda_modelopt"))
    parser.add_argument("--checkpoint", type=Path, action="append", help="a ModelOpt checkpoint")
    parser.add_argument("--build-only", action="store_true", help="no GPU: build and check")
    args = parser.parse_args()
    if not args.build_only:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            print("CUDAExecutionProvider is not available (install onnxruntime-gpu)")
            return 2
    claim_workdir(args.workdir)
    checkpoints = args.checkpoint
    if not checkpoints:
        import modelopt_fixtures as mf

        checkpoints = []
        for variant in ("nvfp4", "fp8", "mixed"):
            checkpoints.append(args.workdir / variant)
            mf.write_checkpoint(variant, checkpoints[-1])
    ok = all([check(c, args.workdir / f"pkg_{c.name}", args.build_only) for c in checkpoints])
    if args.build_only:
        print("graphs built and checked; nothing was run (--build-only)")
    else:
        print("ort route matches the standard route" if ok else "ort route FAILED a gate")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
