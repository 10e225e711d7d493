"""Run an exported decoder with onnxruntime: empty caches, prefill, decode, greedy generation.

The one decoder stepper and the one greedy loop: `mobius generate`, OmniSession, the
qualification harness and tests drive packages through DecoderSession and `greedy` (the
benchmarks that time prefill and each decode step call DecoderSession.step themselves).
Every input's element type and every cache input's shape are read from the onnxruntime
session itself, so f32, f16 and bf16 packages (and instrumented twins) run the same way.
Requires the `runtime` extra.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.io_contract import (
    ATTENTION_MASK,
    INPUT_IDS,
    INPUTS_EMBEDS,
    LOGITS,
    LOGITS_TO_KEEP,
    PAST_PREFIX,
    present_of,
    window_of,
)
from mobius_lite.optional import require
from mobius_lite.run.package_reader import PackageFiles

CPU = "CPUExecutionProvider"
PROVIDERS = {"cpu": [CPU], "cuda": ["CUDAExecutionProvider", CPU]}
# onnxruntime's type strings for the element types a package's inputs use.
_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8,
}


def numpy_dtype(ort_type: str) -> np.dtype:
    """numpy dtype of an onnxruntime input type string ('tensor(float16)' -> float16)."""
    if ort_type == "tensor(bfloat16)":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(_ORT_TYPES[ort_type])
    except KeyError:
        raise PackageError(
            f"the graph takes an input of type {ort_type}, which mobius cannot feed"
        ) from None


def input_dtypes(session: Any) -> dict[str, np.dtype]:
    """Every input of an onnxruntime session with the numpy dtype it must be fed."""
    return {i.name: numpy_dtype(i.type) for i in session.get_inputs()}


def ort_module() -> Any:
    """onnxruntime, or one clear error naming the extra that brings it."""
    return require("onnxruntime", "running a package")


@dataclass(frozen=True)
class CacheInput:
    """One past_key_values.* input of a decoder session and the present.* output it takes
    its next value from: name, dtype and shape as the session declares them."""

    past_name: str
    present_name: str
    dtype: np.dtype
    shape: tuple[int | str | None, ...]

    def empty(self, batch: int) -> np.ndarray:
        """Zeros for a fresh sequence: batch on axis 0, every other named axis (the past
        length of attention K/V) 0."""
        dims = [batch] + [d if isinstance(d, int) else 0 for d in self.shape[1:]]
        return np.zeros(dims, dtype=self.dtype)


def cache_inputs(session: Any) -> list[CacheInput]:
    """The session's cache inputs, in input order, each paired with its present output."""
    outputs = {o.name for o in session.get_outputs()}
    found = []
    for i in session.get_inputs():
        if not i.name.startswith(PAST_PREFIX):
            continue
        present = present_of(i.name)
        if present not in outputs:
            raise PackageError(f"the decoder has a cache input {i.name} but no output {present}")
        found.append(CacheInput(i.name, present, numpy_dtype(i.type), tuple(i.shape)))
    return found


def session_providers(ep: str) -> list[str]:
    """onnxruntime provider names for --ep cpu / cuda; RouteError when this onnxruntime lacks
    the provider (it would otherwise fall back to the CPU silently)."""
    from mobius_lite.errors import RouteError
    from mobius_lite.routes import parse_provider

    ort = ort_module()
    providers = PROVIDERS[parse_provider(ep)]
    available = set(ort.get_available_providers())
    if not set(providers) <= available:
        raise RouteError(
            f"this onnxruntime has no {providers[0]} (it has {', '.join(sorted(available))}); "
            "install onnxruntime-gpu for --ep cuda (ep='cuda'), or use --ep cpu (ep='cpu')"
        )
    return providers


