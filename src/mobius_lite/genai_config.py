"""genai_config.json for onnxruntime-genai, written from the same cache ABI as the graph.

What onnxruntime-genai 0.18 does with it (checked by experiment, docs/genai.md):
- model.type "decoder" loads; "nemotron_h" is rejected ("Unsupported model_type").
- KV cache: it discovers the attention layers from the graph inputs matching
  past_key_names, so attention at global layer indices (e.g. only layer 2) is fine, and it
  reads each layer's KV head count / head size from the graph when they vary.
- Recurrent state: it discovers the layers from the inputs matching past_recurrent_names and
  pairs each with past_conv_names; the first such layer's conv and recurrent shapes and element
  types are used for every layer (see genai_limitations).
- A package without attention layers, or without Mamba layers, loads and generates.
- past_present_share_buffer must stay false: the graph concatenates past and new K/V, which
  a shared fixed-size buffer cannot hold.
- Unknown keys anywhere in the file are a parse error, so nothing else may be added here.
- A package with the multi-token-prediction head (mtp.onnx) gets a `model.mtp` section and
  the decoder's `hidden_states` output named, as og.MtpGenerator reads them; the head's own
  og.Model is the package's config with the decoder section replaced by the head's
  (`mtp_head_overlay`, written to the package as genai_mtp_overlay.json, applied with
  og.Config.overlay): 0.18 refuses a second config folder that points at ../mtp.onnx
  ("path traversal"). `speculative.max_draft_tokens` is the head's depth
  (num_nextn_predict_layers), MtpGenerator's default drafts per round; a head of distinct
  depths points genai at depth 0 (mtp.onnx) only, with max_draft_tokens 1. 0.18's MtpGenerator
  fails on the CPU provider for float32 logits, which every package returns ("Cast - input
  and output types are the same"; docs/genai.md).
- An Omni package (a decoder taking inputs_embeds, an embedding graph, a vision encoder) is
  written in its VLM layout, model.type "phi3v" with "vision" and "embedding" sections:
  0.18 then runs text prompts through embedding -> decoder, greedy tokens identical to
  mobius_lite.run.omni_session (tests/test_genai.py). It has no RADIO processor: image prompts
  must go through mobius_lite.run.omni_session / `mobius generate` (its phi3v pixel values do not
  fit the vision graph's inputs and are refused at run time, never silently misread).
"""

from __future__ import annotations

from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.layers import MTP_SCOPE
from mobius_lite.enums import LayerKind, Precision, StateRole
from mobius_lite.graphs.cache import cache_tensors
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    HIDDEN_STATES,
    IMAGE_FEATURES,
    IMAGE_GRID_HW,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LOGITS,
    MTP_HIDDEN_STATES,
    PIXEL_VALUES,
)

MODEL_TYPE = "decoder"


