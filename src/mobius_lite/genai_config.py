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
- An Omni package (a decoder taking inputs_embeds, an embedding graph, a vision encoder) is
  written in its VLM layout, model.type "phi3v" with "vision" and "embedding" sections:
  0.18 then runs text prompts through embedding -> decoder, greedy tokens identical to
  mobius_lite.omni_runtime (tests/test_genai.py). It has no RADIO processor: image prompts
  must go through mobius_lite.omni_runtime / `mobius generate` (its phi3v pixel values do not
  fit the vision graph's inputs and are refused at run time, never silently misread).
"""

from __future__ import annotations

from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind, Precision, StateRole
from mobius_lite.graphs.cache import cache_tensors

MODEL_TYPE = "decoder"


def _token_ids(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def _template(role: StateRole, present: bool) -> str:
    """The cache name with %d in place of the layer index (the package's own names)."""
    name = role.present_name(0) if present else role.past_name(0)
    return name.replace(".0.", ".%d.", 1)


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


VLM_MODEL_TYPE = "phi3v"  # the genai 0.18 type whose layout is vision + embedding + decoder


def genai_config(
    config: NemotronHConfig,
    decoder_filename: str = "model.onnx",
    provider: str = "cpu",
    context_length: int | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The onnxruntime-genai config: model type "decoder" with hybrid cache name templates, or,
    when `sections` brings "embedding" (and "vision") graph sections, the VLM layout whose
    decoder takes inputs_embeds.

    The past/present templates name attention K/V and Mamba conv/recurrent states by the
    package's own names (global layer indices); greedy search by default.
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
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "past_key_names": _template(StateRole.KEY, present=False),
            "past_value_names": _template(StateRole.VALUE, present=False),
            "past_conv_names": _template(StateRole.CONV, present=False),
            "past_recurrent_names": _template(StateRole.RECURRENT, present=False),
        },
        "outputs": {
            "logits": "logits",
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
        decoder["inputs"]["inputs_embeds"] = "inputs_embeds"
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
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


# genai's key -> the package's name, for the keys its schema knows (others are parse errors)
SECTION_KEYS = {
    "vision": (
        {"pixel_values": "pixel_values", "image_sizes": "image_grid_hw"},
        {"image_features": "image_features"},
    ),
    "embedding": (
        {"input_ids": "input_ids", "image_features": "image_features"},
        {"inputs_embeds": "inputs_embeds"},
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
