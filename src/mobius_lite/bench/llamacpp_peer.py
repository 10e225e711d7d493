"""llama.cpp on a GGUF file as a peer, through llama-cpp-python (the `llamacpp` extra): the
same prompt token ids, prefill in one eval, then one eval per token (as
benchmarks/investigations/bench_gguf.py times it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.bench.measure import Tick, Timed, timed_call
from mobius_lite.errors import ConfigError
from mobius_lite.optional import require

PURPOSE = "timing llama.cpp on a GGUF file"


def check_gguf(path: Path) -> None:
    """ConfigError unless `path` is a GGUF file; MissingPackageError when llama-cpp-python is
    not installed. Both before anything is loaded."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file; give the path of a .gguf file")
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ConfigError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
    require("llama_cpp", PURPOSE)


class LlamaCppPeer:
    """llama_cpp.Llama over one GGUF file: `threads` threads for prefill and decode; with
    `gpu` every layer offloaded (where the installed build has a GPU backend)."""

    name = "llama.cpp"

    def __init__(
        self, gguf: Path, gpu: bool, threads: int, prompt_tokens: int, decode_tokens: int
    ) -> None:
        self.gguf = gguf
        self.gpu = gpu
        self.threads = threads
        self.context = prompt_tokens + decode_tokens + 1  # every position of one pass
        self.calls_per_pass = 1 + decode_tokens
        self.description = f"{gguf} in llama.cpp"
        self.llm: Any = None

    def open(self) -> None:
        llama_cpp = require("llama_cpp", PURPOSE)
        # a build without a GPU backend ignores n_gpu_layers: say where it really runs
        offload = self.gpu and bool(getattr(llama_cpp, "llama_supports_gpu_offload", bool)())
        self.description += " (every layer offloaded to the GPU)" if offload else " (CPU)"
        self.llm = llama_cpp.Llama(
            model_path=str(self.gguf),
            n_ctx=self.context,
            n_batch=max(512, self.context),
            n_threads=self.threads,
            n_threads_batch=self.threads,
            n_gpu_layers=-1 if offload else 0,
            verbose=False,
        )

    def _last_token(self) -> int:
        # the context's own last output row: `scores` is filled only with logits_all, which
        # would make llama.cpp compute every prefill position's logits
        llama_cpp = require("llama_cpp", PURPOSE)
        row = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.argmax(np.ctypeslib.as_array(row, shape=(self.llm.n_vocab(),))))

    def run(self, prompt: list[int], decode_tokens: int, tick: Tick) -> Timed:
        llm = self.llm
        assert llm is not None, "open() first"
        llm.reset()
        _, prefill_s = timed_call(lambda: llm.eval(prompt))
        tick()
        tokens, decode_s = [self._last_token()], []
        for _ in range(decode_tokens):
            _, seconds = timed_call(lambda: llm.eval([tokens[-1]]))
            tick()
            decode_s.append(seconds)
            tokens.append(self._last_token())
        return Timed(prefill_s, decode_s, tokens)
