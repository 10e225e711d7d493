"""genai_config.json for onnxruntime-genai, written from the same cache ABI as the graph."""

from __future__ import annotations

from typing import Any

from mobius_lite.configs import NemotronHConfig
from mobius_lite.enums import LayerKind


def _token_ids(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return value


def genai_config(
    config: NemotronHConfig,
    decoder_filename: str = "model.onnx",
    provider: str = "cpu",
    context_length: int | None = None,
) -> dict[str, Any]:
    """The onnxruntime-genai config: model type "decoder" with hybrid cache name templates.

    onnxruntime-genai 0.18 rejects model.type "nemotron_h"; "decoder" loads, and its
    past/present templates describe attention KV and Mamba conv/recurrent states by the
    package's own names (global layer indices).
    """
    attention = config.layers_of(LayerKind.ATTENTION)
    head = attention[0].attention if attention else None
    eos = config.eos_token_id
    session_options: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": []}
    if provider == "cuda":
        session_options["provider_options"] = [{"cuda": {}}]
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
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
            "past_conv_names": "past_key_values.%d.conv_state",
            "past_recurrent_names": "past_key_values.%d.recurrent_state",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
            "present_conv_names": "present.%d.conv_state",
            "present_recurrent_names": "present.%d.recurrent_state",
        },
    }
    return {
        "model": {
            "bos_token_id": config.bos_token_id,
            "context_length": context_length or config.max_position_embeddings,
            "decoder": decoder,
            "eos_token_id": _token_ids(eos),
            "pad_token_id": config.pad_token_id if config.pad_token_id is not None else eos,
            "type": "decoder",
            "vocab_size": config.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context_length or config.max_position_embeddings,
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
