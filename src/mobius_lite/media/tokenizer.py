"""The package's tokenizer.json: loading it, and the range of token ids it can produce."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mobius_lite.errors import ConfigError
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


def tokenizer_id_count(tokenizer_json: Path | bytes) -> int | None:
    """One more than the largest id tokenizer.json can produce (its model's vocabulary and
    its added tokens), read from the JSON alone; None when the file does not say."""
    try:
        text = tokenizer_json if isinstance(tokenizer_json, bytes) else tokenizer_json.read_bytes()
        data = json.loads(text)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    ids: list[int] = []
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids += [i for i in vocab.values() if isinstance(i, int)]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        ids.append(len(vocab) - 1)
    ids += [t["id"] for t in data.get("added_tokens") or [] if isinstance(t.get("id"), int)]
    return max(ids) + 1 if ids else None


def vocabulary_mismatch(tokenizer_json: Path | bytes, vocab_size: int) -> str | None:
    """A warning when the tokenizer can produce ids the model has no embedding for (the
    package still exports: `generate` refuses such an id when a prompt contains one)."""
    count = tokenizer_id_count(tokenizer_json)
    if count is None or count <= vocab_size:
        return None
    return (
        f"the tokenizer has {count} token ids but the model's vocabulary has {vocab_size}: "
        f"ids {vocab_size} to {count - 1} have no embedding, and generate refuses a prompt "
        "that contains one; check that tokenizer.json belongs to this checkpoint"
    )
