"""Tiny checkpoints with a multi-token-prediction head, and the prefill + cached-steps driver
that compares a package's decoder `hidden_states` with transformers and its mtp.onnx with
the independent head reference (tests/mtp_reference.py)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from mobius_lite.configs import NemotronHConfig
from mobius_lite.evaluation.metrics import Comparison, compare
from mobius_lite.run.runtime import DecoderSession, cache_inputs
from mtp_reference import MTPHeadReference
from nemotron_reference import make_reference, pinned_torch

HEAD_PATTERN = ["linear_attention", "moe", "full_attention", "linear_attention"]


@dataclass(frozen=True)
class HeadShape:
    """The head's sizes: attention heads and its MoE block's shape."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    inner: int
    shared_inner: int  # 0: no shared expert
    latent: int | None = None


def head_tensors(
    shape: HeadShape, rng: np.random.Generator, prefix: str = ""
) -> dict[str, np.ndarray]:
    """Random head tensors under the released names (per-expert tensors), scaled like a
    trained model's (weights ~ 1/sqrt(fan_in), norms near 1)."""
    h = shape.hidden
    moe_in = shape.latent or h

    def weight(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) / np.sqrt(dims[-1])).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(h)).astype(np.float32)

    m = "mtp.layers.1.mixer."
    out = {
        "mtp.layers.0.enorm.weight": norm(),
        "mtp.layers.0.hnorm.weight": norm(),
        "mtp.layers.0.eh_proj.weight": weight(h, 2 * h),
        "mtp.layers.0.norm.weight": norm(),
        "mtp.layers.0.mixer.q_proj.weight": weight(shape.heads * shape.head_dim, h),
        "mtp.layers.0.mixer.k_proj.weight": weight(shape.kv_heads * shape.head_dim, h),
        "mtp.layers.0.mixer.v_proj.weight": weight(shape.kv_heads * shape.head_dim, h),
        "mtp.layers.0.mixer.o_proj.weight": weight(h, shape.heads * shape.head_dim),
        "mtp.layers.1.norm.weight": norm(),
        m + "gate.weight": weight(shape.experts, h),
        m + "gate.e_score_correction_bias": (0.05 * rng.standard_normal(shape.experts)).astype(
            np.float32
        ),
        "mtp.layers.1.final_layernorm.weight": norm(),
    }
    if shape.shared_inner:
        out[m + "shared_experts.up_proj.weight"] = weight(shape.shared_inner, h)
        out[m + "shared_experts.down_proj.weight"] = weight(h, shape.shared_inner)
    if shape.latent:
        out[m + "fc1_latent_proj.weight"] = weight(shape.latent, h)
        out[m + "fc2_latent_proj.weight"] = weight(h, shape.latent)
    for e in range(shape.experts):
        out[f"{m}experts.{e}.up_proj.weight"] = weight(shape.inner, moe_in)
        out[f"{m}experts.{e}.down_proj.weight"] = weight(moe_in, shape.inner)
    return {prefix + name: value for name, value in out.items()}


def global_head_shape(hf_config: Any) -> HeadShape:
    """The head of a Nemotron-H config: the backbone's attention and MoE sizes."""
    c = hf_config
    return HeadShape(
        hidden=c.hidden_size,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        experts=c.n_routed_experts,
        inner=c.moe_intermediate_size,
        shared_inner=c.moe_shared_expert_intermediate_size if c.n_shared_experts else 0,
        latent=c.moe_latent_size,
    )


def write_nemotron_h_mtp_checkpoint(
    directory: Path, overrides: dict[str, Any] | None = None, seed: int = 0
) -> tuple[Path, Any, dict[str, np.ndarray]]:
    """A transformers checkpoint (save_pretrained) declaring one head, with the head's
    `mtp.*` tensors added to model.safetensors. Returns (dir, reference model, head tensors)."""
    overrides = {"layers_block_type": HEAD_PATTERN, **(overrides or {})}
    model = make_reference({**overrides, "num_nextn_predict_layers": 1}, seed)
    model.save_pretrained(directory)
    head = head_tensors(global_head_shape(model.config), np.random.default_rng(seed + 100))
    path = directory / "model.safetensors"
    tensors = load_file(path)
    save_file({**tensors, **head}, path, metadata={"format": "pt"})
    return directory, model, head


