"""Resolve a checkpoint given as a local directory or a Hugging Face hub id.

Hub ids go through `huggingface_hub.snapshot_download`, so the usual cache and offline rules
apply. They are fetched in two steps: first only the small files (config, tokenizer, the
safetensors index), so that the config and the route are validated before anything large is
downloaded; then the safetensors shards of the same commit. The registry pin is applied here,
before the first hub request, so every entry point that resolves through this module gets it.

HF_HUB_CACHE / HF_HOME / HF_HUB_OFFLINE are read when a checkpoint is resolved (not only when
huggingface_hub was imported), with huggingface_hub's own precedence.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
from huggingface_hub import constants as hub_constants
from huggingface_hub import errors as hub_errors_module

from mobius_lite.errors import CheckpointError, ConfigError
from mobius_lite.formats.modelopt.quant_config import HF_QUANT_CONFIG
from mobius_lite.hub_pins import COMMIT_SHA, resolve_revision
from mobius_lite.layout import CONFIG_FILE, TOKENIZER_FILES
from mobius_lite.sources.safetensors_files import INDEX_NAME

# Small files fetched first: everything needed to validate the export before the weights.
METADATA_PATTERNS = (
    CONFIG_FILE,
    HF_QUANT_CONFIG,  # ModelOpt's quantization, when config.json does not carry it
    *TOKENIZER_FILES,
    INDEX_NAME,
)
WEIGHT_PATTERNS = ("*.safetensors",)
# Top-level files only: subfolders (original/, consolidated checkpoints, ...) are never fetched.
IGNORE_PATTERNS = ("*/*",)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_TRUE = {"1", "on", "yes", "true"}


class HubError(CheckpointError):
    """A hub checkpoint could not be resolved (not cached offline, not found, gated, ...)."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """Where a checkpoint's files are on disk, and which commit they came from."""

    path: Path
    model: str  # as the user gave it (hub id or directory)
    revision: str | None  # commit SHA for hub checkpoints (and HF cache snapshot dirs), else None
    hub: bool

    def source_record(self) -> dict[str, str | None]:
        """The facts recorded in the package manifest under "source"."""
        return {"model": self.model, "revision": self.revision}


def is_hub_id(model: str) -> bool:
    """True for an `org/name` string that is not an existing local path."""
    text = str(model)
    return not Path(text).expanduser().exists() and HUB_ID.fullmatch(text) is not None


