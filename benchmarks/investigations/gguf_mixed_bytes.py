r"""Package bytes per route for the mixed GGUF file (issue 20): IQ2_XXS routed experts, Q8_0
Mamba and attention projections, NVFP4 shared experts / latent projections / output with their
`.scale`, F16 embeddings, F32 norms (reference_fixtures/gguf_nvfp4_fixtures.write_mixed_gguf),
a random nemotron_h_moe model. Each route's package weight bytes (its external data, from the
manifest) against the file's tensor bytes, with the bytes per ggml type. No timing.

Usage:
    python benchmarks/investigations/gguf_mixed_bytes.py --workdir /tmp/gguf_mixed_bytes \
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: reference_fixtures

from mobius_lite.bench.workdir import claim_workdir  # noqa: E402

MODEL: dict[str, Any] = {
    "layers_block_type": ["mamba", "moe", "attention", "moe", "mamba", "moe"],
    "vocab_size": 2048,
    "hidden_size": 512,
    "mamba_num_heads": 16,
    "mamba_head_dim": 32,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 512,
    "moe_latent_size": 512,
    "moe_shared_expert_intermediate_size": 512,
    "n_group": 1,
    "topk_group": 1,
}
ROUTES: dict[str, list[str]] = {
    "standard": [],
    "ort": ["--weights-backend", "ort"],
    "standard (f16)": ["--dtype", "f16"],
    "dequantize (f32)": ["--dequantize"],
    "dequantize (f16)": ["--dequantize", "--dtype", "f16"],
}
MIB = 2**20


def measure(workdir: Path) -> dict[str, Any]:
    import gguf

    from mobius_lite.cli.main import main
    from reference_fixtures.gguf_nvfp4_fixtures import write_mixed_gguf
    from reference_fixtures.nemotron_reference import make_reference

    (file,) = write_mixed_gguf(workdir / "mixed.gguf", make_reference(MODEL, seed=1))
    by_type: dict[str, int] = {}
    for tensor in gguf.GGUFReader(file).tensors:
        name = tensor.tensor_type.name
        by_type[name] = by_type.get(name, 0) + int(tensor.n_bytes)
    out: dict[str, Any] = {
        "gguf_file_bytes": file.stat().st_size,
        "gguf_tensor_bytes": sum(by_type.values()),
        "gguf_bytes_by_type": dict(sorted(by_type.items())),
        "routes": {},
    }
    for route, flags in ROUTES.items():
        package = workdir / route.replace(" ", "-").replace("(", "").replace(")", "")
        args = ["build", "--model", str(file), "--output", str(package), "-q", *flags]
        if main(args) != 0:
            raise RuntimeError(f"mobius build failed for {route}")
        manifest = json.loads((package / "manifest.json").read_text())
        weights = sum(
            e["length"]
            for e in manifest["graphs"]["decoder"]["initializers"].values()
            if e["transform"] != "constant"
        )
        files = sum(p.stat().st_size for p in package.iterdir() if p.is_file())
        out["routes"][route] = {"weight_bytes": weights, "package_bytes": files}
    return out


def table(result: dict[str, Any]) -> str:
    tensors = result["gguf_tensor_bytes"]
    lines = [
        "| route | package weight bytes | x GGUF tensor bytes | package files (all) |",
        "| --- | --- | --- | --- |",
        f"| (the GGUF file) | {tensors / MIB:.2f} MiB | 1.00 | "
        f"{result['gguf_file_bytes'] / MIB:.2f} MiB |",
    ]
    for route, entry in result["routes"].items():
        lines.append(
            f"| {route} | {entry['weight_bytes'] / MIB:.2f} MiB | "
            f"{entry['weight_bytes'] / tensors:.2f} | {entry['package_bytes'] / MIB:.2f} MiB |"
        )
    mix = ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in result["gguf_bytes_by_type"].items())
    return "\n".join(lines) + f"\n\nGGUF tensor bytes by type: {mix}."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gguf_mixed_bytes"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    claim_workdir(args.workdir)
    result = measure(args.workdir)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
