"""The package's tokenizer.json: loading it, and the range of token ids it can produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mobius_lite.errors import ConfigError
from mobius_lite.listing import format_names
from mobius_lite.optional import require

TOKENIZER_FILE = "tokenizer.json"


def load_tokenizer(package: Path) -> Any:
    """The package's tokenizers.Tokenizer; ConfigError when the package has none."""
    path = Path(package) / TOKENIZER_FILE
    if not path.is_file():
        raise ConfigError(
            f"{package} has no {TOKENIZER_FILE}; generate needs the package tokenizer (export "
            "from a checkpoint that has one)"
        )
    tokenizers = require("tokenizers", "generate")
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a malformed file
        raise ConfigError(f"{path} is not a readable tokenizer ({exc})") from None


def _tokens_by_id(tokenizer_json: Path | bytes) -> dict[int, str] | None:
    """id -> token of tokenizer.json (its model's vocabulary and its added tokens), read from
    the JSON alone; None when the file cannot be read."""
    try:
        text = tokenizer_json if isinstance(tokenizer_json, bytes) else tokenizer_json.read_bytes()
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    tokens: dict[int, str] = {}
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        tokens.update({i: t for t, i in vocab.items() if isinstance(i, int)})
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        tokens.update({i: str(entry[0]) for i, entry in enumerate(vocab) if entry})
    for added in data.get("added_tokens") or []:
        if isinstance(added.get("id"), int):
            tokens[added["id"]] = str(added.get("content"))
    return tokens


def tokenizer_id_count(tokenizer_json: Path | bytes) -> int | None:
    """One more than the largest id tokenizer.json can produce; None when it does not say."""
    tokens = _tokens_by_id(tokenizer_json)
    return max(tokens) + 1 if tokens else None


def vocabulary_mismatch(tokenizer_json: Path | bytes, vocab_size: int) -> str | None:
    """A warning when the tokenizer can produce ids the model has no embedding for (the
    package still exports: `generate` refuses such an id when a prompt contains one)."""
    tokens = _tokens_by_id(tokenizer_json) or {}
    beyond = sorted(i for i in tokens if i >= vocab_size)
    if not beyond:
        return None
    shown = format_names([f"{i} {tokens[i]!r}" for i in beyond], 3, more=" and {} more")
    return (
        f"the tokenizer has {max(tokens) + 1} token ids but the model's vocabulary has "
        f"{vocab_size}: {len(beyond)} of its tokens ({shown}) "
        f"{'has' if len(beyond) == 1 else 'have'} no embedding, and "
        "generate refuses a prompt that contains one; check that tokenizer.json belongs to "
        "this checkpoint"
    )
