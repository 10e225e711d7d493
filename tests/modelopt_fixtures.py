"""Tiny NVIDIA ModelOpt checkpoints (NVFP4 / FP8 / MIXED_PRECISION / the Nano release recipe)
quantized from the transformers NemotronH reference with a simple numpy quantizer, and their
dense weights computed independently (ml_dtypes conversions) for the reference side."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from nemotron_reference import make_reference

# layer 2 is the Mamba layer before the attention layer 3 (the Nano recipe keeps both dense)
PATTERN = ["mamba", "moe", "mamba", "attention", "moe", "mamba"]
# every linear's input width a multiple of NVFP4's 16-element block (TINY_BASE's shared expert
# is 24 wide)
OVERRIDES: dict[str, Any] = dict(layers_block_type=PATTERN, moe_shared_expert_intermediate_size=32)
VARIANTS = ("nvfp4", "fp8", "mixed", "nano")
FP4_MAX, E4M3_MAX = 6.0, 448.0
SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale")
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)


# --- a simple quantizer (per-block amax), written for the fixtures -------------------------


def quantize_nvfp4(w: np.ndarray) -> dict[str, np.ndarray]:
    """W [N, K] float32 -> ModelOpt NVFP4 tensors (codes U8 [N, K/2], E4M3 [N, K/16], F32)."""
    n, k = w.shape
    scale_2 = np.float32(max(np.abs(w).max(), 1e-12) / (FP4_MAX * E4M3_MAX))
    blocks = w.reshape(n, k // 16, 16)
    block_amax = np.abs(blocks).max(axis=-1)
    scale = np.clip(block_amax / FP4_MAX / scale_2, 2.0**-9, E4M3_MAX).astype(
        ml_dtypes.float8_e4m3fn
    )
    step = scale.astype(np.float32)[..., None] * scale_2
    scaled = np.abs(blocks) / step
    magnitude = np.abs(scaled[..., None] - E2M1_MAGNITUDES).argmin(axis=-1).astype(np.uint8)
    codes = (magnitude | np.where(blocks < 0, 8, 0).astype(np.uint8)).reshape(n, k)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return {"weight": packed, "weight_scale": scale, "weight_scale_2": np.array(scale_2)}


def quantize_fp8(w: np.ndarray) -> dict[str, np.ndarray]:
    """W [N, K] float32 -> ModelOpt FP8 tensors (E4M3 [N, K], F32 scalar scale)."""
    scale = np.float32(max(np.abs(w).max(), 1e-12) / E4M3_MAX)
    return {
        "weight": (w / scale).astype(ml_dtypes.float8_e4m3fn),
        "weight_scale": np.array(scale, dtype=np.float32),
    }


# --- which module is stored how, per variant ----------------------------------------------


def linear_modules(model: Any) -> dict[str, tuple[int, int]]:
    """Checkpoint module name -> (out, in) of every linear of a transformers NemotronH model.

    nn.Linear modules plus the routed experts (stacked parameters in transformers 5, saved one
    tensor per expert). The router (a custom module), conv1d, norms and embeddings are not.
    """
    modules: dict[str, tuple[int, int]] = {}
    for name, module in model.named_modules():
        ckpt = name.replace("model.", "backbone.", 1)
        if isinstance(module, torch.nn.Linear):
            modules[ckpt] = tuple(module.weight.shape)
        elif name.endswith("mixer.experts"):
            for proj in ("up_proj", "down_proj"):
                stacked = getattr(module, proj)
                for e in range(stacked.shape[0]):
                    modules[f"{ckpt}.{e}.{proj}"] = tuple(stacked.shape[1:])
    return modules


def _kind(module: str) -> str:
    if ".experts." in module:
        return "routed"
    if ".shared_experts." in module:
        return "shared"
    if module.endswith(("in_proj", "out_proj")):
        return "mamba"
    if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention"
    return "other"  # lm_head


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return int(parts[2]) if parts[:2] == ["backbone", "layers"] else None


def nano_dense_layers() -> list[int]:
    """Attention layers and the Mamba layer right before each (kept dense by the Nano recipe)."""
    dense = []
    for i, kind in enumerate(PATTERN):
        if kind == "attention":
            dense.append(i)
            if i > 0 and PATTERN[i - 1] == "mamba":
                dense.append(i - 1)
    return sorted(dense)


def storage_plan(variant: str, modules: dict[str, tuple[int, int]]) -> dict[str, str]:
    """module -> "NVFP4" | "FP8" | "none" for one variant (what the fixture writes)."""
    plan = {}
    for module in modules:
        kind = _kind(module)
        if kind == "other":
            algo = "none"
        elif variant == "nvfp4":
            algo = "NVFP4"
        elif variant == "fp8":
            algo = "FP8"
        elif variant == "mixed":
            algo = {"routed": "NVFP4", "shared": "FP8", "mamba": "FP8"}.get(kind, "none")
        elif variant == "nano":
            algo = "none" if _layer(module) in nano_dense_layers() else "NVFP4"
        else:
            raise ValueError(variant)
        plan[module] = algo
    return plan


def quant_configs(
    variant: str, plan: dict[str, str]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(config.json quantization_config, hf_quant_config.json) as the variant writes them."""
    producer = {"name": "modelopt", "version": "0.0.0-fixture"}
    if variant == "nvfp4":  # both files: the newer config.json layout + the legacy file
        qc = {
            "quant_method": "modelopt",
            "quant_algo": "NVFP4",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 4, "type": "float", "group_size": 16},
                    "input_activations": {"num_bits": 4, "type": "float", "group_size": 16},
                }
            },
            "ignore": ["lm_head"],
        }
        hf = {
            "producer": producer,
            "quantization": {
                "quant_algo": "NVFP4",
                "group_size": 16,
                "exclude_modules": ["lm_head"],
                "kv_cache_quant_algo": None,
            },
        }
        return qc, hf
    if variant == "fp8":  # config.json only
        qc = {
            "quant_method": "modelopt",
            "quant_algo": "FP8",
            "ignore": ["lm_head"],
            "kv_cache_scheme": {"type": "float", "num_bits": 8, "dynamic": False},
        }
        return qc, None
    if variant == "mixed":  # hf_quant_config.json only
        layers = {
            m: ({"quant_algo": a, "group_size": 16} if a == "NVFP4" else {"quant_algo": a})
            for m, a in plan.items()
            if a != "none"
        }
        hf = {
            "producer": producer,
            "quantization": {
                "quant_algo": "MIXED_PRECISION",
                "kv_cache_quant_algo": "FP8",
                "exclude_modules": ["lm_head"],
                "quantized_layers": layers,
            },
        }
        return None, hf
    if variant == "nano":  # legacy body embedded in config.json, and the legacy file
        exclude = ["lm_head", "*mixer.conv1d*"] + [
            f"backbone.layers.{i}.mixer*" for i in nano_dense_layers()
        ]
        body = {
            "quant_algo": "NVFP4",
            "group_size": 16,
            "kv_cache_quant_algo": "FP8",
            "exclude_modules": exclude,
        }
        return {"quant_method": "modelopt", "quantization": body}, {
            "producer": producer,
            "quantization": body,
        }
    raise ValueError(variant)