def quiet_options(options: Any = None) -> Any:
    """onnxruntime SessionOptions that log errors only, unless a severity was set: the one
    warning a decoder load gives is that its logits_to_keep input has a default value (an
    initializer), which is the design (graphs/decoder.py)."""
    options = options if options is not None else ort_module().SessionOptions()
    if options.log_severity_level == -1:
        options.log_severity_level = 3
    return options


class SessionError(PackageError):
    """onnxruntime could not create a session over a package's graph (its own exception is
    the __cause__)."""


def create_session(
    model: str | Path | bytes, providers: list[str] | None = None, session_options: Any = None
) -> Any:
    """An onnxruntime InferenceSession over a model file or serialized model bytes; a
    SessionError in one line when onnxruntime refuses it (its exceptions are not ours to let
    through as tracebacks)."""
    ort = ort_module()
    providers = providers or [CPU]
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else str(model),
            sess_options=quiet_options(session_options),
            providers=providers,
        )
    except ort_errors() as exc:
        what = "the serialized graph" if isinstance(model, bytes) else Path(model).name
        detail = " ".join(str(exc).split())[:400]
        raise SessionError(
            f"onnxruntime cannot create a session for {what} with {providers[0]} "
            f"({type(exc).__name__}: {detail}); check that the package was built for this "
            "execution provider and dtype, or re-export it with mobius build"
        ) from exc


def ort_errors() -> tuple[type[Exception], ...]:
    """The exception types onnxruntime raises (Fail, InvalidGraph, NotImplemented, ...)."""
    state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
    return tuple(
        v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception)
    )


def provider_kernels(providers: Sequence[str]) -> set[tuple[str, str]] | None:
    """(domain, op type) of every kernel this onnxruntime registers for `providers` (domain
    "" is the ONNX standard one); None when this onnxruntime does not list them all (a
    provider loaded from a shared library may list none until a session loads it)."""
    ort_module()
    try:
        state = importlib.import_module("onnxruntime.capi.onnxruntime_pybind11_state")
        kernels = state.get_all_opkernel_def()
    except (ImportError, AttributeError, RuntimeError):
        return None
    if not set(providers) <= {k.provider for k in kernels}:
        return None
    return {(k.domain, k.op_name) for k in kernels if k.provider in providers}


def check_runnable(files: PackageFiles, ep: str) -> None:
    """RouteError, before any session is created (which reads every weight), when the
    package cannot run on `ep`: its recorded dtype has no kernels on that provider (bf16 on
    the CPU), or a graph uses an operator of onnxruntime's own domains that has no kernel
    there (the CUDA-only NVFP4 / FP8 kernels of a ModelOpt --weights-backend ort package on
    the CPU)."""
    from mobius_lite.enums import Precision
    from mobius_lite.errors import RouteError
    from mobius_lite.routes import PROVIDER_PRECISIONS, parse_provider

    provider = parse_provider(ep)
    built = _built_for(files.directory)
    dtype = files.manifest.get("dtype")
    precision = Precision.parse(dtype) if dtype else None
    if precision is not None and precision not in PROVIDER_PRECISIONS[provider]:
        others = [p for p, runs in PROVIDER_PRECISIONS.items() if precision in runs]
        stay = " or ".join(p.value for p in PROVIDER_PRECISIONS[provider])
        raise RouteError(
            f"{files.directory} holds {precision.value} weights (manifest dtype "
            f"{precision.value}{built}), and onnxruntime's {provider} provider has no "
            f"{precision.value} kernels for MatMul, Gemm or Add; run it with "
            f"{' or '.join(f'--ep {o}' for o in others)}, or rebuild it with --dtype {stay}"
        )
    kernels = provider_kernels(PROVIDERS[provider])
    if kernels is None:
        return
    for role, path in files.graphs.items():
        # Standard ONNX ops are left out: onnxruntime expands those without a kernel
        # (LinearAttention, CausalConvWithState) into their function bodies.
        missing = sorted(op for op in graph_operators(path) if op[0] and op not in kernels)
        if missing:
            shown = ", ".join(f"{d}.{o}" if d else o for d, o in missing[:4])
            raise RouteError(
                f"{files.directory}'s {role} graph ({path.name}{built}) uses {shown}, which "
                f"this onnxruntime has no {provider} kernel for; run it with the execution "
                "provider it was built for (--ep cuda needs onnxruntime-gpu), or rebuild it "
                f"for {provider} (a ModelOpt checkpoint: --weights-backend standard)"
            )


