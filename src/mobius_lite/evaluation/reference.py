"""The independent reference: the source checkpoint in transformers (torch, FP32), stepped like
the package (prefill, then one token per call on its own cache) and observed through hooks.

Hooks read each block's output (the residual stream after layer i, the package's
hidden_states.{i}) and each MoE router's chosen experts and weights; nothing in the model is
changed. Requires the `reference` extra (torch, transformers).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs.model_types import MODEL_TYPES
from mobius_lite.enums import LayerKind
from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.cache_layout import reference_cache_arrays
from mobius_lite.io_contract import LAYER_HIDDEN_PREFIX, LOGITS


def _precision_knobs(torch: Any) -> list[tuple[Any, str]]:
    """torch's FP32 precision settings (the fp32_precision API of torch >= 2.9), where present."""
    b = torch.backends
    owners = [b, b.cuda.matmul, b.cudnn, b.mkldnn]
    for parent in (b.cudnn, b.mkldnn):
        owners += [getattr(parent, sub, None) for sub in ("conv", "rnn", "matmul")]
    return [(o, "fp32_precision") for o in owners if o is not None and hasattr(o, "fp32_precision")]


@contextmanager
def pinned_torch() -> Iterator[dict[str, Any]]:
    """Pin the ambient torch flags an FP32 oracle depends on; restore them afterwards.

    Every FP32 precision setting is "ieee" (no TF32 anywhere; with older torch,
    float32_matmul_precision "highest" and allow_tf32 off), FP16 accumulation and FP16/BF16
    reduced-precision reductions off, deterministic algorithms on, autograd off. Yields the
    pinned settings.
    """
    import torch

    matmul = torch.backends.cuda.matmul
    knobs = _precision_knobs(torch)
    saved: dict[str, Any] = {
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "fp16_reduction": matmul.allow_fp16_reduced_precision_reduction,
        "bf16_reduction": matmul.allow_bf16_reduced_precision_reduction,
        "fp16_accumulation": getattr(matmul, "allow_fp16_accumulation", None),
        "knobs": [getattr(owner, name) for owner, name in knobs],
    }
    if not knobs:  # torch < 2.9: the legacy switches
        saved["legacy"] = (
            torch.get_float32_matmul_precision(),
            matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
        )
    pinned: dict[str, Any] = {
        "deterministic": True,
        "fp16_reduced_precision_reduction": False,
        "bf16_reduced_precision_reduction": False,
        "fp16_accumulation": False,
        "fp32_precision": "ieee" if knobs else "highest (legacy API, TF32 off)",
        "autograd": False,
        "num_threads": torch.get_num_threads(),
    }
    torch.use_deterministic_algorithms(True)
    matmul.allow_fp16_reduced_precision_reduction = False
    matmul.allow_bf16_reduced_precision_reduction = False
    if saved["fp16_accumulation"] is not None:
        matmul.allow_fp16_accumulation = False
    for owner, name in knobs:
        setattr(owner, name, "ieee")
    if not knobs:
        torch.set_float32_matmul_precision("highest")
        matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            yield pinned
    finally:
        torch.use_deterministic_algorithms(saved["deterministic"])
        matmul.allow_fp16_reduced_precision_reduction = saved["fp16_reduction"]
        matmul.allow_bf16_reduced_precision_reduction = saved["bf16_reduction"]
        if saved["fp16_accumulation"] is not None:
            matmul.allow_fp16_accumulation = saved["fp16_accumulation"]
        for (owner, name), value in zip(knobs, saved["knobs"], strict=True):
            setattr(owner, name, value)
        if "legacy" in saved:
            precision, tf32, cudnn_tf32 = saved["legacy"]
            torch.set_float32_matmul_precision(precision)
            matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = cudnn_tf32