def hub_cache_dir() -> str | None:
    """The hub cache directory from the environment now, or None for huggingface_hub's default."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return os.path.expanduser(os.path.expandvars(os.environ[var]))
    if os.environ.get("HF_HOME"):
        return os.path.join(os.path.expanduser(os.path.expandvars(os.environ["HF_HOME"])), "hub")
    return None


def hub_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now, or as huggingface_hub read it."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE")
    if value is not None:
        return value.strip().lower() in _TRUE
    return bool(hub_constants.HF_HUB_OFFLINE)


def _cache_revision(path: Path) -> str | None:
    """The commit of an HF cache snapshot directory (.../snapshots/<sha>), if it is one."""
    if path.parent.name == "snapshots" and COMMIT_SHA.fullmatch(path.name):
        return path.name
    return None


def resolve_local(model: str | Path, revision: str | None = None) -> ResolvedCheckpoint:
    """A local checkpoint directory; a revision cannot be chosen for one."""
    if not str(model).strip():  # Path("") is the working directory: never what was meant
        raise ConfigError(
            "the model is an empty string; pass a checkpoint directory (config.json + "
            "*.safetensors), a .gguf file or a Hugging Face model id (org/name)"
        )
    path = Path(model).expanduser()
    if not path.exists():
        raise ConfigError(
            f"{model}: no such directory, and not a Hugging Face model id (org/name); "
            "pass a checkpoint directory containing config.json and *.safetensors, or a hub id"
        )
    if not path.is_dir():
        raise ConfigError(
            f"{model} is a file; pass the checkpoint directory that contains config.json and "
            "the *.safetensors files"
        )
    if revision:
        raise ConfigError(
            f"--revision {revision} was given with the local directory {model}; a revision "
            "selects a commit of a hub model id: drop --revision (revision=None in Python) or "
            "pass the hub id"
        )
    path = path.resolve()
    return ResolvedCheckpoint(path=path, model=str(path), revision=_cache_revision(path), hub=False)


@contextlib.contextmanager
def hub_errors(model_id: str, revision: str | None) -> Iterator[None]:
    """Turn huggingface_hub's errors about a repository into one clear MobiusError each
    (callers handle the file-level ones of their own call first)."""
    at = f"{model_id}@{revision or 'main'}"
    try:
        yield
    except hub_errors_module.HFValidationError as exc:
        raise ConfigError(f"{model_id!r} is not a valid Hugging Face model id: {exc}") from None
    except hub_errors_module.RevisionNotFoundError:
        raise HubError(
            f"revision {revision!r} does not exist in {model_id}; pass a commit SHA, branch or "
            "tag of that repository with --revision (revision=...)"
        ) from None
    except hub_errors_module.GatedRepoError:
        raise HubError(
            f"{model_id} is gated: accept its license on huggingface.co and log in "
            "(hf auth login or HF_TOKEN) before exporting it"
        ) from None
    except hub_errors_module.RepositoryNotFoundError:
        raise HubError(
            f"{model_id} was not found on the Hugging Face hub (or is private); check the id, "
            "or pass a local checkpoint directory"
        ) from None
    except hub_errors_module.HfHubHTTPError as exc:
        raise HubError(f"the hub refused {at}: {exc}") from None
    except OSError as exc:  # proxy / connection failures not covered above
        raise HubError(f"{at} could not be fetched: {exc}; check the network and retry") from None


def _download(
    model_id: str, revision: str | None, patterns: list[str], offline: bool, cache_dir: str | None
) -> Path:
    where = cache_dir or hub_constants.HF_HUB_CACHE
    at = f"{model_id}@{revision or 'main'}"
    with hub_errors(model_id, revision):
        try:
            folder = huggingface_hub.snapshot_download(
                repo_id=model_id,
                revision=revision,
                allow_patterns=patterns,
                ignore_patterns=list(IGNORE_PATTERNS),
                cache_dir=cache_dir,
                local_files_only=offline,
            )
        except hub_errors_module.LocalEntryNotFoundError as exc:
            if type(exc).__name__ == "IncompleteSnapshotError":
                raise HubError(
                    f"the cached snapshot of {at} in {where} is incomplete ({exc}); re-run the "
                    "download with network access or delete that snapshot"
                ) from None
            if offline:
                raise HubError(
                    f"{at} is not in the local Hugging Face cache ({where}) and HF_HUB_OFFLINE "
                    "is set; download it first (hf download "
                    f"{model_id}{' --revision ' + revision if revision else ''}), point "
                    "HF_HUB_CACHE at a cache that has it, or unset HF_HUB_OFFLINE"
                ) from None
            raise HubError(
                f"{at} could not be fetched from the hub and is not in the local cache "
                f"({where}); check the network connection and try again"
            ) from None
    return Path(folder)


def resolve_hub(
    model_id: str, revision: str | None = None, *, weights: bool = True
) -> ResolvedCheckpoint:
    """Fetch (or find in the cache) a hub checkpoint at its pinned or requested revision.

    weights=False fetches only config, tokenizer and index files. The returned revision is the
    commit the files came from, so a second call with it fetches the shards of the same commit.
    """
    requested = resolve_revision(model_id, revision)  # the pin: before any hub request
    folder = _download(model_id, requested, list(METADATA_PATTERNS), hub_offline(), hub_cache_dir())
    commit = _cache_revision(folder) or requested
    resolved = ResolvedCheckpoint(path=folder, model=model_id, revision=commit, hub=True)
    return fetch_weights(resolved) if weights else resolved


def fetch_weights(resolved: ResolvedCheckpoint) -> ResolvedCheckpoint:
    """The safetensors shards of an already resolved checkpoint (same commit); local: as is."""
    if not resolved.hub:
        return resolved
    patterns = weight_patterns(resolved.path)
    folder = _download(resolved.model, resolved.revision, patterns, hub_offline(), hub_cache_dir())
    return ResolvedCheckpoint(
        path=folder, model=resolved.model, revision=resolved.revision, hub=True
    )


def weight_patterns(folder: Path) -> list[str]:
    """The shard files named by the safetensors index if there is one, else every *.safetensors."""
    index = folder / INDEX_NAME
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            return sorted(set(weight_map.values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise CheckpointError(f"{index}: not a valid safetensors index") from None
    return list(WEIGHT_PATTERNS)


def resolve_checkpoint(
    model: str | Path, revision: str | None = None, *, weights: bool = True
) -> ResolvedCheckpoint:
    """A local directory as is, or a hub id fetched at its pinned / requested revision."""
    if is_hub_id(str(model)):
        try:
            return resolve_hub(str(model), revision, weights=weights)
        except HubError as exc:
            raise mistyped_path(str(model)) or exc from None
    return resolve_local(model, revision)


def mistyped_path(model: str, hub: str = "could not be fetched either") -> ConfigError | None:
    """For an `org/name` that is no local path while `org` is a local directory (`ck/dens`
    with `ck/` here): most likely a mistyped local path, so say that first, not the network
    (`hub`: what became of it as a hub id)."""
    folder, _, name = model.partition("/")
    if not Path(folder).expanduser().is_dir():
        return None
    return ConfigError(
        f"{model}: no such file or directory ({folder}/ exists but holds no {name!r}), and as "
        f"a hub model id it {hub}; check the path (ls {folder}/)"
    )