def _token_ids(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def _template(role: StateRole, present: bool, scope: str = "") -> str:
    """The cache name with %d in place of the layer index (the package's own names); with
    `scope` ("mtp") the head's names, past_key_values.mtp.%d.key."""
    layer = f"{scope}.%d" if scope else "%d"
    return role.present_name(layer) if present else role.past_name(layer)


def genai_limitations(
    config: NemotronHConfig, precision: Precision | str = Precision.F32
) -> list[str]:
    """What onnxruntime-genai 0.18 cannot run for this config's cache ABI (empty: nothing).

    Its RecurrentState allocates every Mamba layer's conv and recurrent state with the shape and
    element type of the first Mamba layer, so layers whose states differ are rejected by
    onnxruntime at the first call ("Got invalid dimensions for input ...").
    """
    cache = cache_tensors(config.layers, Precision.parse(precision).ir_dtype)
    problems = []
    for role in (StateRole.CONV, StateRole.RECURRENT):
        kinds = {(c.past_shape[1:], c.dtype) for c in cache if c.role is role}
        if len(kinds) > 1:
            found = sorted(f"{list(shape)} {dtype.name}" for shape, dtype in kinds)
            problems.append(
                f"Mamba {role.value} tensors differ between layers ({'; '.join(found)}): "
                "onnxruntime-genai 0.18 gives every layer the first Mamba layer's shape and type"
            )
    return problems


# genai's search section: greedy, one beam, past and present K/V in separate buffers
GREEDY_SEARCH: dict[str, Any] = {
    "diversity_penalty": 0.0,
    "do_sample": False,
    "early_stopping": True,
    "length_penalty": 1.0,
    "min_length": 0,
    "no_repeat_ngram_size": 0,
    "num_beams": 1,
    "num_return_sequences": 1,
    "past_present_share_buffer": False,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_k": 1,
    "top_p": 1.0,
}

VLM_MODEL_TYPE = "phi3v"  # the genai 0.18 type whose layout is vision + embedding + decoder


def genai_config(
    config: NemotronHConfig,
    decoder_filename: str = "model.onnx",
    provider: str = "cpu",
    context_length: int | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
    mtp_filename: str | None = None,
) -> dict[str, Any]:
    """The onnxruntime-genai config: model type "decoder" with hybrid cache name templates, or,
    when `sections` brings "embedding" (and "vision") graph sections, the VLM layout whose
    decoder takes inputs_embeds.

    The past/present templates name attention K/V and Mamba conv/recurrent states by the
    package's own names (global layer indices); greedy search by default. `mtp_filename`
    (a text package with the head): the decoder's hidden_states output and the `model.mtp`
    section og.MtpGenerator reads.
    """
    attention = config.layers_of(LayerKind.ATTENTION)
    head = attention[0].attention if attention else None
    eos = _token_ids(config.eos_token_id)
    first_eos = eos[0] if isinstance(eos, list) else eos
    session_options: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": []}
    if provider == "cuda":
        session_options["provider_options"] = [{"cuda": {}}]
    # Without attention layers these three are unused by onnxruntime-genai; it still wants them.
    decoder: dict[str, Any] = {
        "session_options": session_options,
        "filename": decoder_filename,
        "head_size": head.head_dim if head else 1,
        "hidden_size": config.hidden_size,
        "num_attention_heads": head.num_heads if head else 1,
        "num_key_value_heads": head.num_kv_heads if head else 1,
        "num_hidden_layers": config.num_hidden_layers,
        "inputs": {
            "input_ids": INPUT_IDS,
            "attention_mask": ATTENTION_MASK,
            "past_key_names": _template(StateRole.KEY, present=False),
            "past_value_names": _template(StateRole.VALUE, present=False),
            "past_conv_names": _template(StateRole.CONV, present=False),
            "past_recurrent_names": _template(StateRole.RECURRENT, present=False),
        },
        "outputs": {
            "logits": LOGITS,
            "present_key_names": _template(StateRole.KEY, present=True),
            "present_value_names": _template(StateRole.VALUE, present=True),
            "present_conv_names": _template(StateRole.CONV, present=True),
            "present_recurrent_names": _template(StateRole.RECURRENT, present=True),
        },
    }
    length = context_length or config.max_position_embeddings
    sections = dict(sections or {})
    model_type = MODEL_TYPE
    if "embedding" in sections:
        model_type = VLM_MODEL_TYPE
        del decoder["inputs"]["input_ids"]
        decoder["inputs"]["inputs_embeds"] = INPUTS_EMBEDS
    elif mtp_filename is not None and config.has_mtp_head:
        decoder["outputs"]["hidden_states"] = HIDDEN_STATES
        sections["mtp"] = mtp_section(config, mtp_filename)
    extra: dict[str, Any] = {}
    if "mtp" in sections:
        extra["speculative"] = {"max_draft_tokens": genai_draft_tokens(config)}
    return {
        "model": {
            "bos_token_id": config.bos_token_id,
            "context_length": length,
            "decoder": decoder,
            **sections,
            "eos_token_id": eos,
            "pad_token_id": config.pad_token_id if config.pad_token_id is not None else first_eos,
            "type": model_type,
            "vocab_size": config.vocab_size,
        },
        "search": {**GREEDY_SEARCH, "max_length": length},
        **extra,
    }


# genai's key -> the package's name, for the keys its schema knows (others are parse errors)
SECTION_KEYS = {
    "vision": (
        {"pixel_values": PIXEL_VALUES, "image_sizes": IMAGE_GRID_HW},
        {"image_features": IMAGE_FEATURES},
    ),
    "embedding": (
        {"input_ids": INPUT_IDS, "image_features": IMAGE_FEATURES},
        {"inputs_embeds": INPUTS_EMBEDS},
    ),
}


def graph_section(key: str, filename: str, inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    """The genai section `key` ("vision", "embedding") of a graph file: the inputs / outputs
    its schema names, mapped to the graph's own names. The graph's other inputs (an Omni
    embedding graph's audio_features) are not in genai's schema."""
    known_in, known_out = SECTION_KEYS[key]
    return {
        "filename": filename,
        "inputs": {k: v for k, v in known_in.items() if v in inputs},
        "outputs": {k: v for k, v in known_out.items() if v in outputs},
    }


def _head_attention(config: NemotronHConfig) -> Any:
    """The head's first attention block's sizes (the head has at least one: validated)."""
    return next(layer.attention for layer in config.mtp_layers if layer.kind is LayerKind.ATTENTION)


def genai_draft_tokens(config: NemotronHConfig) -> int:
    """MtpGenerator's default drafts per round (genai's own default is 4): the head's depth
    when its one depth is repeated; 1 for a head of distinct depths, of which MtpGenerator
    runs only mtp.onnx (depth 0: one head module, its Engine refuses num_hidden_layers other
    than 1), so a second draft there would repeat depth 0's weights."""
    return config.num_nextn_predict_layers if config.mtp_depths == 1 else 1


def mtp_section(config: NemotronHConfig, filename: str) -> dict[str, Any]:
    """genai's `model.mtp`: the head's file, its KV sizes, the decoder output that feeds it
    (`main_hidden_states`) and the head output MtpGenerator chains drafts with
    (`outputs.hidden_states`), every name the package's own."""
    attention = _head_attention(config)
    return {
        "filename": filename,
        "num_hidden_layers": 1,  # genai's schema: one head module, chained for more drafts
        "num_key_value_heads": attention.num_kv_heads,
        "head_size": attention.head_dim,
        "main_hidden_states": HIDDEN_STATES,
        "inputs": {
            "input_ids": INPUT_IDS,
            "hidden_states": HIDDEN_STATES,
            "attention_mask": ATTENTION_MASK,
            "past_key_names": _template(StateRole.KEY, present=False, scope=MTP_SCOPE),
            "past_value_names": _template(StateRole.VALUE, present=False, scope=MTP_SCOPE),
        },
        "outputs": {
            "logits": LOGITS,
            "hidden_states": MTP_HIDDEN_STATES,
            "present_key_names": _template(StateRole.KEY, present=True, scope=MTP_SCOPE),
            "present_value_names": _template(StateRole.VALUE, present=True, scope=MTP_SCOPE),
        },
    }


def mtp_head_overlay(config: NemotronHConfig, filename: str) -> dict[str, Any]:
    """The overlay that turns the package's genai_config into the head's own og.Model: its
    decoder section replaced by mtp.onnx's I/O (hidden_states in, its K/V, no Mamba state).

    Every key the package's decoder section names is overwritten (an overlay cannot delete
    keys): the Mamba templates point at head names no graph input has, and the decoder's
    `hidden_states` output is cleared (the head's chained-draft output is read by name)."""
    attention = _head_attention(config)
    scoped = {
        role: (_template(role, False, MTP_SCOPE), _template(role, True, MTP_SCOPE))
        for role in StateRole
    }
    return {
        "model": {
            "decoder": {
                "filename": filename,
                "head_size": attention.head_dim,
                "hidden_size": config.hidden_size,
                "num_attention_heads": attention.num_heads,
                "num_key_value_heads": attention.num_kv_heads,
                "num_hidden_layers": len(config.mtp_depth_layers(0)),
                "inputs": {
                    "input_ids": INPUT_IDS,
                    "attention_mask": ATTENTION_MASK,
                    "hidden_states": HIDDEN_STATES,
                    "past_key_names": scoped[StateRole.KEY][0],
                    "past_value_names": scoped[StateRole.VALUE][0],
                    "past_conv_names": scoped[StateRole.CONV][0],
                    "past_recurrent_names": scoped[StateRole.RECURRENT][0],
                },
                "outputs": {
                    "logits": LOGITS,
                    "hidden_states": "",
                    "present_key_names": scoped[StateRole.KEY][1],
                    "present_value_names": scoped[StateRole.VALUE][1],
                    "present_conv_names": scoped[StateRole.CONV][1],
                    "present_recurrent_names": scoped[StateRole.RECURRENT][1],
                },
            }
        }
    }
