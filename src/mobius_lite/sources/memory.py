"""A tensor source over in-memory arrays (a torch module's state dict, or numpy arrays), and a
transformers model's tensors under the names its save_pretrained writes."""

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


def checkpoint_state_dict(module: Any) -> dict[str, Any]:
    """`module`'s tensors named and laid out as `module.save_pretrained` writes them.

    transformers 5.x renames and fuses tensors when it loads a checkpoint (`backbone.` becomes
    `model.`, per-expert tensors become one stacked tensor, RADIO's q/k/v come apart) and undoes
    that when it saves. A package made from the in-memory names would record names no saved
    checkpoint has, and `mobius verify --source` could match none of them; so the same steps as
    save_pretrained apply here (tied aliases dropped, the conversion reverted), in memory. A
    module that is not a transformers model gives its state dict unchanged.
    """
    state = module.state_dict()
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return state
    if not isinstance(module, PreTrainedModel):
        return state
    try:  # transformers 5.x's save path; older versions keep the checkpoint names in memory
        from transformers.core_model_loading import revert_weight_conversion
        from transformers.modeling_utils import remove_tied_weights_from_state_dict
    except ImportError:
        return state
    for key in module._keys_to_ignore_on_save or ():
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, module)
    return revert_weight_conversion(module, state)


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