def kv_fp8(variant: str) -> bool:
    return variant in ("fp8", "mixed", "nano")


# --- writing ---------------------------------------------------------------------------------


def write_checkpoint(
    variant: str,
    directory: Path,
    *,
    shards: int = 1,
    seed: int = 0,
    edit: Callable[[dict[str, np.ndarray], dict[str, Any], dict[str, Any] | None], None]
    | None = None,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Write a tiny ModelOpt checkpoint of `variant` to `directory`; returns the dense model.

    edit(tensors, config, hf_quant_config) may alter the tensors / configs before writing
    (bad-input tests). Shards > 1 write model-XXXXX-of-YYYYY.safetensors and an index.
    `overrides` change the tiny config further (e.g. the expert count).
    """
    model = make_reference({**OVERRIDES, **(overrides or {})}, seed)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        config = json.loads((Path(tmp) / "config.json").read_text())
        with safe_open(Path(tmp) / "model.safetensors", "np") as f:
            dense = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
    modules = linear_modules(model)
    plan = storage_plan(variant, modules)
    rng = np.random.default_rng(seed + 1)
    tensors: dict[str, np.ndarray] = {}
    for name, array in dense.items():
        module = name.removesuffix(".weight")
        algo = plan.get(module, "none") if name.endswith(".weight") else "none"
        if algo == "none":
            tensors[name] = array
            continue
        parts = quantize_nvfp4(array) if algo == "NVFP4" else quantize_fp8(array)
        for suffix, value in parts.items():
            tensors[f"{module}.{suffix}"] = value
        # a static activation scale as calibration writes it (amax / format max)
        amax = np.float32(rng.uniform(2.0, 8.0))
        top = FP4_MAX * E4M3_MAX if algo == "NVFP4" else E4M3_MAX
        tensors[f"{module}.input_scale"] = np.array(amax / top, dtype=np.float32)
    if kv_fp8(variant):
        for module in modules:
            if module.endswith(("k_proj", "v_proj")):
                leaf = module[-6]
                tensors[f"{module}.{leaf}_scale"] = np.array(rng.uniform(0.01, 0.1), np.float32)
    qc, hf = quant_configs(variant, plan)
    if qc is not None:
        config["quantization_config"] = qc
    if edit is not None:
        edit(tensors, config, hf)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if hf is not None:
        (directory / "hf_quant_config.json").write_text(json.dumps(hf, indent=2))
    _save(tensors, directory, shards)
    return model


def _save(tensors: dict[str, np.ndarray], directory: Path, shards: int) -> None:
    names = sorted(tensors)
    if shards == 1:
        save_file(
            {n: np.ascontiguousarray(tensors[n]) for n in names}, directory / "model.safetensors"
        )
        return
    weight_map = {}
    for i, chunk in enumerate(np.array_split(np.array(names, dtype=object), shards)):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: np.ascontiguousarray(tensors[n]) for n in chunk}, directory / file)
        weight_map.update({n: file for n in chunk})
    index = {"metadata": {}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


# --- the independent dense side --------------------------------------------------------------


def read_tensors(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of a (possibly sharded) checkpoint directory, float8 as ml_dtypes arrays.

    Read through torch: safetensors' numpy reader has no float8 dtype.
    """
    out = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, "pt") as f:
            for name in f.keys():  # noqa: SIM118
                t = f.get_tensor(name)
                if t.dtype == torch.float8_e4m3fn:
                    out[name] = t.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)
                else:
                    out[name] = t.numpy()
    return out


