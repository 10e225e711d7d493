"""Nemotron-H Omni checkpoint names: the graphs' parameters (transformers 5.x module names,
with RADIO's fused attn.qkv) and where released checkpoints and in-memory transformers models
keep them.

The rename table (graph name prefix -> released checkpoint prefix), applied first match wins;
it is transformers' own conversion mapping for nemotron_h_omni and radio, read in reverse:
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace

from mobius_lite.models.nemotron_h_names import SafetensorsNames, SourceLayout
from mobius_lite.sources.names import Candidate, NameMap, SourceRef, as_ref

LANGUAGE_MODEL = "language_model."
# Where an Omni checkpoint holds its Nemotron-H decoder: a quantization config may name the
# decoder's modules with or without it (formats/modelopt/quant_config.py module_aliases).
DECODER_SCOPES = (LANGUAGE_MODEL,)
RADIO = "vision_model.radio_model.model."
# (graph pattern, released replacement)
RELEASED_NAMES: tuple[tuple[str, str], ...] = (
    (
        r"^vision_model\.embeddings\.video_patch_projection\.",
        RADIO + "patch_generator.video_embedder.",
    ),
    (r"^vision_model\.embeddings\.patch_projection\.", RADIO + "patch_generator.embedder."),
    (r"^vision_model\.embeddings\.position_embedding$", RADIO + "patch_generator.pos_embed"),
    (r"^vision_model\.embeddings\.cls_register_token$", RADIO + "patch_generator.cls_token.token"),
    (r"^vision_model\.encoder\.layer\.(\d+)\.attention\.o_proj\.", RADIO + r"blocks.\1.attn.proj."),
    (r"^vision_model\.encoder\.layer\.(\d+)\.attention\.qkv\.", RADIO + r"blocks.\1.attn.qkv."),
    (r"^vision_model\.encoder\.layer\.", RADIO + "blocks."),
    (r"^multi_modal_projector\.layer_norm\.", "mlp1.0."),
    (r"^multi_modal_projector\.linear_1\.", "mlp1.1."),
    (r"^multi_modal_projector\.linear_2\.", "mlp1.3."),
    (r"^vision_final_layernorm\.", "vision_projector.vision_final_layernorm."),
    (r"^audio_tower\.", "sound_encoder.encoder."),
    (r"^embed_audio\.layer_norm\.", "sound_projection.norm."),
    (r"^embed_audio\.linear_1\.", "sound_projection.linear1."),
    (r"^embed_audio\.linear_2\.", "sound_projection.linear2."),
)
_QKV = re.compile(
    r"^(?P<prefix>vision_model\.encoder\.layer\.\d+\.attention)\.qkv\.(?P<kind>weight|bias)$"
)
# Released checkpoint tensors no graph computes with, and why.
OMNI_UNUSED = {
    r"^vision_model\.(radio_model\.)?summary_idxs$": "RADIO summary-token indices: the summary "
    "output is not part of the Omni features",
    r"^vision_model\.(radio_model\.)?input_conditioner\.": "RADIO's input conditioner: Omni "
    "detaches it, the processor normalises pixels",
    r"^(audio_tower|sound_encoder\.encoder)\.feature_extractor\.": "mel extraction runs on the "
    "host (mobius_lite.media.audio_features), as in transformers' processor",
    r"\.num_batches_tracked$": "BatchNorm step counter (training only)",
}


def released_name(name: str) -> str | None:
    """The released checkpoint's name for graph parameter `name` (None: no rename applies)."""
    for pattern, replacement in RELEASED_NAMES:
        if re.search(pattern, name):
            return re.sub(pattern, replacement, name, count=1)
    return None


class OmniTowerNames:
    """The towers' and projectors' parameters: released name, transformers name, and for the
    fused qkv the transformers chunks q_proj / k_proj / v_proj concatenated."""

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        out: list[Candidate] = []
        released = released_name(target)
        if released is not None:
            out.append((released,))
        out.append((target,))
        fused = _QKV.match(target)
        if fused:
            parts = tuple(
                f"{fused['prefix']}.{p}.{fused['kind']}" for p in ("q_proj", "k_proj", "v_proj")
            )
            out.append(SourceRef(parts, concat=True))
        return out


class LanguageModelNames:
    """The decoder's parameters under the Omni checkpoint's `language_model.` prefix: the
    names `inner` (the source kind's name map of a Nemotron-H checkpoint; safetensors' by
    default) gives them, prefixed."""

    def __init__(self, inner: NameMap | None = None) -> None:
        self.inner = inner if inner is not None else SafetensorsNames()

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        out: list[Candidate] = []
        for candidate in self.inner.alternatives(target, shape):
            ref = as_ref(candidate)
            out.append(
                SourceRef(
                    tuple(LANGUAGE_MODEL + n for n in ref.names),
                    ref.reshape,
                    ref.concat,
                    ref.layout,
                )
            )
        return out


def language_model_rules(rules: Mapping[str, str]) -> dict[str, str]:
    """A Nemotron-H checkpoint's unused-tensor rules (name regex -> reason) for an Omni
    checkpoint's language model: a pattern anchored at the name's start is anchored under
    `language_model.`; one that matches anywhere (a suffix) stays as it is."""
    return {
        ("^" + re.escape(LANGUAGE_MODEL) + p[1:] if p.startswith("^") else p): reason
        for p, reason in rules.items()
    }


def language_model_layout(layout: SourceLayout) -> SourceLayout:
    """The source kind's layout of a Nemotron-H checkpoint (its name maps, packed or under
    `--dequantize`, and its unused tensors) applied to an Omni checkpoint's language model."""
    dequantized = layout.dequantized_names
    return replace(
        layout,
        names=LanguageModelNames(layout.names),
        unused=language_model_rules(layout.unused),
        dequantized_names=None if dequantized is None else LanguageModelNames(dequantized),
    )