def head_reference(
    model: Any,
    head: dict[str, np.ndarray],
    moe_config: Any = None,
    prefix: str = "mtp.layers.",
) -> MTPHeadReference:
    """The head reference with the decoder model's embedding table and lm_head."""
    return MTPHeadReference(
        head,
        model.config,
        moe_config if moe_config is not None else model.config,
        model.model.embeddings.weight.detach().numpy(),
        model.lm_head.weight.detach().numpy(),
        prefix=prefix,
    )


class HeadSession:
    """mtp.onnx with its own cache (the runtime side lives in run/speculative.py; this is the
    tests' minimal stepper)."""

    def __init__(self, path: Path, config: NemotronHConfig) -> None:
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        self.cache = cache_inputs(self.session)
        self.past: dict[str, np.ndarray] | None = None

    def step(self, ids: np.ndarray, hidden: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
        if self.past is None:
            self.past = {c.past_name: c.empty(ids.shape[0]) for c in self.cache}
        feeds = {"input_ids": ids, "hidden_states": hidden, "attention_mask": mask, **self.past}
        names = [o.name for o in self.session.get_outputs()]
        out = dict(zip(names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: out[c.present_name] for c in self.cache}
        return out


def _final_norm_hook(model: Any, captured: list[torch.Tensor]):
    norm = model.model.norm_f
    return norm.register_forward_hook(lambda _m, _i, out: captured.append(out.detach()))


def drive_head_parity(
    model: Any,
    reference: MTPHeadReference,
    package_dir: Path,
    config: NemotronHConfig,
    *,
    prompt_length: int = 11,
    decode_steps: int = 5,
    batch: int = 1,
    left_padding: tuple[int, ...] = (),
    seed: int = 0,
    decoder_input: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[Comparison]:
    """Prefill + `decode_steps` cached steps of the package's decoder and mtp.onnx next to
    transformers (`model`, its final-norm output) and the head reference.

    Both sides are fed the reference's greedy tokens; the head at position t gets token t+1
    and the hidden state of t (each side its own decoder's), so its cache lags the decoder's
    by one. Comparisons cover real (non-padded) positions only. `decoder_input` turns ids
    into the decoder's input (the Omni decoder takes embeddings).
    """
    decoder_input = decoder_input or (lambda ids: ids)
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, size=(batch, prompt_length)).astype(np.int64)
    mask = np.ones_like(ids)
    for row, pad in enumerate(left_padding):
        ids[row, :pad] = config.pad_token_id or 0
        mask[row, :pad] = 0
    decoder = DecoderSession(package_dir / "model.onnx")
    head = HeadSession(package_dir / "mtp.onnx", config)
    out: list[Comparison] = []
    captured: list[torch.Tensor] = []
    hook = _final_norm_hook(model, captured)
    try:
        with pinned_torch():
            ref = model(
                torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                use_cache=True,
                position_ids=torch.arange(prompt_length).expand(batch, -1),
            )
            ours = decoder.step(decoder_input(ids), mask)
            full = mask
            real = mask.astype(bool)
            head_ids, head_new = ids[:, 1:], real
            for step in range(decode_steps + 1):
                name = "prefill" if step == 0 else f"decode{step - 1}"
                ref_hidden = captured.pop().numpy()
                out.append(
                    compare(
                        f"{name}/hidden_states",
                        ours["hidden_states"][head_new],
                        ref_hidden[head_new],
                    )
                )
                token = ref.logits[:, -1].argmax(-1).numpy()[:, None].astype(np.int64)
                pairs = np.concatenate([head_ids, token], axis=1)
                ref_head = reference.step(pairs, ref_hidden, full)
                our_head = head.step(pairs, ours["hidden_states"], full)
                _compare_head(out, name, our_head, ref_head, head_new, full.astype(bool))
                # the decoder consumes the token; the head's next pair is (token + 1, H)
                full = np.concatenate([full, np.ones((batch, 1), np.int64)], axis=1)
                head_ids = np.zeros((batch, 0), np.int64)
                head_new = np.ones((batch, 1), bool)
                if step == decode_steps:
                    break
                ref = model(
                    torch.from_numpy(token),
                    attention_mask=torch.from_numpy(full),
                    cache=ref.past_key_values,
                    use_cache=True,
                    position_ids=torch.full((batch, 1), full.shape[1] - 1),
                )
                ours = decoder.step(decoder_input(token))
    finally:
        hook.remove()
    return out


def _compare_head(
    out: list[Comparison],
    step: str,
    ours: dict[str, np.ndarray],
    ref: dict[str, np.ndarray],
    real_new: np.ndarray,
    real_keys: np.ndarray,
) -> None:
    for name in ("logits", "mtp_hidden_states"):
        out.append(compare(f"{step}/mtp/{name}", ours[name][real_new], ref[name][real_new]))
    for name in ("present.mtp.0.key", "present.mtp.0.value"):
        # [B, H, T, D] -> real positions only
        actual = ours[name].transpose(0, 2, 1, 3)[real_keys]
        expected = ref[name].transpose(0, 2, 1, 3)[real_keys]
        out.append(compare(f"{step}/mtp/{name}", actual, expected))


# The Puzzle head: its attention block and its MoE (expert count, top-k, widths, latent,
# grouping) differ from every backbone block's.
PUZZLE_MTP_BLOCKS: list[dict[str, Any]] = [
    {"block_type": "attention", "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
    {
        "block_type": "moe",
        "n_routed_experts": 6,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 12,
        "moe_latent_size": 16,
        "moe_shared_expert_intermediate_size": 10,
        "n_group": 2,
        "topk_group": 1,
    },
]


def puzzle_block_config(raw: dict[str, Any], block: dict[str, Any]) -> Any:
    """transformers' NemotronHConfig of one head block: the globals with the block's entries."""
    from transformers import NemotronHConfig as HFNemotronHConfig

    from mobius_lite.evaluation.puzzle_reference import global_transformers_fields

    fields = global_transformers_fields(raw)
    fields.update({k: v for k, v in block.items() if k != "block_type" and v is not None})
    return HFNemotronHConfig(**fields)


def write_puzzle_mtp_checkpoint(
    directory: Path, seed: int = 0
) -> tuple[Path, Any, dict[str, np.ndarray], dict[str, Any]]:
    """The heterogeneous Puzzle checkpoint with mtp_block_configs, and the head's tensors in
    mtp.safetensors beside the index (which does not list it). Returns (dir, reference
    decoder, head tensors, config.json dict)."""
    from puzzle_fixtures import HETEROGENEOUS_BLOCKS, puzzle_raw_config, write_puzzle_checkpoint

    raw = puzzle_raw_config(
        HETEROGENEOUS_BLOCKS, num_nextn_predict_layers=1, mtp_block_configs=PUZZLE_MTP_BLOCKS
    )
    checkpoint, model = write_puzzle_checkpoint(raw, directory, seed=seed)
    attention = puzzle_block_config(raw, PUZZLE_MTP_BLOCKS[0])
    moe = puzzle_block_config(raw, PUZZLE_MTP_BLOCKS[1])
    shape = HeadShape(
        hidden=raw["hidden_size"],
        heads=attention.num_attention_heads,
        kv_heads=attention.num_key_value_heads,
        head_dim=attention.head_dim,
        experts=moe.n_routed_experts,
        inner=moe.moe_intermediate_size,
        shared_inner=moe.moe_shared_expert_intermediate_size,
        latent=moe.moe_latent_size,
    )
    head = head_tensors(shape, np.random.default_rng(seed + 200))
    save_file(head, str(checkpoint / "mtp.safetensors"))
    return checkpoint, model.float().eval(), head, raw


# ----------------------------------------------------------------------------- GGUF
# The head's tensors in block n_layer of a converter-layout GGUF (the head's own ones, then
# its attention and MoE sub-layers under the decoder's block names).
GGUF_HEAD_NAMES = {
    "mtp.layers.0.eh_proj.weight": "nextn.eh_proj.weight",
    "mtp.layers.0.enorm.weight": "nextn.enorm.weight",
    "mtp.layers.0.hnorm.weight": "nextn.hnorm.weight",
    "mtp.layers.1.final_layernorm.weight": "nextn.shared_head_norm.weight",
    "mtp.layers.0.norm.weight": "attn_norm.weight",
    "mtp.layers.1.norm.weight": "post_attention_norm.weight",
    "mtp.layers.0.mixer.q_proj.weight": "attn_q.weight",
    "mtp.layers.0.mixer.k_proj.weight": "attn_k.weight",
    "mtp.layers.0.mixer.v_proj.weight": "attn_v.weight",
    "mtp.layers.0.mixer.o_proj.weight": "attn_output.weight",
    "mtp.layers.1.mixer.gate.weight": "ffn_gate_inp.weight",
    "mtp.layers.1.mixer.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mtp.layers.1.mixer.fc1_latent_proj.weight": "ffn_latent_down.weight",
    "mtp.layers.1.mixer.fc2_latent_proj.weight": "ffn_latent_up.weight",
    "mtp.layers.1.mixer.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mtp.layers.1.mixer.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
}
GGUF_HEAD_EXPERTS = {"up_proj": "ffn_up_exps.weight", "down_proj": "ffn_down_exps.weight"}


def nextn_tensors(
    head: dict[str, np.ndarray], hf_config: Any, copies: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """The head as the converter writes it into blk.{n_layer}: q / k rows permuted per head,
    experts stacked [E, N, K]; `copies` (nextn.embed_tokens / nextn.shared_head_head) too."""
    from gguf_fixtures import _permute_rows

    block = f"blk.{hf_config.num_hidden_layers}."
    out: dict[str, np.ndarray] = {}
    for name, gguf_name in GGUF_HEAD_NAMES.items():
        if name not in head:
            continue
        value = head[name]
        if gguf_name == "attn_q.weight":
            value = _permute_rows(value, hf_config.num_attention_heads)
        elif gguf_name == "attn_k.weight":
            value = _permute_rows(value, hf_config.num_key_value_heads)
        out[block + gguf_name] = value
    for proj, gguf_name in GGUF_HEAD_EXPERTS.items():
        pattern = re.compile(rf"^mtp\.layers\.1\.mixer\.experts\.(\d+)\.{proj}\.weight$")
        experts = sorted((int(m[1]), v) for n, v in head.items() if (m := pattern.match(n)))
        out[block + gguf_name] = np.stack([v for _, v in experts])
    for name, value in (copies or {}).items():
        out[block + name] = value
    return out


def head_from_gguf(path: Path) -> tuple[dict[str, np.ndarray], int]:
    """The head's tensors under the released names, read back with gguf-py alone
    (dequantized, q / k rows un-permuted, experts split); and the head's block index."""
    from gguf_fixtures import _unpermute_rows, dequantized_arrays

    arrays, metadata = dequantized_arrays(path)
    arch = metadata["general.architecture"]
    block = int(metadata[f"{arch}.block_count"]) - int(metadata[f"{arch}.nextn_predict_layers"])
    kv = metadata[f"{arch}.attention.head_count_kv"]
    heads = {"attn_q.weight": int(metadata[f"{arch}.attention.head_count"]), "attn_k.weight": kv}
    by_gguf = {v: k for k, v in GGUF_HEAD_NAMES.items()}
    out: dict[str, np.ndarray] = {}
    prefix = f"blk.{block}."
    for name, value in arrays.items():
        if not name.startswith(prefix):
            continue
        rest = name[len(prefix) :]
        if rest in heads:
            count = heads[rest][block] if isinstance(heads[rest], list) else heads[rest]
            value = _unpermute_rows(value, int(count))
        if rest in by_gguf:
            out[by_gguf[rest]] = value
        for proj, gguf_name in GGUF_HEAD_EXPERTS.items():
            if rest == gguf_name:
                for e in range(value.shape[0]):
                    out[f"mtp.layers.1.mixer.experts.{e}.{proj}.weight"] = value[e]
    return out, block


# ----------------------------------------------------------------------------- Omni
def write_omni_mtp_checkpoint(directory: Path, seed: int = 0) -> tuple[Path, Any, dict]:
    """A tiny Omni checkpoint (vision tower, no audio) whose language model declares a head,
    with the head's tensors added under `language_model.mtp.*`. Returns (dir, the Omni
    model, head tensors without the prefix)."""
    from transformers.models.nemotron_h_omni.configuration_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3_Config,
    )
    from transformers.models.nemotron_h_omni.modeling_nemotron_h_omni import (
        NemotronH_Omni_Reasoning_V3,
    )

    from nemotron_reference import TINY_BASE, randomize
    from omni_fixtures import TINY_VISION

    text = {**TINY_BASE, "layers_block_type": HEAD_PATTERN, "num_nextn_predict_layers": 1}
    config = NemotronH_Omni_Reasoning_V3_Config(
        vision_config=dict(TINY_VISION),
        text_config=text,
        vision_hidden_size=TINY_VISION["hidden_size"],
        projector_hidden_size=40,
        downsample_ratio=0.5,
        video_temporal_patch_size=2,
        image_token_id=90,
        video_token_id=91,
    )
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.text_config._experts_implementation = "eager"
    torch.manual_seed(seed)
    model = NemotronH_Omni_Reasoning_V3(config).eval()
    randomize(model.language_model, seed)
    model.save_pretrained(directory)
    head = head_tensors(global_head_shape(model.language_model.config), np.random.default_rng(9))
    path = directory / "model.safetensors"
    tensors = load_file(path)
    prefixed = {"language_model." + name: value for name, value in head.items()}
    save_file({**tensors, **prefixed}, path, metadata={"format": "pt"})
    return directory, model, head


def omni_embedder(package_dir: Path) -> Callable[[np.ndarray], np.ndarray]:
    """Text ids -> inputs_embeds with the package's embedding.onnx (no media features)."""
    import onnxruntime as ort

    session = ort.InferenceSession(
        str(package_dir / "embedding.onnx"), providers=["CPUExecutionProvider"]
    )

    def embed(ids: np.ndarray) -> np.ndarray:
        feeds: dict[str, np.ndarray] = {}
        for value in session.get_inputs():
            if value.name == "input_ids":
                feeds[value.name] = ids
            else:  # media features: none in a text prompt
                width = int(value.shape[-1])
                feeds[value.name] = np.zeros((0, width), dtype=np.float32)
        return session.run(None, feeds)[0]

    return embed


# ----------------------------------------------------------------------------- new layouts
def edit_config(directory: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite a checkpoint's config.json with `edit` applied (the released spelling of a
    field transformers would write otherwise)."""
    import json

    path = directory / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw, indent=2))


def write_lightning_checkpoint(
    directory: Path, head_prefix: str = "", overrides: dict[str, Any] | None = None, seed: int = 0
) -> tuple[Path, Any, dict[str, np.ndarray]]:
    """A Nemotron 3.5 Lightning-style checkpoint: transformers' names (`model.` prefix), the
    head declared as num_nextn_predict_layers 2 with the pattern "*E" (one depth that both
    drafts repeat), its tensors under `head_prefix` + mtp.layers.{0,1}. Returns (dir, the
    reference decoder, head tensors under their mtp.* names)."""
    checkpoint, model, head = write_nemotron_h_mtp_checkpoint(directory, overrides, seed)

    def lightning(raw: dict[str, Any]) -> None:
        raw["num_nextn_predict_layers"] = 2
        raw.pop("mtp_layers_block_type", None)
        raw["mtp_hybrid_override_pattern"] = "*E"

    edit_config(checkpoint, lightning)
    if head_prefix:
        path = checkpoint / "model.safetensors"
        tensors = load_file(path)
        renamed = {(head_prefix + n if n in head else n): v for n, v in tensors.items()}
        save_file(renamed, path, metadata={"format": "pt"})
    return checkpoint, model, head


def drive_chained_drafts(
    model: Any,
    reference: MTPHeadReference,
    package_dir: Path,
    config: NemotronHConfig,
    *,
    drafts: int,
    prompt_length: int = 9,
    seed: int = 1,
) -> list[Comparison]:
    """One prefill of the package's decoder and of transformers, then `drafts` chained head
    calls on both sides: the first over (prompt tokens t+1, decoder hidden t), each further
    one over (the previous draft, the head's own last mtp_hidden_states), through the same
    head weights. The drafted token is the reference's argmax, fed to both sides."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, size=(1, prompt_length)).astype(np.int64)
    mask = np.ones_like(ids)
    decoder = DecoderSession(package_dir / "model.onnx")
    head = HeadSession(package_dir / "mtp.onnx", config)
    captured: list[torch.Tensor] = []
    hook = _final_norm_hook(model, captured)
    out: list[Comparison] = []
    try:
        with pinned_torch():
            ref = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            ours = decoder.step(ids, mask)
            ref_hidden = captured.pop().numpy()
            token = ref.logits[:, -1].argmax(-1).numpy()[:, None].astype(np.int64)
            pairs = np.concatenate([ids[:, 1:], token], axis=1)
            ref_in, our_in, full = (pairs, ref_hidden), (pairs, ours["hidden_states"]), mask
            for depth in range(drafts):
                ref_out = reference.step(ref_in[0], ref_in[1], full)
                our_out = head.step(our_in[0], our_in[1], full)
                real = np.ones(ref_out["logits"].shape[:2], bool)
                _compare_head(out, f"draft{depth}", our_out, ref_out, real, full.astype(bool))
                draft = ref_out["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
                ref_in = (draft, ref_out["mtp_hidden_states"][:, -1:])
                our_in = (draft, our_out["mtp_hidden_states"][:, -1:])
                full = np.concatenate([full, np.ones((1, 1), np.int64)], axis=1)
    finally:
        hook.remove()
    return out


def write_super_checkpoint(
    directory: Path, seed: int = 0
) -> tuple[Path, Any, dict[str, np.ndarray]]:
    """A Nemotron 3 Super / Ultra-style checkpoint: latent MoE (moe_latent_size; the head's MoE
    projects into the latent space too: fc1_latent_proj / fc2_latent_proj), routed scaling
    5.0, the released `backbone.` names and spelling (mtp_hybrid_override_pattern "*E",
    num_nextn_predict_layers 1). Returns (dir, reference decoder, head tensors)."""
    overrides = {"moe_latent_size": 16, "routed_scaling_factor": 5.0}
    checkpoint, model, head = write_nemotron_h_mtp_checkpoint(directory, overrides, seed)
    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    released = {
        ("backbone." + n.removeprefix("model.") if n.startswith("model.") else n): v
        for n, v in tensors.items()
    }
    save_file(released, path, metadata={"format": "pt"})

    def spelled(raw: dict[str, Any]) -> None:
        raw.pop("mtp_layers_block_type", None)
        raw["mtp_hybrid_override_pattern"] = "*E"

    edit_config(checkpoint, spelled)
    return checkpoint, model, head