def dequantized_state_dict(directory: Path) -> dict[str, np.ndarray]:
    """Dense float32 weights in checkpoint names, decoded with ml_dtypes' float4/float8 types.

    NVFP4: (e2m1 * e4m3 block scale) * scale_2, FP8: e4m3 * scale, both in float32. Scale,
    input-scale and KV-scale tensors are dropped (they are not weights).
    """
    tensors = read_tensors(directory)
    dense = {}
    for name, array in tensors.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        module = name.removesuffix(".weight")
        scale_2 = tensors.get(f"{module}.weight_scale_2")
        if name.endswith(".weight") and scale_2 is not None:
            n, half = array.shape
            nibbles = np.empty((n, half * 2), dtype=np.uint8)
            nibbles[:, 0::2] = array & 0x0F
            nibbles[:, 1::2] = array >> 4
            values = nibbles.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
            scale = tensors[f"{module}.weight_scale"].astype(np.float32)
            blocked = values.reshape(n, -1, 16) * scale[..., None]
            dense[name] = blocked.reshape(n, half * 2) * np.float32(scale_2)
        elif name.endswith(".weight") and array.dtype == ml_dtypes.float8_e4m3fn:
            scale = tensors[f"{module}.weight_scale"]
            dense[name] = array.astype(np.float32) * np.float32(scale)
        else:
            dense[name] = array.astype(np.float32)
    return dense


def dense_reference(directory: Path, out: Path) -> Any:
    """A transformers NemotronH model (FP32, eager) holding the dequantized weights."""
    from transformers import NemotronHForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config.pop("quantization_config", None)
    (out / "config.json").write_text(json.dumps(config))
    save_file(dequantized_state_dict(directory), out / "model.safetensors")
    model = NemotronHForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "eager"
    return model.eval()
