r"""Omni encoder latency: the package's vision / video / audio graphs (onnxruntime CPU) next to
transformers eager (torch CPU, FP32) on the same processed inputs, one run, same thread count.

A mid-size random Omni model (RADIO and Parakeet at mid widths, a 2-layer text model) is built
with transformers, saved, exported with mobius_lite.build, and each encoder timed on:
one 512x512 image, an 8-frame 256x256 video (4 tubelets), a 30 s audio clip (3000 mel frames).
Rounds alternate between the two sides; the median of --repeats is reported with the load.

    python benchmarks/investigations/bench_omni_encoders.py --workdir /tmp/bench_omni --threads 2 \
        --repeats 3 --json benchmarks/investigations/runs/bench_omni_encoders.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

MID_VISION = dict(
    hidden_size=384,
    num_hidden_layers=8,
    num_attention_heads=6,
    patch_size=16,
    max_img_size=512,
    num_cls_tokens=2,
    num_registers=4,
    video_temporal_patch_size=2,
)
MID_AUDIO = dict(
    hidden_size=256,
    num_hidden_layers=6,
    num_attention_heads=4,
    intermediate_size=1024,
    conv_kernel_size=9,
    subsampling_conv_channels=64,
    num_mel_bins=128,
    projection_hidden_size=512,
    projection_bias=True,
)
TEXT = dict(
    vocab_size=1024,
    hidden_size=256,
    num_hidden_layers=2,
    layers_block_type=["mamba", "attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=512,
    ssm_state_size=16,
    mamba_num_heads=8,
    mamba_head_dim=32,
    n_groups=1,
)


def build(workdir: Path) -> tuple[object, Path]:
    import torch
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3_Config,
    )
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3,
    )

    import mobius_lite

    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=MID_VISION,
        text_config=TEXT,
        audio_config=MID_AUDIO,
        vision_hidden_size=MID_VISION["hidden_size"],
        projector_hidden_size=1024,
        video_pruning_rate=0.5,
        image_token_id=1000,
        audio_token_id=1001,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = NemotronH_Omni_Reasoning_V3(config).eval()
    checkpoint = workdir / "checkpoint"
    if not checkpoint.exists():
        model.save_pretrained(checkpoint)
    package = workdir / "package"
    if not package.exists():
        mobius_lite.build(checkpoint).save(package, quiet=True)
    return model, package


def inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    p = MID_VISION["patch_size"]
    grid = np.array([[512 // p, 512 // p]], dtype=np.int64)
    return {
        "pixel_values": rng.standard_normal((int(grid.prod()), 3 * p * p)).astype(np.float32),
        "image_grid_hw": grid,
        "pixel_values_videos": rng.standard_normal((1, 4, 6, 256, 256)).astype(np.float32),
        "input_features": rng.standard_normal((1, 3000, MID_AUDIO["num_mel_bins"])).astype(
            np.float32
        ),
        "input_features_mask": np.ones((1, 3000), dtype=np.int64),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)

    import onnxruntime as ort
    import torch

    torch.set_num_threads(args.threads)
    model, package = build(args.workdir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    sessions = {
        name: ort.InferenceSession(str(package / f"{name}.onnx"), options, ["CPUExecutionProvider"])
        for name in ("vision_encoder", "video_encoder", "audio_encoder")
    }
    feeds = inputs(np.random.default_rng(0))
    t = {k: torch.from_numpy(v) for k, v in feeds.items()}
    cases = {
        "image 512x512": (
            lambda: sessions["vision_encoder"].run(
                None, {k: feeds[k] for k in ("pixel_values", "image_grid_hw")}
            ),
            lambda: model.get_image_features(t["pixel_values"], t["image_grid_hw"]),
        ),
        "video 8 frames 256x256": (
            lambda: sessions["video_encoder"].run(
                None, {"pixel_values_videos": feeds["pixel_values_videos"]}
            ),
            lambda: model.get_video_features(t["pixel_values_videos"]),
        ),
        "audio 30 s": (
            lambda: sessions["audio_encoder"].run(
                None, {k: feeds[k] for k in ("input_features", "input_features_mask")}
            ),
            lambda: model.get_audio_features(t["input_features"], t["input_features_mask"]),
        ),
    }
    results = {}
    with torch.inference_mode():
        for name, (ours, reference) in cases.items():
            ours(), reference()  # warm-up
            times: dict[str, list[float]] = {"onnxruntime": [], "transformers": []}
            loads = []
            for _ in range(args.repeats):
                for side, fn in (("onnxruntime", ours), ("transformers", reference)):
                    loads.append(os.getloadavg()[0])
                    start = time.perf_counter()
                    fn()
                    times[side].append(time.perf_counter() - start)
            ort_s = statistics.median(times["onnxruntime"])
            ref_s = statistics.median(times["transformers"])
            results[name] = {
                "onnxruntime_s": ort_s,
                "transformers_eager_s": ref_s,
                "ratio": ort_s / ref_s,
                "load_1min": [min(loads), max(loads)],
            }
            print(
                f"{name:<24} onnxruntime {ort_s * 1e3:8.1f} ms   transformers {ref_s * 1e3:8.1f} ms"
                f"   ratio {ort_s / ref_s:.2f}x   load {min(loads):.1f}-{max(loads):.1f}"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "command": " ".join([Path(sys.executable).name, *sys.argv]),
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