def transformers_reference(source: Path) -> Any:
    """A Nemotron-H checkpoint in transformers (eager attention and experts)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(source),
        dtype=torch.float32,
        attn_implementation="eager",
        experts_implementation="eager",
    )


def split_transformers_reference(source: Path) -> Any:
    """A nemotron_h_dense / nemotron_h_sparse checkpoint in transformers: by its own model
    type where the installed transformers has it, else as nemotron_h, whose config fields,
    modules and tensor names those types share (their configs drop only the MTP fields,
    which transformers does not model): the checkpoint's files seen through a folder whose
    config.json says nemotron_h."""
    import tempfile

    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(str(source))
    except (KeyError, ValueError):  # this transformers has no such model_type
        with tempfile.TemporaryDirectory(prefix="mobius-split-reference-") as view:
            for file in Path(source).iterdir():
                if file.name != "config.json":
                    (Path(view) / file.name).symlink_to(file.resolve())
            raw = json.loads((Path(source) / "config.json").read_text())
            raw["model_type"] = "nemotron_h"
            (Path(view) / "config.json").write_text(json.dumps(raw))
            return transformers_reference(Path(view))
    return transformers_reference(Path(source))


def load_reference(source: str | Path, model_type: str) -> Any:
    """The source checkpoint as a torch FP32 module in eval mode, loaded by its model type's
    qualify reference (configs/model_types.py)."""
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"no reference implementation for model_type {model_type!r}")
    try:
        loader = MODEL_TYPES[model_type].qualify_reference()
    except ImportError as exc:
        raise ConfigError(
            f"no reference implementation for model_type {model_type!r} is available "
            f"({exc}); qualification needs one"
        ) from None
    return loader(Path(source)).float().eval()


def _blocks(model: Any) -> Sequence[Any]:
    for path in ("backbone", "model"):
        inner = getattr(model, path, None)
        if inner is not None and hasattr(inner, "layers"):
            return inner.layers
    raise ConfigError(
        f"{type(model).__name__}: cannot find the decoder blocks (expected .backbone.layers "
        "or .model.layers)"
    )


def _numpy(tensor: Any) -> np.ndarray:
    # a copy: the reference updates its cache tensors in place on the next call
    return tensor.detach().float().cpu().numpy().copy()


class ReferenceRunner:
    """Steps the reference one call at a time, carrying its own cache, and captures arrays.

    step() returns the same names the package produces: logits, present.{i}.*, hidden_states.{i}
    ([rows, hidden]), routing.{i}.indices / routing.{i}.weights ([rows, k]).
    """

    def __init__(self, model: Any, kinds: Sequence[LayerKind]) -> None:
        self.model = model
        self.kinds = list(kinds)
        self.cache: Any = None
        self.length = 0
        self._captured: dict[str, np.ndarray] = {}
        self._handles = []
        for i, block in enumerate(_blocks(model)):
            self._handles.append(block.register_forward_hook(self._block_hook(i)))
            gate = getattr(getattr(block, "mixer", None), "gate", None)
            if i < len(self.kinds) and self.kinds[i] is LayerKind.MOE and gate is not None:
                self._handles.append(gate.register_forward_hook(self._router_hook(i)))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _block_hook(self, i: int):
        def hook(module: Any, args: Any, output: Any) -> None:
            hidden = output[0] if isinstance(output, tuple) else output
            self._captured[f"{LAYER_HIDDEN_PREFIX}{i}"] = _numpy(hidden).reshape(
                -1, hidden.shape[-1]
            )

        return hook

    def _router_hook(self, i: int):
        def hook(module: Any, args: Any, output: Any) -> None:
            # transformers' router returns (router_logits, topk_weights, topk_indices)
            if isinstance(output, tuple) and len(output) == 3:
                self._captured[f"routing.{i}.weights"] = _numpy(output[1])
                self._captured[f"routing.{i}.indices"] = output[2].detach().cpu().numpy()

        return hook

    def step(self, input_ids: np.ndarray) -> dict[str, np.ndarray]:
        """One call on `input_ids` [batch, sequence] (no padding), continuing the cache."""
        import torch

        ids = torch.from_numpy(np.asarray(input_ids, dtype=np.int64))
        batch, sequence = ids.shape
        total = self.length + sequence
        mask: Any = torch.ones((batch, total), dtype=torch.int64)
        if LayerKind.ATTENTION not in self.kinds:
            # transformers builds its causal mask from the cache's attention layers and fails
            # when there are none; an all-ones mask needs no mask for recurrent layers either.
            mask = {"full_attention": None, "linear_attention": None}
        positions = torch.arange(self.length, total).expand(batch, -1)
        self._captured = {}
        out = self.model(
            ids, attention_mask=mask, position_ids=positions, cache=self.cache, use_cache=True
        )
        self.cache = out.cache if hasattr(out, "cache") else out.past_key_values
        self.length = total
        arrays = {LOGITS: _numpy(out.logits)}
        arrays.update(reference_cache_arrays(self.cache, self.kinds))
        arrays.update(self._captured)
        return arrays
