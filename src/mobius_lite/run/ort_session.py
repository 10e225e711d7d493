"""onnxruntime sessions over a package's graphs: the providers an --ep asks for, quiet session
options, session creation with onnxruntime's refusal in one line, and the numpy dtype each
input must be fed (read from the session, so f32, f16 and bf16 graphs are fed alike).
Requires the `runtime` extra.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.errors import PackageError
from mobius_lite.optional import require

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


# onnxruntime's session config key: 0 makes a session's intra-op threads sleep when a call ends
ALLOW_SPINNING = "session.intra_op.allow_spinning"


def without_spinning(options: Any = None) -> Any:
    """quiet_options whose intra-op threads block as soon as a call ends instead of spinning:
    for sessions with pools of their own that take turns on the same cores (a decoder and
    its draft head, in a process that is not the library's alone: on_shared_pool). A spinning
    pool keeps the cores from the other session's next call: on the mid model with 2 threads
    on 2 cores, the real f32 head at 85% (simulated) acceptance ran at 0.56x plain with both
    sessions spinning and 1.05x with neither (docs/speculative.md, "Benchmark")."""
    options = quiet_options(options)
    options.add_session_config_entry(ALLOW_SPINNING, "0")
    return options


# whether this process's shared intra-op thread pool was sized here (onnxruntime sizes it once)
_shared_pool: list[int] = []


def on_shared_pool(options: Any = None) -> Any:
    """quiet_options whose session runs on onnxruntime's one shared intra-op thread pool for
    the process, which may spin between calls: for a process whose sessions are all this
    library's (the `mobius` command), where a decoder and its draft head take turns on the
    same cores. On the mid Q8_0 int8 package with a head, 2 threads, plain greedy decoding
    took 321-379 ms on it against 409-450 ms on a spinning pool of the session's own, and
    speculative decoding 280-296 ms against 319-332 ms on pools of their own without spinning
    (8 alternating rounds; another run of 4 found them equal; docs/speculative.md,
    "Threads"). The first call sizes the pool from the options' intra_op_num_threads (0:
    onnxruntime's default, the physical cores); a pool sized earlier in the process is used
    as it is. Once a process has the shared pool, onnxruntime refuses any later session with
    a pool of its own, so create_session puts every later session on it too: not for an
    application that opens onnxruntime sessions of its own."""
    options = quiet_options(options)
    if not _shared_pool:
        try:
            ort_module().set_global_thread_pool_sizes(max(options.intra_op_num_threads, 0), 1)
        except ort_errors():  # "Global thread pools have already been created"
            pass
        _shared_pool.append(options.intra_op_num_threads)
    options.use_per_session_threads = False
    # the pool's sizes are the process's now (onnxruntime warns of a session's own, ignored)
    options.intra_op_num_threads = options.inter_op_num_threads = 0
    return options


def shares_pool(options: Any) -> bool:
    """Whether `options` put their session on the process's shared thread pool."""
    return options is not None and not options.use_per_session_threads


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
    options = quiet_options(session_options)
    if _shared_pool and not shares_pool(options):  # onnxruntime refuses a pool of its own now
        options = on_shared_pool(options)
    try:
        return ort.InferenceSession(
            model if isinstance(model, bytes) else str(model),
            sess_options=options,
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
