"""Prefill + cached decode parity between an exported package (onnxruntime) and transformers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import mobius_lite
from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind
from mobius_lite.evaluation.metrics import Comparison, compare
from mobius_lite.run.decoder_session import DecoderSession
from reference_fixtures.nemotron_reference import (
    make_reference,
    pinned_torch,
    reference_cache_arrays,
)


@dataclass
class ParityRun:
    comparisons: list[Comparison] = field(default_factory=list)
    reference_tokens: list[list[int]] = field(default_factory=list)
    exported_tokens: list[list[int]] = field(default_factory=list)
    prefill_logits: tuple[np.ndarray, np.ndarray] | None = None  # (exported, reference)

    def failures(self, nrmse: float, cosine: float) -> list[Comparison]:
        return [c for c in self.comparisons if not c.passes(nrmse, cosine)]


def export_reference(
    overrides: dict[str, Any],
    directory: Path,
    seed: int = 0,
    patch: Callable[[Any], None] | None = None,
    edit_checkpoint: Callable[[Path], None] | None = None,
    weights_backend: str = "standard",
):
    model = make_reference(overrides, seed)
    if patch is not None:
        patch(model)
    checkpoint = directory / "checkpoint"
    model.save_pretrained(checkpoint)
    if edit_checkpoint is not None:
        edit_checkpoint(checkpoint)
    package = mobius_lite.build(checkpoint, dtype="f32", weights_backend=weights_backend)
    out = package.save(directory / "package")
    config = NemotronHConfig.from_file(checkpoint)
    return model, config, out


def run_parity(
    overrides: dict[str, Any],
    directory: Path,
    *,
    prompt_length: int = 11,
    decode_steps: int = 5,
    batch: int = 1,
    left_padding: tuple[int, ...] = (),
    seed: int = 0,
    patch: Callable[[Any], None] | None = None,
    edit_checkpoint: Callable[[Path], None] | None = None,
    weights_backend: str = "standard",
) -> ParityRun:
    """Prefill `prompt_length` tokens then `decode_steps` greedy steps on both sides
    (the package built on `weights_backend`).

    Each side is fed its own previous greedy token and its own state. Logits and K/V are
    compared on real (non-padded) positions only: padded positions are never attended to.
    """
    model, config, package_dir = export_reference(
        overrides, directory, seed, patch, edit_checkpoint, weights_backend
    )
    return drive_parity(
        model,
        config,
        package_dir,
        prompt_length=prompt_length,
        decode_steps=decode_steps,
        batch=batch,
        left_padding=left_padding,
        seed=seed,
    )


def drive_parity(
    model: Any,
    config: NemotronHConfig,
    package_dir: Path,
    *,
    prompt_length: int = 11,
    decode_steps: int = 5,
    batch: int = 1,
    left_padding: tuple[int, ...] = (),
    seed: int = 0,
) -> ParityRun:
    """Run a torch reference `model` and the package's decoder side by side (see run_parity)."""
    kinds = [layer.kind for layer in config.layers]
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.vocab_size, size=(batch, prompt_length)).astype(np.int64)
    mask = np.ones_like(ids)
    for row, pad in enumerate(left_padding):
        ids[row, :pad] = config.pad_token_id or 0
        mask[row, :pad] = 0
    real = mask.astype(bool)

    session = DecoderSession(package_dir / "model.onnx")
    run = ParityRun()
    with pinned_torch():
        ref_mask = torch.from_numpy(mask)
        ref = model(
            torch.from_numpy(ids),
            attention_mask=_reference_mask(kinds, ref_mask, prompt_length),
            use_cache=True,
            position_ids=torch.arange(prompt_length).expand(batch, -1),
        )
        cache = ref.cache if hasattr(ref, "cache") else ref.past_key_values
        ours = session.step(ids, mask)
        ref_logits = ref.logits.float().numpy()
        run.prefill_logits = (ours["logits"], ref_logits)
        _compare_step(run, "prefill", ours, ref_logits, cache, kinds, real)

        ref_next = ref_logits[:, -1].argmax(-1)
        our_next = ours["logits"][:, -1].argmax(-1)
        run.reference_tokens.append(ref_next.tolist())
        run.exported_tokens.append(our_next.tolist())
        full_mask = mask
        for step in range(decode_steps):
            full_mask = np.concatenate([full_mask, np.ones((batch, 1), np.int64)], axis=1)
            real = np.concatenate([real, np.ones((batch, 1), bool)], axis=1)
            ref = model(
                torch.from_numpy(ref_next[:, None].astype(np.int64)),
                attention_mask=_reference_mask(kinds, torch.from_numpy(full_mask), 1),
                cache=cache,
                use_cache=True,
                # explicit positions: transformers cannot infer them from a cache that has
                # no attention layer
                position_ids=torch.full((batch, 1), full_mask.shape[1] - 1),
            )
            cache = ref.cache if hasattr(ref, "cache") else ref.past_key_values
            ours = session.step(our_next[:, None].astype(np.int64))
            ref_logits = ref.logits.float().numpy()
            _compare_step(run, f"decode{step}", ours, ref_logits, cache, kinds, real[:, -1:], real)
            ref_next = ref_logits[:, -1].argmax(-1)
            our_next = ours["logits"][:, -1].argmax(-1)
            run.reference_tokens.append(ref_next.tolist())
            run.exported_tokens.append(our_next.tolist())
    return run


def _reference_mask(kinds: list, mask: torch.Tensor, new_tokens: int) -> Any:
    """The reference's own mask, except for models without attention layers.

    transformers builds its causal mask from the cache's attention layers and fails when there
    are none; such models get the per-kind mapping it accepts, holding exactly what
    create_recurrent_attention_mask would give (the trailing new-token mask, or None for a
    single decode token / an all-ones mask).
    """
    if LayerKind.ATTENTION in kinds:
        return mask
    recurrent = None if new_tokens == 1 or bool(mask.all()) else mask[:, -new_tokens:]
    return {"full_attention": None, "linear_attention": recurrent}


def _compare_step(
    run: ParityRun,
    step: str,
    ours: dict[str, np.ndarray],
    ref_logits: np.ndarray,
    cache: Any,
    kinds: list,
    real_tokens: np.ndarray,
    real_keys: np.ndarray | None = None,
) -> None:
    real_keys = real_tokens if real_keys is None else real_keys
    run.comparisons.append(
        compare(f"{step}/logits", ours["logits"][real_tokens], ref_logits[real_tokens])
    )
    for name, expected in reference_cache_arrays(cache, kinds).items():
        actual = ours[name]
        if name.endswith((".key", ".value")):
            # [B, H, T, D] -> real positions only
            actual = actual.transpose(0, 2, 1, 3)[real_keys]
            expected = expected.transpose(0, 2, 1, 3)[real_keys]
        run.comparisons.append(compare(f"{step}/{name}", actual, expected))
