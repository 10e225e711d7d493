"""Known Hugging Face model ids and the commit each one is pinned to by default.

A hub id with no explicit revision resolves to its pinned commit, never to the moving `main`
branch, so the same command exports the same bytes tomorrow. The pin is applied by
`resolve_revision`, which every hub entry point calls before its first hub request.

Every entry carries a full 40-hex commit SHA (checked at import) and the public page where the
pin was confirmed. Releases whose commit could not be confirmed are deliberately absent: an
unknown id still works, at the revision the user asks for (default `main`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

COMMIT_SHA = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class KnownModel:
    """One published checkpoint: its hub id, pinned commit, family and where the pin came from."""

    model_id: str
    revision: str
    family: str  # config model_type: nemotron_h | nemotron_h_puzzle | nemotron_h_omni
    confirmed_at: str  # public page showing the commit in this repository

    def __post_init__(self) -> None:
        if not COMMIT_SHA.fullmatch(self.revision):
            raise ValueError(
                f"registry entry {self.model_id}: revision {self.revision!r} is not a 40-hex "
                "commit SHA; pin a full commit, never a branch or tag"
            )
        if self.model_id.count("/") != 1:
            raise ValueError(f"registry entry {self.model_id!r} is not an org/name hub id")


KNOWN_MODELS: tuple[KnownModel, ...] = (
    KnownModel(
        "nvidia/Nemotron-H-8B-Base-8K",
        "253e00241ff77421b6d811c971e9cee1b2d824ad",
        "nemotron_h",
        "https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/"
        "253e00241ff77421b6d811c971e9cee1b2d824ad/config.json",
    ),
    KnownModel(
        "nvidia/NVIDIA-Nemotron-Nano-9B-v2",
        "6533e8de2c68e4536bf7c411d7a3ce5734111476",
        "nemotron_h",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-Nano-9B-v2/tree/"
        "6533e8de2c68e4536bf7c411d7a3ce5734111476",
    ),
    KnownModel(
        "nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16",
        "dfaf35de3e30f1867dd8dbc38a7fc9fb52d3914f",
        "nemotron_h",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-4B-BF16/blob/"
        "dfaf35de3e30f1867dd8dbc38a7fc9fb52d3914f/README.md",
    ),
    KnownModel(
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "cbd3fa9f933d55ef16a84236559f4ee2a0526848",
        "nemotron_h",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/tree/"
        "cbd3fa9f933d55ef16a84236559f4ee2a0526848",
    ),
    KnownModel(
        "nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16",
        "2dc98e2afe4face0e4ce40972a915c45368bd34a",
        "nemotron_h",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16/tree/"
        "2dc98e2afe4face0e4ce40972a915c45368bd34a",
    ),
    KnownModel(
        "nvidia/NVIDIA-Nemotron-Labs-3-Puzzle-75B-A9B-BF16",
        "7cd7fa01bab578cb4e8bde6ebba5e869afa1752d",
        "nemotron_h_puzzle",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-Labs-3-Puzzle-75B-A9B-BF16/blob/"
        "7cd7fa01bab578cb4e8bde6ebba5e869afa1752d/config.json",
    ),
    KnownModel(
        "nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16",
        "e5e9932441de940c9a62185c870ea5bcd4cd24e2",
        "nemotron_h_omni",
        "https://huggingface.co/nvidia/Nemotron-3-Nano-Omni-30B-A3B-Reasoning-BF16/tree/"
        "e5e9932441de940c9a62185c870ea5bcd4cd24e2",
    ),
)

_BY_ID = {m.model_id.lower(): m for m in KNOWN_MODELS}
if len(_BY_ID) != len(KNOWN_MODELS):
    raise ValueError("duplicate model id in KNOWN_MODELS")


def lookup(model_id: str) -> KnownModel | None:
    """The registry entry for a hub id (hub ids are case-insensitive), or None."""
    return _BY_ID.get(model_id.lower())


def resolve_revision(model_id: str, revision: str | None) -> str | None:
    """The revision to request: the caller's if given, else the registry pin, else None (main)."""
    if revision:
        return revision
    known = lookup(model_id)
    return known.revision if known is not None else None
