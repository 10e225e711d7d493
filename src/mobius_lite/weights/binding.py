"""Binding checkpoint tensors to graph parameters: a name map plus an explicit transform.

Parameter names are the released checkpoint names. The one documented rename table:
- prefix: the graph uses `backbone.`; a source may use `model.` (transformers in memory, Puzzle).
- stacked experts: the graph's `...experts.up_proj` / `...experts.down_proj` ([E, out, in]) come
  either from a tensor of that name or from the released per-expert tensors
  `...experts.{e}.up_proj.weight`, stacked in expert order (transform STACK).
Nothing is matched by shape. Every source tensor is bound exactly once or listed as
intentionally unused with a reason; anything else is an error raised before any data is read.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from mobius_lite.errors import CheckpointError
from mobius_lite.sources.base import TensorSource

GRAPH_PREFIX = "backbone."
SOURCE_PREFIXES = ("backbone.", "model.")
STACKED_EXPERTS = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>up_proj|down_proj)$")
MAX_LISTED = 20


class Transform(str, enum.Enum):
    """How source bytes become initializer bytes."""

    IDENTITY = "identity"  # same dtype and layout: bytes copied unchanged
    CAST = "cast"  # element type conversion only
    STACK = "stack"  # per-expert tensors concatenated along a new leading axis
    STACK_CAST = "stack+cast"


@dataclass(frozen=True)
class Binding:
    """One initializer and the source tensor(s) it is made from."""

    target: str
    sources: tuple[str, ...]
    transform: Transform
    source_dtype: np.dtype
    target_dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.target_dtype.itemsize


@dataclass
class BindingPlan:
    bindings: list[Binding]
    unused: dict[str, str] = field(default_factory=dict)  # source name -> reason

    def by_target(self) -> dict[str, Binding]:
        return {b.target: b for b in self.bindings}


def _source_candidates(name: str) -> list[str]:
    if name.startswith(GRAPH_PREFIX):
        rest = name[len(GRAPH_PREFIX) :]
        return [p + rest for p in SOURCE_PREFIXES]
    return [name]


def _format_names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    more = f" (and {len(names) - MAX_LISTED} more)" if len(names) > MAX_LISTED else ""
    return shown + more


def plan_bindings(
    parameters: dict[str, tuple[tuple[int, ...], np.dtype]],
    source: TensorSource,
    intentionally_unused: dict[str, str] | None = None,
) -> BindingPlan:
    """Match every parameter (name -> (shape, dtype)) to source tensors; raise on any mismatch.

    intentionally_unused maps source-name regexes to the reason they are not exported.
    """
    available = set(source.names())
    consumed: set[str] = set()
    bindings: list[Binding] = []
    missing: list[str] = []
    misshaped: list[str] = []

    for target, (shape, dtype) in parameters.items():
        found = next((c for c in _source_candidates(target) if c in available), None)
        if found is not None:
            info = source.info(found)
            if info.shape != tuple(shape):
                misshaped.append(f"{found}: checkpoint {list(info.shape)}, expected {list(shape)}")
                consumed.add(found)
                continue
            transform = Transform.IDENTITY if info.dtype == dtype else Transform.CAST
            bindings.append(Binding(target, (found,), transform, info.dtype, dtype, tuple(shape)))
            consumed.add(found)
            continue
        stacked = STACKED_EXPERTS.match(target)
        if stacked:
            binding = _plan_stack(target, stacked, shape, dtype, source, available, misshaped)
            if binding is not None:
                bindings.append(binding)
                consumed.update(binding.sources)
                continue
        missing.append(target)

    unused: dict[str, str] = {}
    rules = [(re.compile(p), reason) for p, reason in (intentionally_unused or {}).items()]
    leftover = []
    for name in sorted(available - consumed):
        reason = next((r for pattern, r in rules if pattern.search(name)), None)
        if reason is None:
            leftover.append(name)
        else:
            unused[name] = reason

    problems = []
    if missing:
        problems.append(f"missing tensors: {_format_names(missing)}")
    if misshaped:
        problems.append(f"tensors of the wrong shape: {_format_names(misshaped)}")
    if leftover:
        problems.append(f"tensors the config does not use: {_format_names(leftover)}")
    if problems:
        raise CheckpointError(
            "the checkpoint does not match its config: "
            + "; ".join(problems)
            + ". Check that config.json belongs to these weights."
        )
    return BindingPlan(bindings=bindings, unused=unused)


def _plan_stack(
    target: str,
    match: re.Match[str],
    shape: tuple[int, ...],
    dtype: np.dtype,
    source: TensorSource,
    available: set[str],
    misshaped: list[str],
) -> Binding | None:
    experts = shape[0]
    for prefix in _source_candidates(match["prefix"]):
        names = [f"{prefix}.{e}.{match['proj']}.weight" for e in range(experts)]
        present = [n for n in names if n in available]
        if not present:
            continue
        if len(present) != experts:
            return None  # reported as missing
        infos = [source.info(n) for n in names]
        bad = [f"{i.name}: {list(i.shape)}" for i in infos if i.shape != tuple(shape[1:])]
        if bad:
            misshaped.extend(f"{b}, expected {list(shape[1:])}" for b in bad)
            return None
        dtypes = {i.dtype for i in infos}
        if len(dtypes) != 1:
            misshaped.append(
                f"{target}: experts stored with mixed dtypes {sorted(map(str, dtypes))}"
            )
            return None
        src_dtype = dtypes.pop()
        transform = Transform.STACK if src_dtype == dtype else Transform.STACK_CAST
        return Binding(target, tuple(names), transform, src_dtype, dtype, tuple(shape))
    return None


# --------------------------------------------------------------------------- lazy data
def cast_array(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Element-type conversion with round-to-nearest-even (as torch's .to())."""
    if array.dtype == dtype:
        return array
    return np.asarray(array).astype(dtype)


def materialize(binding: Binding, source: TensorSource) -> np.ndarray:
    """The whole initializer as an array (small tensors, tests, onnx_ir's own save path).

    Exports never call this: the writer streams bounded chunks (weights/writer.py).
    """
    parts = [cast_array(np.asarray(source.read(n)), binding.target_dtype) for n in binding.sources]
    stacked = binding.transform in (Transform.STACK, Transform.STACK_CAST)
    array = np.stack(parts) if stacked else parts[0]
    return np.ascontiguousarray(array).reshape(binding.shape)


class BoundTensor(ir.LazyTensor):
    """An initializer's data: computed from the source on access, never cached in memory."""

    def __init__(self, binding: Binding, source: TensorSource) -> None:
        super().__init__(
            lambda: ir.tensor(materialize(binding, source)),
            dtype=ir.DataType.from_numpy(binding.target_dtype),
            shape=ir.Shape(binding.shape),
            name=binding.target,
        )
        self.binding = binding
        self.source = source


def graph_parameters(model: ir.Model) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """The initializers that need checkpoint data (those without a value yet)."""
    out = {}
    for name, value in model.graph.initializers.items():
        if value.const_value is None:
            out[name] = (tuple(int(d) for d in value.shape), value.dtype.numpy())
    return out


def bind_model(model: ir.Model, plan: BindingPlan, source: TensorSource) -> None:
    """Attach lazy source-backed data to every parameter of `model`."""
    for binding in plan.bindings:
        model.graph.initializers[binding.target].const_value = BoundTensor(binding, source)
