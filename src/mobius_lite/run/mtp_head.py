"""The package's multi-token-prediction head as a draft head (mtp.onnx, docs/decoder_contract.md).

MtpHead is an onnxruntime session over the head graph that carries the head's own KV cache
and can cut it back to a prefix; DraftHead is what the speculative loop (speculative.py)
needs from any draft head, RoundDraftHead a head that makes a round's drafts itself (the
chain of distinct depths, run/mtp_depths.py). open_head finds the head's graph files in the
package's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import GraphId, GraphRole
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.graphs.draft_int8 import relay_draft_int8
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    HIDDEN_STATES,
    INPUT_IDS,
    LOGITS,
    LOGITS_TO_KEEP,
    MTP_HIDDEN_STATES,
)
from mobius_lite.run.cached_session import CachedSession
from mobius_lite.run.mtp_depths import DepthChain, DraftTimer
from mobius_lite.run.ort_session import quiet_options, shares_pool, without_spinning
from mobius_lite.run.package_reader import PackageFiles, open_package


class DraftHead(Protocol):
    """What the speculative loop needs from a draft head: a cache it can cut back."""

    @property
    def length(self) -> int:
        """Positions held in the head's cache."""
        ...

    def reset(self, batch: int) -> None: ...

    def step(
        self, input_ids: np.ndarray, hidden_states: np.ndarray, attention_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run positions (token t+1, decoder hidden at t); returns (logits, mtp_hidden_states),
        both [batch, seq, ...], and keeps the new positions in the cache."""
        ...

    def truncate(self, length: int) -> None:
        """Drop the cache's positions from `length` on."""
        ...


@runtime_checkable
class RoundDraftHead(DraftHead, Protocol):
    """A draft head that makes a whole round's drafts itself, rather than the loop chaining
    its steps over its own hidden states: the chain of a head of distinct depths
    (run/mtp_depths.py), whose draft j comes from depth j."""

    @property
    def max_drafts(self) -> int:
        """The most drafts one round can make (the head's depths)."""
        ...

    def draft_round(
        self,
        input_ids: np.ndarray,
        hidden_states: np.ndarray,
        attention_mask: np.ndarray,
        count: int,
        timed: DraftTimer,
    ) -> np.ndarray:
        """Run the positions the head has not seen (token t+1, decoder hidden t; the last
        one's token is the decoder's pending token) and draft `count` <= max_drafts tokens
        after it, [batch, count]. Afterwards its caches hold no entry computed from a draft.
        `timed(positions, seconds)` hears of each call; positions 1 marks a call that costs
        what one draft costs (not a catch-up on many positions)."""
        ...


# where onnxruntime reads the external data of a model given as bytes
EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"


class MtpHead(CachedSession):
    """An onnxruntime session over a package's mtp.onnx that carries the head's KV cache.

    Cache inputs and element types are read from the session (cached_session.cache_inputs),
    so an FP16 head gets FP16 hidden states.
    """

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        super().__init__(model, providers, session_options)
        wanted = {INPUT_IDS, HIDDEN_STATES, ATTENTION_MASK} - set(self.inputs)
        wanted |= {LOGITS, MTP_HIDDEN_STATES} - set(self.output_names)
        if wanted or not self.cache:
            where = "the head graph" if isinstance(model, bytes) else str(model)
            missing = ", ".join(sorted(wanted)) or "a past_key_values.mtp.* cache input"
            raise PackageError(
                f"{where} lacks {missing} of the MTP head contract (docs/decoder_contract.md); "
                "rebuild the package with this version of mobius"
            )
        self.mask = np.zeros((0, 0), dtype=np.int64)

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])

    def step(
        self,
        input_ids: np.ndarray,
        hidden_states: np.ndarray,
        attention_mask: np.ndarray,
        logits_to_keep: int = 0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """DraftHead.step; logits_to_keep > 0 asks for the logits and mtp_hidden_states of
        the last that many positions only (the cheap call a draft needs), where the graph
        takes it; every position still enters the cache."""
        self.mask = np.concatenate([self.mask, np.asarray(attention_mask, np.int64)], axis=1)
        feeds = {
            INPUT_IDS: np.asarray(input_ids, np.int64),
            HIDDEN_STATES: np.asarray(hidden_states).astype(self.inputs[HIDDEN_STATES], copy=False),
            ATTENTION_MASK: self.mask,
            **self.past,
        }
        if logits_to_keep and self.keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(logits_to_keep, dtype=np.int64)
        results = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: results[c.present_name] for c in self.cache}
        return results[LOGITS], results[MTP_HIDDEN_STATES]

    def truncate(self, length: int) -> None:
        # the head's caches are attention K/V: [batch, kv_heads, sequence, head_dim]
        self.past = {name: value[:, :, :length] for name, value in self.past.items()}
        self.mask = self.mask[:, :length]


def open_head(
    package: PackageFiles | str | Path,
    providers: list[str] | None = None,
    session_options: Any = None,
) -> MtpHead | DepthChain:
    """The package's MTP head, its graph files as the manifest lists them (a directory is read
    with open_package first): an MtpHead over mtp.onnx, or for a head of distinct depths a
    DepthChain over mtp.onnx and each further depth's graph (enums.GraphId). A ConfigError
    naming the fix when the package has no head."""
    files = package if isinstance(package, PackageFiles) else open_package(package)
    paths = head_files(files)
    if not paths:
        raise ConfigError(
            f"{files.directory} has no {GraphRole.MTP.file_name}: its checkpoint has no "
            "multi-token-prediction head, so it cannot draft; decode without speculation "
            "(no --speculative; in Python, run.greedy.greedy)"
        )
    heads = [head_session(path, providers, session_options) for path in paths]
    return heads[0] if len(heads) == 1 else DepthChain(heads)


def head_files(files: PackageFiles) -> list[Path]:
    """The head's graph files in depth order, as the manifest lists them: mtp.onnx, then
    each further depth's while the manifest has it; empty without a head."""
    paths: list[Path] = []
    while (path := files.graphs.get(GraphId(GraphRole.MTP, len(paths)).key)) is not None:
        paths.append(Path(path))
    return paths


def head_session(
    path: Path, providers: list[str] | None = None, session_options: Any = None
) -> MtpHead:
    """An MtpHead over a head graph file. The head takes turns with the decoder on the same
    cores: options on the process's shared pool (ort_session.on_shared_pool) are kept;
    otherwise its own threads do not spin between calls (ort_session.without_spinning). A
    fast head's dense projections (listed in its metadata at build) are re-laid as int8
    blocks in memory (graphs/draft_int8.py), the other initializers read from the package's
    external data as usual. `session_options` (or new ones) get these config entries."""
    if shares_pool(session_options):
        options = quiet_options(session_options)
    else:
        options = without_spinning(session_options)
    model = ir.load(path)
    if not relay_draft_int8(model):
        return MtpHead(path, providers, options)
    options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(path.parent))
    return MtpHead(ir.serde.serialize_model(model).SerializeToString(), providers, options)
