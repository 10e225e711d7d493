"""What every benchmark's onnxruntime CPU session shares: the thread counts."""

from __future__ import annotations

from typing import Any


def session_options(threads: int) -> Any:
    """SessionOptions with `threads` intra-op threads and one inter-op thread (sessions run
    sequentially, so the benchmarks compare kernels, not scheduling)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options
