"""Which peer runs a package: the Omni chain (omni_peer.py) for an Omni package, the decoder
alone (package_peer.py) otherwise; apart from both, which the Omni chain builds on."""

from __future__ import annotations

from typing import Any

from mobius_lite.bench.omni_peer import OmniPeer
from mobius_lite.bench.package_peer import PackagePeer
from mobius_lite.configs.model_types import model_type_of
from mobius_lite.enums import Task
from mobius_lite.run.package_reader import PackageFiles
from mobius_lite.sources.config_json import read_config_json


def package_peer(files: PackageFiles, ep: str, threads: int, decode_tokens: int) -> Any:
    """The peer that runs this package: the Omni chain for an Omni package's config, the
    decoder alone otherwise."""
    if model_type_of(read_config_json(files.directory)).task is Task.IMAGE_TEXT_TO_TEXT:
        return OmniPeer(files, ep, threads, decode_tokens)
    return PackagePeer(files, ep, threads, decode_tokens)
