r"""CPU benchmark of ModelOpt packages (standard route) next to the dense BF16-source build.

One random Nemotron-H MoE model ("small": hidden 512, 6 layers, 32 experts) is written four
ways: dense BF16 safetensors, and ModelOpt NVFP4 / FP8 / MIXED_PRECISION (quantized by the
test fixtures' numpy quantizer; dense tensors stored BF16 as the releases do). Each is
exported with `mobius build --dtype f32` under /usr/bin/time -v and measured once:
checkpoint and package weight bytes, export wall time and peak RSS, onnxruntime CPU session
creation, and the median per-token decode latency after a 16-token prefill.

Usage:
    python benchmarks/investigations/bench_modelopt.py --workdir /tmp/bench_modelopt --threads 2 \
        --json /tmp/bench_modelopt/result.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

from mobius_lite.bench.package_peer import session_options
from mobius_lite.bench.workdir import claim_workdir

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures
from common import (  # noqa: E402
    open_package,
    timed_decode,
    timed_export,
)

SMALL = dict(
    vocab_size=4096,
    hidden_size=512,
    layers_block_type=["mamba", "moe", "mamba", "attention", "moe", "mamba"],
    mamba_num_heads=16,
    mamba_head_dim=64,
    ssm_state_size=64,
    n_groups=2,
    chunk_size=64,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=1024,
    n_routed_experts=32,
    num_experts_per_tok=4,
    moe_intermediate_size=256,
    moe_shared_expert_intermediate_size=512,
)
VARIANTS = ("nvfp4", "fp8", "mixed")
SCALES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale")


def write_checkpoints(workdir: Path) -> dict[str, Path]:
    """The dense BF16 checkpoint and the three ModelOpt ones of the same model."""
    import ml_dtypes
    import torch

    from reference_fixtures import modelopt_fixtures as mf

    def bf16(tensors, config, hf) -> None:  # dense tensors as the releases store them
        for name, array in list(tensors.items()):
            if array.dtype == np.float32 and not name.endswith(SCALES):
                tensors[name] = array.astype(ml_dtypes.bfloat16)

    out = {}
    model = None
    for variant in VARIANTS:
        out[variant] = workdir / f"ckpt_{variant}"
        model = mf.write_checkpoint(variant, out[variant], edit=bf16, overrides=SMALL)
    out["dense-bf16"] = workdir / "ckpt_dense"
    model.to(torch.bfloat16).save_pretrained(out["dense-bf16"])
    return out


def tensor_bytes(checkpoint: Path) -> int:
    from mobius_lite.sources.safetensors_files import SafetensorsCheckpoint

    source = SafetensorsCheckpoint(checkpoint)
    return sum(source.info(n).nbytes for n in source.names())


def exported(checkpoint: Path, output: Path) -> dict:
    """The timed export, and the bytes of its external data files."""
    export = timed_export(checkpoint, output, ["--dtype", "f32"])
    data = sum(p.stat().st_size for p in output.iterdir() if p.name.endswith(".data"))
    return {**export, "package_data_bytes": data}


def bench_decode(package: Path, threads: int, decode_tokens: int) -> dict:
    from mobius_lite.configs import NemotronHConfig

    config = NemotronHConfig.from_file(package)
    session, created = open_package(package, session_options(threads))
    prompt = np.random.default_rng(0).integers(3, config.vocab_size, size=(1, 16))
    session.reset(1)
    out = session.step(prompt.astype(np.int64))
    decoded = timed_decode(session, out["logits"], decode_tokens)
    return {"session_create_s": created, "decode_ms_per_token": 1e3 * decoded.median_after_first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_modelopt"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-tokens", type=int, default=17)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    claim_workdir(args.workdir)
    rows = []
    for name, checkpoint in write_checkpoints(args.workdir).items():
        package = args.workdir / f"pkg_{name}"
        row = {"format": name, "checkpoint_tensor_bytes": tensor_bytes(checkpoint)}
        row |= exported(checkpoint, package)
        row |= bench_decode(package, args.threads, args.decode_tokens)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {
        "config": SMALL,
        "threads": args.threads,
        "machine": platform.processor() or platform.machine(),
        "rows": rows,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
