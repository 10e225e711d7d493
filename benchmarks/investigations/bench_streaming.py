r"""Streaming-export benchmark (issue 3): export time and peak memory next to `cp`.

One run:
  1. synthesises a random-weight Nemotron-H checkpoint of >= 8 GiB (BF16 safetensors shards
     + index, per-expert tensors as released checkpoints store them), written tensor by
     tensor in 64 MiB blocks, never held in memory;
  2. times `cp -r` of the checkpoint directory (and cp + fsync of the copy);
  3. exports it as bf16 and as f32 (`mobius_lite.build(...).save(...)` in a subprocess under
     /usr/bin/time -v: wall time and peak RSS), and records the package size;
  4. times `mobius verify` of the bf16 package (also under /usr/bin/time -v);
  5. deletes everything it wrote (unless --keep).
Before every measured step the checkpoint's pages are dropped from the page cache
(posix_fadvise DONTNEED), so each step reads it from disk, as an export of a checkpoint larger
than RAM would.

Usage:
    python benchmarks/investigations/bench_streaming.py --workdir /tmp/bench_streaming \\
        --json benchmarks/investigations/runs/bench_streaming.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

# Nemotron-3-Nano-like widths, fewer layers: 3 MoE layers of 128 experts dominate the bytes.
CONFIG = dict(
    vocab_size=131072,
    hidden_size=2688,
    layers_block_type=["mamba", "moe", "attention", "moe", "mamba", "moe"],
    mamba_num_heads=64,
    mamba_head_dim=64,
    ssm_state_size=128,
    n_groups=8,
    conv_kernel=4,
    chunk_size=128,
    num_attention_heads=32,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=1856,
    n_routed_experts=128,
    num_experts_per_tok=6,
    moe_intermediate_size=1856,
    moe_shared_expert_intermediate_size=3712,
    n_group=1,
    topk_group=1,
    tie_word_embeddings=False,
)
SHARD_BYTES = 4 << 30  # checkpoint shard size (released checkpoints use ~4-5 GB)
BLOCK = 64 << 20
EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>up_proj|down_proj)$")


# --------------------------------------------------------------------------- checkpoint
def checkpoint_tensors(config_dict: dict) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of every tensor, in the released layout (one tensor per expert)."""
    from mobius_lite.configs.loader import load_text_config
    from mobius_lite.graphs.decoder import build_decoder
    from mobius_lite.weights.binding import graph_parameters

    config = load_text_config(config_dict)
    decoder, _ = build_decoder(config)
    out = []
    for name, (shape, _) in graph_parameters(decoder).items():
        match = EXPERT.match(name)
        if match:
            for e in range(shape[0]):
                out.append((f"{match['prefix']}.{e}.{match['proj']}.weight", tuple(shape[1:])))
        else:
            out.append((name, tuple(shape)))
    return out


def random_bf16(rng: np.random.Generator, count: int) -> bytes:
    """Finite random bf16 values of magnitude ~2^-7..2^-5 (sign, small exponent, mantissa)."""
    bits = np.frombuffer(rng.bytes(2 * count), dtype=np.uint16)
    return ((bits & np.uint16(0x81FF)) | np.uint16(0x3C00)).tobytes()


def write_checkpoint(directory: Path, config_dict: dict, seed: int = 0) -> int:
    """BF16 safetensors shards + index, streamed block by block; returns total bytes."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(config_dict, indent=2))
    tensors = checkpoint_tensors(config_dict)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    used = 0
    for name, shape in tensors:
        nbytes = int(np.prod(shape)) * 2
        if used and used + nbytes > SHARD_BYTES:
            shards.append([])
            used = 0
        shards[-1].append((name, shape))
        used += nbytes
    rng = np.random.default_rng(seed)
    weight_map = {}
    total = 0
    for index, members in enumerate(shards):
        file_name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        header: dict = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape in members:
            nbytes = int(np.prod(shape)) * 2
            header[name] = {
                "dtype": "BF16",
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            offset += nbytes
            weight_map[name] = file_name
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(directory / file_name, "wb") as handle:
            handle.write(struct.pack("<Q", len(blob)))
            handle.write(blob)
            for _, shape in members:
                remaining = int(np.prod(shape))
                while remaining:
                    count = min(remaining, BLOCK // 2)
                    handle.write(random_bf16(rng, count))
                    remaining -= count
            handle.flush()
            os.fsync(handle.fileno())
        total += (directory / file_name).stat().st_size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


# --------------------------------------------------------------------------- measuring
def drop_cache(directory: Path) -> None:
    """Evict a directory's (clean) file pages from the page cache: the next read hits disk."""
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def tree_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def fsync_tree(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def time_cp(source: Path, target: Path) -> dict:
    drop_cache(source)
    start = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(target)], check=True)
    copied = time.perf_counter() - start
    fsync_tree(target)
    synced = time.perf_counter() - start
    size = tree_bytes(target)
    shutil.rmtree(target)
    return {"cp_s": round(copied, 2), "cp_fsync_s": round(synced, 2), "bytes": size}


