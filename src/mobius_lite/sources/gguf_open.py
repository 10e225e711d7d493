"""open_gguf: a llama.cpp GGUF file (local, a split set, or one file of a hub repository) as an
OpenedCheckpoint: config from its metadata, tokenizer files from its vocabulary, lazy tensors.

Everything is read from the GGUF headers: the config (configs/gguf_metadata.py reads the
metadata as llama.cpp does, cross-checked with an optional config.json; it is handed in
here, as configs sit above sources), the tokenizer
(sources/gguf_tokenizer.py) and each tensor's ggml type, shape and byte range (an unknown type
is one error naming tensor and type, raised here, before anything is written). A hub
repository's GGUF file is fetched with huggingface_hub at the pinned revision under the same
cache and offline rules as safetensors checkpoints (sources/hub.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mobius_lite.errors import ConfigError
from mobius_lite.hub_pins import resolve_revision
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.sources.gguf_file import GGUF, SPLIT_NAME, GGUFCheckpoint
from mobius_lite.sources.gguf_tokenizer import gguf_tokenizer_files
from mobius_lite.sources.hub import (
    HubError,
    ResolvedCheckpoint,
    _cache_revision,
    hub_cache_dir,
    hub_errors,
    hub_offline,
    is_hub_id,
    mistyped_path,
)
from mobius_lite.sources.open import OpenedCheckpoint

TOKENIZER_KEY = "tokenizer.ggml.tokens"
# llama.cpp's `.input_scale` sidecars: activation scales for 4-bit activations, which its own
# graphs read but do not use. Which weights may carry one is the model's check
# (models/nemotron_h_gguf_scales.py); the export is weight-only.
UNUSED_RULES = {
    r"^(blk\.\d+\.[a-z_]+|output)\.input_scale$": (
        "activation scale for 4-bit activations (llama.cpp reads it, no graph uses it); "
        "this export computes weight-only"
    )
}
# why `--quantize-output` alone does not apply (the file's lm_head is never a dense tensor
# the export could quantize as llama.cpp would: the converter or llama-quantize chose it)
OUTPUT_QUANTIZE_REFUSAL = (
    "a GGUF file's lm_head (output.weight, or token_embd when tied) is already stored as a "
    "GGUF type; requantize it with llama-quantize --output-tensor-type instead"
)

# (checkpoint, config.json dict or None) -> config dict: configs/gguf_metadata.py's
# config_from_checkpoint, handed in by the caller (configs sit above sources).
ConfigReader = Callable[[GGUFCheckpoint, dict[str, Any] | None], dict[str, Any]]


def _split_names(filename: str) -> list[str]:
    """Every part's file name of the split set `filename` belongs to (or [filename])."""
    match = SPLIT_NAME.match(Path(filename).name)
    if match is None:
        return [filename]
    count = int(match["count"])
    folder = str(Path(filename).parent)
    prefix = "" if folder == "." else folder + "/"
    return [f"{prefix}{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1)]


def _hub_download(repo: str, filename: str, revision: str | None) -> Path:
    """One file of a hub repository at `revision` (cache / offline rules as sources/hub.py)."""
    import huggingface_hub
    from huggingface_hub import errors as hub_errors_module

    at = f"{repo}@{revision or 'main'}"
    with hub_errors(repo, revision):
        try:
            return Path(
                huggingface_hub.hf_hub_download(
                    repo_id=repo,
                    filename=filename,
                    revision=revision,
                    cache_dir=hub_cache_dir(),
                    local_files_only=hub_offline(),
                )
            )
        except hub_errors_module.LocalEntryNotFoundError:
            raise HubError(
                f"{filename} of {at} is not in the local Hugging Face cache and could not be "
                "fetched (HF_HUB_OFFLINE set, or no network); download it first"
            ) from None
        except hub_errors_module.EntryNotFoundError:
            raise HubError(
                f"{at} has no file {filename}; check --gguf-file (gguf_file=...)"
            ) from None


def resolve_gguf(
    model: str | Path, revision: str | None = None, gguf_file: str | None = None
) -> ResolvedCheckpoint:
    """The local path of the GGUF file (first part of a split set) and where it came from."""
    text = str(model)
    if is_hub_id(text):
        if gguf_file is None:
            no_file = "names no GGUF file (--gguf-file, gguf_file=...)"
            raise mistyped_path(text, no_file) or ConfigError(
                f"{text} is a hub repository: name its GGUF file with --gguf-file "
                "(gguf_file=..., e.g. model-Q4_K_M.gguf)"
            )
        requested = resolve_revision(text, revision)  # the pin: before any hub request
        paths = [_hub_download(text, name, requested) for name in _split_names(gguf_file)]
        commit = _cache_revision(paths[0].parent) or requested
        # hub=False: the file is here already; fetch_weights must not look for safetensors
        return ResolvedCheckpoint(path=paths[0], model=text, revision=commit, hub=False)
    path = Path(text).expanduser()
    if gguf_file is not None:
        if not path.is_dir():
            raise ConfigError(
                f"--gguf-file {gguf_file} (gguf_file=...) needs a directory or hub id, not {text}"
            )
        path = path / gguf_file
    if revision:
        raise ConfigError(
            f"--revision {revision} was given with the local file {path}; a revision selects "
            "a commit of a hub repository: drop --revision (revision=None in Python)"
        )
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    path = path.resolve()
    return ResolvedCheckpoint(path=path, model=str(path), revision=None, hub=False)


def open_gguf(
    model: str | Path,
    read_config: ConfigReader,
    revision: str | None = None,
    gguf_file: str | None = None,
    config_json: str | Path | None = None,
) -> OpenedCheckpoint:
    """An OpenedCheckpoint of kind "gguf": config (by `read_config` from the metadata and the
    optional config.json), tokenizer.json + tokenizer_config.json and a lazy GGUFCheckpoint,
    all from the file's headers."""
    resolved = resolve_gguf(model, revision, gguf_file)
    checkpoint = GGUFCheckpoint(resolved.path)  # unknown types / truncation raise here
    given = read_config_json(config_json) if config_json is not None else None
    raw = read_config(checkpoint, given)
    extras: dict[str, Path | bytes] = {}
    if checkpoint.metadata.get(TOKENIZER_KEY):
        extras.update(gguf_tokenizer_files(checkpoint.metadata))
    hint = (
        f"Check that --config {config_json} belongs to this GGUF file (config=... in Python)."
        if config_json is not None
        else "The config was read from the GGUF file's own metadata, so the file itself is "
        "inconsistent: re-convert the model with llama.cpp's convert_hf_to_gguf.py."
    )
    return OpenedCheckpoint(
        GGUF,
        raw,
        resolved,
        extras,
        open_tensors=GGUFCheckpoint,
        unused_rules=UNUSED_RULES,
        binding_hint=hint,
        output_quantize_refusal=OUTPUT_QUANTIZE_REFUSAL,
    )