def _built_for(directory: Path) -> str:
    """'; built for cuda' when genai_config.json records the CUDA provider, else ''."""
    import json

    from mobius_lite.layout import GENAI_CONFIG_FILE

    try:
        genai = json.loads((directory / GENAI_CONFIG_FILE).read_text())
        options = genai["model"]["decoder"]["session_options"]["provider_options"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    names = [name for entry in options if isinstance(entry, dict) for name in entry]
    return f"; built for {names[0]}" if names else ""


def graph_operators(path: Path) -> set[tuple[str, str]]:
    """(domain, op type) of every node of a graph file, subgraphs and the bodies of the
    model's local functions included (read without its external data)."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    functions = {(f.domain, f.name): f for f in proto.functions}
    found: set[tuple[str, str]] = set()

    def visit(nodes: Any) -> None:
        for node in nodes:
            key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
            if key in functions:
                visit(functions.pop(key).node)
                continue
            found.add(key)
            for attr in node.attribute:
                for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    visit(graph.node)

    visit(proto.graph.node)
    return found


class CachedSession:
    """An onnxruntime session that carries its own cache: the cache inputs, every input's
    element type and the output names are read from the session (decoder and MTP head)."""

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        # onnxruntime's memory pattern is planned and kept per set of input shapes; a cached
        # stepper gives every call a new past length, so each token would add one plan that
        # is never used again (about 7 KB a token on a tiny decoder: 70 MB at 10,000 tokens).
        session_options = quiet_options(session_options)
        session_options.enable_mem_pattern = False
        self.session = create_session(model, providers, session_options)
        self.cache = cache_inputs(self.session)
        self.inputs = input_dtypes(self.session)
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.past: dict[str, np.ndarray] = {}
        self.mask: np.ndarray | None = None
        self.call_start = 0  # positions the cache held before the last call

    def reset(self, batch: int) -> None:
        """Start a fresh sequence (empty caches)."""
        self.past = {c.past_name: c.empty(batch) for c in self.cache}
        self.mask = np.zeros((batch, 0), dtype=np.int64)


class DecoderSession(CachedSession):
    """An onnxruntime session over a package's decoder that carries its own cache.

    `model` is the decoder file or serialized model bytes (an instrumented twin);
    `session_options` may enable profiling or point external data at the package. The cache
    inputs (names, dtypes, shapes), the token input and the vocabulary size are read from the
    session.
    """

    def __init__(
        self,
        model: str | Path | bytes,
        providers: list[str] | None = None,
        session_options: Any = None,
    ) -> None:
        super().__init__(model, providers, session_options)
        logits = next((o for o in self.session.get_outputs() if o.name == LOGITS), None)
        last = logits.shape[-1] if logits is not None and logits.shape else None
        self.vocab_size: int | None = last if isinstance(last, int) else None
        # Per cache input, the output holding its state after each position of a short call
        # (packages built with a speculation window; Mamba states only).
        outputs = set(self.output_names)
        self.windows = {
            c.past_name: window_of(c.past_name)
            for c in self.cache
            if window_of(c.past_name) in outputs
        }
        # Packages exported before the input existed have no logits_to_keep.
        self.keeps_logits = LOGITS_TO_KEEP in self.inputs or LOGITS_TO_KEEP in {
            i.name for i in self.session.get_overridable_initializers()
        }

    def check_ids(self, ids: np.ndarray) -> None:
        """ConfigError when a token id lies outside the decoder's vocabulary."""
        check_token_ids(ids, self.vocab_size)

    def step(
        self,
        tokens: np.ndarray,
        attention_mask: np.ndarray | None = None,
        logits_to_keep: int = 0,
    ) -> dict[str, np.ndarray]:
        """Run one call on input_ids [batch, new] (int) or, for a decoder that takes them,
        inputs_embeds [batch, new, hidden] (float, cast to the graph's type); attention_mask
        covers only the new tokens (default all ones). logits_to_keep > 0 asks for the logits
        of the last that many positions only (generation needs one; a decoder without the
        input returns all).

        The full past + current mask is passed, as the I/O contract requires. Returns every
        output by name and keeps the presents as the next past.
        """
        tokens = np.asarray(tokens)
        embeds = np.issubdtype(tokens.dtype, np.floating) or tokens.ndim == 3
        name = INPUTS_EMBEDS if embeds else INPUT_IDS
        if name not in self.inputs:
            given = "embeddings" if embeds else "token ids"
            raise ConfigError(f"this decoder takes no {name}; it was given {given}")
        if not embeds:
            self.check_ids(tokens)
        tokens = tokens.astype(self.inputs[name], copy=False)
        if self.mask is None:
            self.reset(tokens.shape[0])
        new_mask = (
            np.ones(tokens.shape[:2], dtype=np.int64)
            if attention_mask is None
            else np.asarray(attention_mask, dtype=np.int64)
        )
        assert self.mask is not None
        self.call_start = self.mask.shape[1]  # positions before this call (keep_prefix)
        self.mask = np.concatenate([self.mask, new_mask], axis=1)
        feeds = {name: tokens, ATTENTION_MASK: self.mask, **self.past}
        if logits_to_keep and self.keeps_logits:
            feeds[LOGITS_TO_KEEP] = np.array(logits_to_keep, dtype=np.int64)
        results = dict(zip(self.output_names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: results[c.present_name] for c in self.cache}
        return results

    def keep_prefix(self, out: dict[str, np.ndarray], fed: int, kept: int) -> bool:
        """After the last call, over `fed` positions, which returned `out`: keep the state
        after its first `kept` positions only, as if only those had been fed (also after an
        earlier keep_prefix of the same call). Mamba states come from the call's windows
        (slot kept - 1), attention K/V and the mask are cut on their sequence axis. Returns
        False, changing nothing, when the call cannot give it (a decoder without windows,
        or a call of more positions than its window); the caller then restores its own
        snapshot and re-runs the kept positions."""
        total = self.call_start + kept
        kept_past = {}
        for c in self.cache:
            window = out.get(self.windows.get(c.past_name, ""))
            if window is not None and window.shape[0] == fed:
                kept_past[c.past_name] = np.ascontiguousarray(window[kept - 1])
            elif c.past_name in self.windows or len(c.shape) != 4 or isinstance(c.shape[2], int):
                return False  # a state with no usable window and no sequence axis to cut
            else:  # attention K/V: [batch, kv_heads, past + fed, head_dim]
                kept_past[c.past_name] = self.past[c.past_name][:, :, :total]
        assert self.mask is not None
        self.past = kept_past
        self.mask = self.mask[:, :total]
        return True


def check_token_ids(ids: np.ndarray, vocab_size: int | None) -> None:
    """ConfigError naming the first token id outside [0, vocab_size)."""
    ids = np.asarray(ids)
    if vocab_size is None or ids.size == 0:
        return
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ConfigError(
            f"token id {int(bad.flat[0])} is outside this package's vocabulary (ids 0 to "
            f"{vocab_size - 1}): the model has no embedding for it. Give token ids below "
            f"{vocab_size}, and check that the tokenizer belongs to this checkpoint"
        )


def stop_token_ids(eos_token_id: int | Sequence[int] | None) -> set[int]:
    """A config's end-of-sequence id (one, several, or none) as the set greedy stops at."""
    if eos_token_id is None:
        return set()
    if isinstance(eos_token_id, (list, tuple)):
        return {int(t) for t in eos_token_id}
    return {int(eos_token_id)}


def token_input(token: int) -> np.ndarray:
    """The decoder input of one generated token: input_ids [[token]]."""
    return np.array([[token]], dtype=np.int64)


class Generation(NamedTuple):
    """What `greedy` returns: the tokens chosen after each call, and every call's outputs
    (prefill first; empty unless `greedy` was asked to keep them)."""

    tokens: list[int]
    outputs: list[dict[str, np.ndarray]]


def check_prompt(prompt: np.ndarray) -> None:
    """ConfigError for a prompt of no positions: the decoder's prefill cannot run on it (an
    onnxruntime Reshape failure), and there is no last position to pick a token from."""
    shape = np.asarray(prompt).shape
    if len(shape) < 2 or shape[1] == 0:
        raise ConfigError(
            f"the prompt is empty (shape {list(shape)}): generation needs at least one prompt token"
        )


def greedy_tokens(
    decoder: DecoderSession,
    prompt: np.ndarray,
    max_new_tokens: int,
    *,
    next_input: Callable[[int], np.ndarray] = token_input,
    stop_tokens: Collection[int] = (),
    forced: Sequence[int] | None = None,
    prefill_logits: int = 1,
    outputs: list[dict[str, np.ndarray]] | None = None,
) -> Iterator[int]:
    """Greedy decoding from a fresh cache, one token at a time as it is chosen: prefill
    `prompt` (input_ids [1, n] or inputs_embeds [1, n, hidden]), then one cached call per
    token, until `max_new_tokens` tokens are chosen or a stop token is. The token chosen
    after a call is the argmax of its last position's logits; `next_input` turns it into the
    next call's input (an Omni package embeds it first). `forced` feeds those tokens instead
    of the chosen ones (a twin run on another run's tokens). `prefill_logits`: positions of
    prefill logits to keep (0: all, for comparisons). Calls made: at most `max_new_tokens`.

    Nothing is kept per token (the decoder holds the cache; each call's outputs are dropped
    once its token is chosen), so memory does not grow with the tokens beyond the cache
    itself, unless `outputs` is a list: then every call's outputs are appended to it.
    """
    check_prompt(prompt)
    decoder.reset(np.asarray(prompt).shape[0])
    out = decoder.step(prompt, logits_to_keep=prefill_logits)
    made = 0
    while True:
        if outputs is not None:
            outputs.append(out)
        token = int(np.argmax(out[LOGITS][0, -1]))
        del out  # the logits and presents of this call (the decoder keeps the presents)
        made += 1
        yield token
        if token in stop_tokens or made >= max_new_tokens:
            return
        fed = forced[made - 1] if forced is not None else token
        out = decoder.step(next_input(fed), logits_to_keep=1 if prefill_logits else 0)


def greedy(
    decoder: DecoderSession,
    prompt: np.ndarray,
    max_new_tokens: int,
    *,
    next_input: Callable[[int], np.ndarray] = token_input,
    stop_tokens: Collection[int] = (),
    forced: Sequence[int] | None = None,
    prefill_logits: int = 1,
    keep_outputs: bool = True,
) -> Generation:
    """`greedy_tokens` run to the end: the tokens, and (with `keep_outputs`, for the
    comparisons qualify and the tests make) every call's outputs, prefill first. Keeping
    them holds every call's logits and cache arrays; `mobius generate` keeps none."""
    kept: list[dict[str, np.ndarray]] | None = [] if keep_outputs else None
    tokens = list(
        greedy_tokens(
            decoder,
            prompt,
            max_new_tokens,
            next_input=next_input,
            stop_tokens=stop_tokens,
            forced=forced,
            prefill_logits=prefill_logits,
            outputs=kept,
        )
    )
    return Generation(tokens, kept or [])
