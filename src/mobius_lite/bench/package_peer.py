"""The package as a peer: its decoder through decoder_session.DecoderSession (the one
stepper), timed call by call; an Omni package's prompt goes through its embedding graph and
its encoders are timed on synthetic inputs (omni_peer.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mobius_lite.bench.measure import Tick, Timed, timed_call
from mobius_lite.enums import GraphRole
from mobius_lite.io_contract import LOGITS
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import token_input
from mobius_lite.run.ort_session import ort_module, session_providers
from mobius_lite.run.package_reader import PackageFiles


def session_options(threads: int) -> Any:
    """onnxruntime SessionOptions with `threads` intra-op threads and one inter-op thread
    (the graphs run one call at a time)."""
    options = ort_module().SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def argmax_last(out: dict[str, np.ndarray]) -> int:
    """The greedy token of a decoder call: the argmax of its last position's logits."""
    return int(np.argmax(out[LOGITS][0, -1]))


class PackagePeer:
    """A text package's decoder on onnxruntime (`ep`: cpu or cuda)."""

    name = "package"

    def __init__(self, files: PackageFiles, ep: str, threads: int, decode_tokens: int) -> None:
        self.files = files
        self.providers = session_providers(ep)
        self.threads = threads
        self.calls_per_pass = 1 + decode_tokens
        self.description = f"{files.directory} on onnxruntime {self.providers[0]}"
        self.session: DecoderSession | None = None

    def open(self) -> None:
        decoder = self.files.graph(GraphRole.DECODER)
        self.session = DecoderSession(decoder, self.providers, session_options(self.threads))

    def vocab_size(self) -> int | None:
        """The decoder's vocabulary, as its logits output declares it."""
        return self.session.vocab_size if self.session is not None else None

    def run(self, prompt: list[int], decode_tokens: int, tick: Tick) -> Timed:
        session = self.session
        assert session is not None, "open() first"
        session.reset(1)
        ids = np.array([prompt], dtype=np.int64)
        out, prefill_s = timed_call(lambda: session.step(ids, logits_to_keep=1))
        tick()
        tokens, decode_s = [argmax_last(out)], []
        for _ in range(decode_tokens):
            feed = token_input(tokens[-1])
            out, seconds = timed_call(lambda feed=feed: session.step(feed, logits_to_keep=1))
            tick()
            decode_s.append(seconds)
            tokens.append(argmax_last(out))
        return Timed(prefill_s, decode_s, tokens)
