"""A tensor source over in-memory arrays (a torch module's state dict, or numpy arrays)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_lite.sources.base import TensorInfo


def to_numpy(tensor: Any) -> np.ndarray:
    """numpy view of a numpy array or torch tensor; bf16 keeps its bits via ml_dtypes."""
    if isinstance(tensor, np.ndarray):
        return tensor
    import ml_dtypes
    import torch

    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


MEMORY = "memory"


class MemorySource:
    """Named in-memory tensors (numpy or torch), converted to numpy on read."""

    kind = MEMORY

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self._tensors = dict(tensors)

    def names(self) -> list[str]:
        return list(self._tensors)

    def info(self, name: str) -> TensorInfo:
        array = to_numpy(self._tensors[name])
        return TensorInfo(
            name=name,
            dtype=array.dtype,
            shape=tuple(array.shape),
            nbytes=array.nbytes,
            location="memory",
        )

    def read(self, name: str) -> np.ndarray:
        return to_numpy(self._tensors[name])

    def byte_range(self, name: str) -> None:
        """None: in memory, not in a file."""
        return None
