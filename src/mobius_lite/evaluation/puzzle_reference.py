"""The transformers reference for a Puzzle (nemotron_h_puzzle) checkpoint.

transformers has no Puzzle class. The reference is its NemotronHForCausalLM built from the
global fields, with each layer's mixer rebuilt from that layer's own transformers config: the
global config.json fields with the layer's block_configs entry applied on top (null entries
left out), as NVIDIA's NemotronHPuzzleConfig.get_nemotron_h_config_for_layer does. It reads
config.json and the tensors directly, sharing no resolution or binding code with the exporter,
so it can serve as an independent oracle. Needs torch and transformers (the `reference` extra).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs.puzzle import NemotronHPuzzleConfig
from mobius_lite.configs.values import decode_float
from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.models.nemotron_h_names import (
    LM_HEAD_WEIGHT,
    MTP_TENSORS,
    STACKED_EXPERTS,
    expert_names,
)
from mobius_lite.sources import SafetensorsCheckpoint
from mobius_lite.sources.config_json import read_config_json

# Puzzle / hub fields that the transformers NemotronHConfig must not see.
_NOT_FOR_TRANSFORMERS = (
    "block_configs",
    "mtp_block_configs",
    "blockwise_members",
    "model_type",
    "architectures",
    "auto_map",
    "layers_block_type",
    "layer_types",
    "hybrid_override_pattern",
    "num_hidden_layers",
    "mtp_hybrid_override_pattern",
    "mtp_layers_block_type",
    "num_nextn_predict_layers",
)
_TRANSFORMERS_KINDS = {
    "mamba": "linear_attention",
    "linear_attention": "linear_attention",
    "m": "linear_attention",
    "attention": "full_attention",
    "full_attention": "full_attention",
    "*": "full_attention",
    "mlp": "mlp",
    "-": "mlp",
    "moe": "moe",
    "e": "moe",
}
_MTP = re.compile(MTP_TENSORS)


def global_transformers_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json's global fields as transformers' NemotronHConfig kwargs (MTP left out)."""
    blocks = raw.get("block_configs")
    if not isinstance(blocks, list) or not blocks:
        raise ConfigError("config.json has no block_configs list: not a Puzzle checkpoint")
    fields = {k: v for k, v in raw.items() if k not in _NOT_FOR_TRANSFORMERS}
    fields["layers_block_type"] = [
        _TRANSFORMERS_KINDS[str(block["block_type"]).lower()] for block in blocks
    ]
    if "time_step_limit" in fields:
        fields["time_step_limit"] = [
            decode_float(v, "time_step_limit") for v in fields["time_step_limit"]
        ]
    return fields


def layer_transformers_fields(raw: dict[str, Any], index: int) -> dict[str, Any]:
    """Layer `index`'s transformers config: the globals with its block's entries applied."""
    fields = global_transformers_fields(raw)
    block = raw["block_configs"][index]
    fields.update({k: v for k, v in block.items() if k != "block_type" and v is not None})
    return fields


def _no_shared_expert() -> Any:
    """Stands in for the shared expert of a block with n_shared_experts == 0: transformers'
    NemotronHMoE always builds one, a Puzzle block without it adds nothing."""
    import torch

    class NoSharedExpert(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(hidden_states)

    return NoSharedExpert()


def build_puzzle_reference(raw: dict[str, Any], *, device: Any = None) -> Any:
    """transformers NemotronHForCausalLM for a Puzzle config.json dict, mixers rebuilt per layer.

    Weights are transformers' initial values (or meta tensors with device="meta").
    """
    import torch
    from transformers import NemotronHConfig as HFConfig
    from transformers import NemotronHForCausalLM
    from transformers.models.nemotron_h.modeling_nemotron_h import MIXER_TYPES

    def hf_config(fields: dict[str, Any]) -> Any:
        config = HFConfig(**fields)
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"
        return config

    with torch.device(device or "cpu"):
        model = NemotronHForCausalLM(hf_config(global_transformers_fields(raw)))
        for i, block in enumerate(model.model.layers):
            layer_config = hf_config(layer_transformers_fields(raw, i))
            block.mixer = MIXER_TYPES[block.block_type](layer_config, layer_idx=i)
            if block.block_type == "moe" and not int(layer_config.n_shared_experts or 0):
                block.mixer.shared_experts = _no_shared_expert()
    return model.eval()


def _as_torch(array: np.ndarray, dtype: Any) -> Any:
    import torch

    return torch.from_numpy(np.array(array, dtype=np.float32)).to(dtype)


def load_puzzle_weights(model: Any, source: Any, raw: dict[str, Any], dtype: Any = None) -> None:
    """Fill `model` (from build_puzzle_reference) with the checkpoint's tensors.

    Checkpoint names may use `model.` or `backbone.`; experts may be one tensor per expert.
    Every checkpoint tensor must be used, except `mtp.*` when num_nextn_predict_layers > 0.
    """
    import torch

    dtype = dtype or torch.float32
    available = set(source.names())
    used: set[str] = set()
    # As transformers does: a checkpoint's own lm_head.weight is used even when tied.
    tied = bool(raw.get("tie_word_embeddings", False)) and LM_HEAD_WEIGHT not in available

    def find(name: str) -> str | None:
        rest = name[len("model.") :] if name.startswith("model.") else None
        candidates = [name] if rest is None else [f"model.{rest}", f"backbone.{rest}"]
        return next((c for c in candidates if c in available), None)

    state: dict[str, Any] = {}
    missing: list[str] = []
    for name, tensor in model.state_dict(keep_vars=True).items():
        if tied and name == "lm_head.weight":
            continue
        found = find(name)
        if found is not None:
            state[name] = _as_torch(source.read(found), dtype)
            used.add(found)
        elif (stacked := STACKED_EXPERTS.match(name)) is not None:
            experts = tensor.shape[0]
            prefix = find(f"{stacked['prefix']}.0.{stacked['proj']}.weight")
            if prefix is None:
                missing.append(name)
                continue
            base = prefix[: -len(f".0.{stacked['proj']}.weight")]
            names = expert_names(base, stacked["proj"], experts)
            absent = [n for n in names if n not in available]
            if absent:
                missing.extend(absent)
                continue
            state[name] = torch.stack([_as_torch(source.read(n), dtype) for n in names])
            used.update(names)
        else:
            missing.append(name)
        if name in state and tuple(state[name].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"reference: {name} has shape {tuple(state[name].shape)} in the checkpoint, "
                f"the per-layer config says {tuple(tensor.shape)}"
            )
    mtp = int(raw.get("num_nextn_predict_layers") or 0) > 0
    leftover = sorted(n for n in available - used if not (mtp and _MTP.search(n)))
    if missing or leftover:
        raise CheckpointError(
            f"reference: checkpoint does not match config.json: missing {missing[:10]}, "
            f"unused {leftover[:10]}"
        )
    model.load_state_dict(state, strict=not tied, assign=True)
    if tied:
        model.lm_head.weight = model.model.embeddings.weight
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if on_meta:
        raise CheckpointError(f"reference: tensors left without data: {on_meta[:10]}")


def puzzle_reference_model(checkpoint_dir: str | Path) -> Any:
    """The torch FP32 reference for a Puzzle checkpoint directory, weights loaded, eval mode."""
    raw = read_config_json(checkpoint_dir)
    NemotronHPuzzleConfig.from_dict(raw)  # same config errors, raised before any tensor is read
    model = build_puzzle_reference(raw, device="meta")
    load_puzzle_weights(model, SafetensorsCheckpoint(checkpoint_dir), raw)
    return model
