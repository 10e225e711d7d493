"""GGUF tokenizer metadata -> tokenizer.json + tokenizer_config.json bytes.

A GGUF has no tokenizer.json: the vocabulary, merges and special ids are `tokenizer.ggml.*`
metadata. transformers' own GGUF tokenizer conversion (integrations.gguf.
gguf_tokenizer_mapping) rebuilds the fast tokenizer from them; this module feeds it the
metadata GGUFCheckpoint already parsed and adds the BOS/EOS template llama.cpp applies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer, processors

from mobius_lite.errors import CheckpointError

TOKENIZER_PREFIX = "tokenizer."
MODEL_KEY = "tokenizer.ggml.model"
MERGES_KEY = "tokenizer.ggml.merges"
BYTE_LEVEL_BPE = "gpt2"  # llama.cpp's name for a byte-level BPE vocabulary
SPECIAL_IDS = {
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}


def _grouped(metadata: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """transformers' (tokenizer_dict, tokenizer_config) from our parsed metadata."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    groups = {
        group: {
            name: metadata[TOKENIZER_PREFIX + key]
            for key, name in renames.items()
            if TOKENIZER_PREFIX + key in metadata
        }
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    return groups["tokenizer"], groups["tokenizer_config"]


def _template(bos: str | None, eos: str | None, ids: dict[str, int]) -> Any:
    """The post-processor that wraps each sequence in the BOS / EOS tokens llama.cpp adds."""

    def wrap(sequence: str) -> list[str]:
        return [*([bos] if bos else []), sequence, *([eos] if eos else [])]

    return processors.TemplateProcessing(
        single=" ".join(wrap("$A")),
        pair=" ".join(wrap("$A") + wrap("$B:1")),
        special_tokens=[(t, ids[t]) for t in dict.fromkeys(x for x in (bos, eos) if x)],
    )


def _only_file_tokens(backend: Tokenizer, tokens: list[str]) -> Tokenizer:
    """The rebuilt tokenizer without the added tokens the file does not list at that id.

    transformers' byte-level rebuild goes through GPT2Tokenizer, whose default special token
    `<|endoftext|>` is appended after the vocabulary (id len(tokens)) when the file has none:
    a token the model has no embedding for, which made every build of such a file warn that
    the tokenizer may not belong to the checkpoint. A tokenizer holds what the file holds.
    """
    data = json.loads(backend.to_str())
    added = data.get("added_tokens") or []
    kept = [t for t in added if t["id"] < len(tokens) and tokens[t["id"]] == t["content"]]
    if len(kept) == len(added):
        return backend
    data["added_tokens"] = kept
    return Tokenizer.from_str(json.dumps(data))


def gguf_tokenizer_files(metadata: Mapping[str, Any]) -> dict[str, bytes]:
    """{"tokenizer.json": ..., "tokenizer_config.json": ...} for the tokenizer a GGUF describes."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    tokenizer_dict, tokenizer_config = _grouped(metadata)
    tokens = tokenizer_dict.get("tokens")
    if not tokens:
        raise CheckpointError("GGUF metadata has no tokenizer.ggml.tokens: no tokenizer to write")
    architecture = str(metadata.get("general.architecture", ""))
    kind = tokenizer_dict.get("tokenizer_type")
    if kind == BYTE_LEVEL_BPE and not tokenizer_dict.get("merges"):
        # transformers would derive merges from scores a BPE file does not have (KeyError)
        raise CheckpointError(
            f"the GGUF tokenizer is byte-level BPE ({MODEL_KEY} = {kind!r}) but has no "
            f"{MERGES_KEY}, so it cannot be rebuilt (llama.cpp refuses such a file too); "
            "re-convert the model with llama.cpp's convert_hf_to_gguf.py, which writes them"
        )
    try:
        backend, _ = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as err:
        raise CheckpointError(f"cannot rebuild the GGUF tokenizer: {err}") from None
    except KeyError as err:  # a field this tokenizer kind needs is absent
        raise CheckpointError(
            f"cannot rebuild the GGUF tokenizer ({MODEL_KEY} = {kind!r}): its metadata has no "
            f"tokenizer.ggml.{err.args[0]}; re-convert the model with llama.cpp's "
            "convert_hf_to_gguf.py"
        ) from None

    backend = _only_file_tokens(backend, list(tokens))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast"}
    for name, key in SPECIAL_IDS.items():
        if key in metadata:
            token_id = int(metadata[key])
            if not 0 <= token_id < len(tokens):
                raise CheckpointError(f"{key}={token_id} is outside the {len(tokens)}-token list")
            config[name] = tokens[token_id]
    config.update(tokenizer_config)
    add_bos = bool(config.get("add_bos_token")) and "bos_token" in config
    add_eos = bool(config.get("add_eos_token")) and "eos_token" in config
    if add_bos or add_eos:
        # llama.cpp adds these ids when tokenizing; the rebuilt tokenizer must do the same.
        ids = {
            config[n]: int(metadata[SPECIAL_IDS[n]])
            for n in ("bos_token", "eos_token")
            if n in config
        }
        backend.post_processor = _template(
            config["bos_token"] if add_bos else None, config["eos_token"] if add_eos else None, ids
        )
    return {
        "tokenizer.json": backend.to_str().encode("utf-8"),
        "tokenizer_config.json": json.dumps(config, indent=2, ensure_ascii=False).encode("utf-8"),
    }
