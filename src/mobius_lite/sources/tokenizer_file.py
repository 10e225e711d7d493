"""A checkpoint's tokenizer.json, loaded once at build with the `tokenizers` library.

A package carries the checkpoint's tokenizer.json unchanged; a broken one (cut short, not JSON,
an unknown model type) used to be published without a word and fail later, in `generate` and
in onnxruntime-genai. The build refuses it instead (exit 2 from the CLI): a tokenizer that
cannot load is a damaged checkpoint file, like a non-finite weight, and dropping it silently
would publish a package that looks complete. The message says how to go on: repair the file
(re-download it), or remove it, which exports a package without a tokenizer (it runs from
token ids).
"""

from __future__ import annotations

from pathlib import Path

from mobius_lite.errors import CheckpointError
from mobius_lite.layout import TOKENIZER_FILE


def check_tokenizer_json(extra_files: dict[str, Path | bytes]) -> None:
    """Raise CheckpointError when the tokenizer.json among `extra_files` does not load."""
    data = extra_files.get(TOKENIZER_FILE)
    if data is None:
        return
    from tokenizers import Tokenizer

    where = str(data) if isinstance(data, Path) else f"the rebuilt {TOKENIZER_FILE}"
    try:
        text = data.read_text(encoding="utf-8") if isinstance(data, Path) else data.decode()
        Tokenizer.from_str(text)
    except Exception as exc:  # noqa: BLE001 (tokenizers raises plain Exception)
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CheckpointError(
            f"{where} cannot be loaded as a tokenizer ({reason[:160]}); the package would "
            "carry it and generate would fail. Repair it (re-download the checkpoint's "
            f"{TOKENIZER_FILE}) or remove it to export a package without a tokenizer, which "
            "runs from token ids"
        ) from None