def parse_time_v(text: str) -> dict:
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    parts = [float(p) for p in wall.group(1).split(":")] if wall else [0.0]
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return {"peak_rss_bytes": int(rss.group(1)) * 1024 if rss else None, "time_v_wall_s": seconds}


def timed_subprocess(args: list[str], workdir: Path, label: str) -> dict:
    """Run `args` under /usr/bin/time -v; wall time, peak RSS and the command's JSON line."""
    report = workdir / f"{label}.time"
    start = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-v", "-o", str(report), *args], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{label} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    result = {"wall_s": round(wall, 2), "returncode": proc.returncode}
    result.update(parse_time_v(report.read_text()))
    try:
        payload = json.loads(proc.stdout)
    except json.JSONDecodeError:
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        payload = json.loads(lines[-1]) if lines else {}
    payload.pop("mismatches", None) if payload.get("ok") else None
    result.update(payload)
    return result


def export_child(args: argparse.Namespace) -> None:
    """The measured export: build (headers only) + save (streams every byte)."""
    start = time.perf_counter()
    import mobius_lite

    package = mobius_lite.build(args.model, dtype=args.dtype, ep=args.ep)
    built = time.perf_counter()
    package.save(args.output, quiet=True)
    saved = time.perf_counter()
    summary = package.last_save
    print(
        json.dumps(
            {
                "build_s": round(built - start, 2),
                "save_s": round(saved - built, 2),
                "bytes_written": summary.bytes_written,
                "files": len(summary.files) + 1,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_streaming"))
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoint and packages")
    parser.add_argument(
        "--small", action="store_true", help="a ~0.1 GiB config, to try the script quickly"
    )
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("_export")
    child.add_argument("--model")
    child.add_argument("--output")
    child.add_argument("--dtype")
    child.add_argument("--ep")
    args = parser.parse_args()
    if args.command == "_export":
        export_child(args)
        return

    from transformers import NemotronHConfig as HFConfig

    config = dict(CONFIG, n_routed_experts=8, vocab_size=8192) if args.small else CONFIG
    work: Path = args.workdir
    if work.exists():
        raise SystemExit(f"{work} exists; remove it or choose another --workdir")
    work.mkdir(parents=True)
    checkpoint = work / "checkpoint"
    results: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "config": config,
    }
    try:
        start = time.perf_counter()
        size = write_checkpoint(checkpoint, HFConfig(**config).to_dict())
        results["checkpoint"] = {
            "bytes": size,
            "gib": round(size / (1 << 30), 2),
            "synthesis_s": round(time.perf_counter() - start, 1),
        }
        print(f"checkpoint: {size / (1 << 30):.2f} GiB", flush=True)
        results["cp"] = time_cp(checkpoint, work / "copy")
        print(f"cp: {results['cp']}", flush=True)
        for dtype, ep in (("bf16", "cuda"), ("f32", "cpu")):
            output = work / f"package-{dtype}"
            drop_cache(checkpoint)
            run = timed_subprocess(
                [
                    sys.executable,
                    __file__,
                    "_export",
                    "--model",
                    str(checkpoint),
                    "--output",
                    str(output),
                    "--dtype",
                    dtype,
                    "--ep",
                    ep,
                ],
                work,
                f"export-{dtype}",
            )
            run["output_bytes"] = tree_bytes(output)
            run["vs_cp"] = round(run["wall_s"] / results["cp"]["cp_s"], 2)
            run["vs_cp_fsync"] = round(run["wall_s"] / results["cp"]["cp_fsync_s"], 2)
            results[f"export_{dtype}"] = run
            print(f"export {dtype}: {run}", flush=True)
            if dtype == "bf16":
                drop_cache(checkpoint)
                drop_cache(output)
                mobius = str(Path(sys.executable).with_name("mobius"))
                verify = timed_subprocess(
                    [mobius, "verify", str(output), "--source", str(checkpoint), "--json"],
                    work,
                    "verify-bf16",
                )
                results["verify_bf16"] = verify
                print(f"verify bf16: {verify}", flush=True)
            if not args.keep:
                shutil.rmtree(output)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
