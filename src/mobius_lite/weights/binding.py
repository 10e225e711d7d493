"""Binding checkpoint tensors to graph parameters: a name map plus an explicit conversion.

Generic: the model supplies a `NameMap` (which source names may feed a parameter, see
models/nemotron_h_names.py) and the rules for tensors it deliberately does not export; the
storage formats supply the conversion (identity, cast, ...). Nothing is matched by shape.
Every source tensor is bound exactly once or listed as intentionally unused with a reason;
anything else is one error raised before any data is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from mobius_lite.enums import Backend
from mobius_lite.errors import CheckpointError
from mobius_lite.formats.dense import dense
from mobius_lite.formats.parts import PartOf
from mobius_lite.formats.storage import Conversion
from mobius_lite.formats.weight import (
    OUTPUT_SCALE,
    DenseWeight,
    OutputScaled,
    WeightFormat,
    WeightFormatResolver,
)
from mobius_lite.listing import format_names
from mobius_lite.sources.base import TensorInfo, TensorSource
from mobius_lite.sources.names import Candidate, NameMap, SourceRef, as_ref

CONFIG_JSON_HINT = "Check that config.json belongs to these weights."


class ExactNames:
    """The NameMap of a source that uses the graph's own parameter names."""

    def alternatives(self, target: str, shape: tuple[int, ...]) -> list[Candidate]:
        return [(target,)]


@dataclass(frozen=True)
class Binding:
    """One initializer and the source tensor(s) it is made from."""

    target: str
    sources: tuple[str, ...]
    conversion: Conversion
    stacked: bool
    source_dtype: np.dtype
    target_dtype: np.dtype
    shape: tuple[int, ...]
    concat: bool = False  # slices along the existing leading axis rather than a new one

    @property
    def part(self) -> str | None:
        """Which part of a multi-part re-layout this is (one source, several initializers)."""
        return self.conversion.part

    @property
    def transform(self) -> str:
        """The manifest's name for it: identity, cast, stack(+cast), concat(+cast), or the
        storage format's own conversion name."""
        if not self.stacked:
            return self.conversion.name
        joined = "concat" if self.concat else "stack"
        return joined if self.conversion.verbatim else f"{joined}+{self.conversion.name}"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.target_dtype.itemsize


@dataclass
class BindingPlan:
    bindings: list[Binding]
    unused: dict[str, str] = field(default_factory=dict)  # source name -> reason

    def by_target(self) -> dict[str, Binding]:
        return {b.target: b for b in self.bindings}

    @property
    def bound_sources(self) -> set[str]:
        return {name for b in self.bindings for name in b.sources}


def plan_bindings(
    parameters: Mapping[str, tuple[tuple[int, ...], np.dtype]],
    source: TensorSource,
    names: NameMap | None = None,
    intentionally_unused: Mapping[str, str] | None = None,
    *,
    parts: Mapping[str, PartOf] | None = None,
    account_for_all: bool = True,
    hint: str = CONFIG_JSON_HINT,
) -> BindingPlan:
    """Match every parameter (name -> (shape, dtype)) to source tensors; raise on any mismatch.

    intentionally_unused maps source-name regexes to the reason they are not exported. With
    account_for_all=False (a graph that uses part of a checkpoint), source tensors no
    parameter asks for are neither errors nor listed: the package accounts for them. `hint`
    ends the error: what to check for this kind of source. Errors name the source's own
    tensor names (what the file holds), with the graph parameter where it is named otherwise.
    `parts` (formats/parts.py, parameter_parts) maps each parameter that holds a part of a
    re-layout of its weight slot's source tensor to that part: it binds to the slot's tensor,
    converted by the storage's `part_conversion`.
    """
    names = names or ExactNames()
    parts = parts or {}
    available = set(source.names())
    consumed: set[str] = set()
    bindings: list[Binding] = []
    missing: list[str] = []
    misshaped: list[str] = []

    for target, (shape, dtype) in parameters.items():
        shape = tuple(shape)
        part = parts.get(target)
        slot = target if part is None else slot_of(target, part)
        alternatives = list(map(as_ref, names.alternatives(slot, shape)))
        for candidate in alternatives:
            present = [n for n in candidate.names if n in available]
            if not present:
                continue
            if len(present) != len(candidate.names):
                absent = [n for n in candidate.names if n not in available]
                missing.append(f"{target} ({format_names(absent)} absent)")
                break
            binding = _plan_one(target, candidate, shape, np.dtype(dtype), source, misshaped, part)
            consumed.update(candidate.names)
            if binding is not None:
                bindings.append(binding)
            break
        else:
            missing.append(_expected_name(target, alternatives))

    unused: dict[str, str] = {}
    rules = [(re.compile(p), reason) for p, reason in (intentionally_unused or {}).items()]
    leftover = []
    for name in sorted(available - consumed):
        reason = next((r for pattern, r in rules if pattern.search(name)), None)
        if reason is not None:
            unused[name] = reason
        elif account_for_all:
            leftover.append(name)

    problems = []
    twice = _bound_twice(bindings)
    if twice:
        problems.append(f"tensors bound to several parameters: {format_names(twice)}")
    if missing:
        problems.append(f"missing tensors: {format_names(missing)}")
    if misshaped:
        problems.append(f"tensors of the wrong shape: {format_names(misshaped)}")
    if leftover:
        problems.append(f"tensors the config does not use: {format_names(leftover)}")
    if problems:
        raise CheckpointError(
            "the checkpoint does not match its config: " + "; ".join(problems) + ". " + hint
        )
    return BindingPlan(bindings=bindings, unused=unused)


def _expected_name(target: str, alternatives: list[SourceRef]) -> str:
    """A missing parameter as the source would name it: the first name the name map looks for
    (a run of per-expert slices shown as its first and last), and the graph parameter when
    that differs."""
    if not alternatives:
        return target
    names = alternatives[0].names
    expected = names[0] if len(names) == 1 else f"{names[0]} ... {names[-1]}"
    return expected if expected == target else f"{expected} (graph parameter {target})"


def check_accounted(
    plans: list[BindingPlan], source: TensorSource, hint: str = CONFIG_JSON_HINT
) -> None:
    """Raise unless every source tensor is bound or listed unused by one of `plans` (the
    graphs of one package, each planned with account_for_all=False); `hint` as plan_bindings'."""
    accounted: set[str] = set()
    for plan in plans:
        accounted |= plan.bound_sources | set(plan.unused)
    leftover = sorted(set(source.names()) - accounted)
    if leftover:
        raise CheckpointError(
            "the checkpoint does not match its config: tensors the config does not use: "
            f"{format_names(leftover)}. {hint}"
        )


def _bound_twice(bindings: list[Binding]) -> list[str]:
    """Sources feeding several parameters other than as distinct parts of one re-layout."""
    users: dict[str, list[Binding]] = {}
    for binding in bindings:
        for name in binding.sources:
            users.setdefault(name, []).append(binding)
    return [
        f"{name} ({', '.join(b.target for b in bs)})"
        for name, bs in users.items()
        if len(bs) > 1 and (any(b.part is None for b in bs) or len({b.part for b in bs}) != len(bs))
    ]


def _same_shape(stored: tuple[int, ...], expected: tuple[int, ...], reshape: bool) -> bool:
    if reshape:
        return int(np.prod(stored, dtype=np.int64)) == int(np.prod(expected, dtype=np.int64))
    return stored == expected


def converted_shape(conversion: Conversion, stored: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tensor stored as `stored` has once converted: the same, unless the
    conversion changes it (packed rows decoded to elements, a re-layout part)."""
    return tuple(conversion.converted_shape(tuple(stored)))


def slot_of(target: str, part: PartOf) -> str:
    """The weight slot whose source tensor feeds `target`, a parameter holding `part`."""
    if not target.endswith(part.suffix):
        raise ValueError(f"{target} is not named as a {part.suffix} part of its slot")
    return target.removesuffix(part.suffix)


def source_conversion(
    ref: SourceRef, info: TensorInfo, dtype: np.dtype, part: PartOf | None = None
) -> Conversion:
    """How `info`'s bytes become a parameter of element type `dtype`: its storage's
    conversion (with `part`: into that part of a re-layout), wrapped by the candidate's layout
    (a row permutation). The export (plan_bindings) and verify both derive it here."""
    if part is None:
        conversion = info.storage.conversion_to(dense(dtype))
    else:
        conversion = info.storage.part_conversion(part, tuple(info.shape), dtype)
    return conversion if ref.layout is None else ref.layout(conversion, info)


def _plan_one(
    target: str,
    ref: SourceRef,
    shape: tuple[int, ...],
    dtype: np.dtype,
    source: TensorSource,
    misshaped: list[str],
    part: PartOf | None = None,
) -> Binding | None:
    names = ref.names
    stacked = len(names) > 1
    expected = shape[1:] if stacked else shape
    if ref.concat:  # equal slices of the existing leading axis, written one after another
        expected = (shape[0] // len(names), *shape[1:])
        if shape[0] % len(names):
            misshaped.append(f"{target}: {len(names)} equal slices of a leading axis {shape[0]}")
            return None
    elif stacked and shape[0] != len(names):
        misshaped.append(f"{target}: {len(names)} slices for a leading axis of {shape[0]}")
        return None
    infos = [source.info(n) for n in names]
    storages = {i.storage for i in infos}
    if len(storages) != 1:
        misshaped.append(f"{target}: slices stored as {sorted(s.name for s in storages)}")
        return None
    try:
        conversion = source_conversion(ref, infos[0], dtype, part)
    except CheckpointError as exc:  # a layout that cannot apply to this shape (e.g. head rows)
        misshaped.append(
            f"{infos[0].name}: checkpoint {list(infos[0].shape)}, expected {list(expected)} ({exc})"
        )
        return None
    bad = [
        f"{i.name}: checkpoint {list(i.shape)}"
        for i in infos
        if not _same_shape(converted_shape(conversion, i.shape), expected, ref.reshape)
    ]
    if bad:
        misshaped.extend(f"{b}, expected {list(expected)}" for b in bad)
        return None
    return Binding(
        target, names, conversion, stacked, infos[0].dtype, dtype, shape, concat=ref.concat
    )


def source_weight_formats(
    source: TensorSource,
    names: NameMap,
    dtype: ir.DataType,
    backend: Backend,
    *,
    packed: bool = True,
) -> WeightFormatResolver:
    """A weight-format resolver (see components.context): a weight slot takes the format its
    source tensor's storage proposes (`storage.weight_format(dtype, backend, shape, stacked)`;
    dense storage proposes none, so the slot stays dense). With packed=False (dequantize)
    every slot is dense. A slot whose source also has an output-scale tensor (the name map's
    candidates for `<slot>_output_scale`) computes through `OutputScaled` around that format,
    which then works in FLOAT (see formats.weight)."""
    available = set(source.names())

    def present(name: str, shape: tuple[int, ...]) -> SourceRef | None:
        for ref in map(as_ref, names.alternatives(name, shape)):
            if all(n in available for n in ref.names):
                return ref
        return None

    def own_format(
        shape: tuple[int, ...], ref: SourceRef, fmt_dtype: ir.DataType
    ) -> WeightFormat | None:
        if not packed:
            return None
        storage = source.info(ref.names[0]).storage
        return storage.weight_format(fmt_dtype, backend, shape, len(ref.names) > 1)

    def resolve(name: str, shape: tuple[int, ...]) -> WeightFormat | None:
        ref = present(name, shape)
        if ref is None:
            return None
        if present(name + OUTPUT_SCALE, shape) is None:
            return own_format(shape, ref, dtype)
        inner = own_format(shape, ref, ir.DataType.FLOAT) or DenseWeight(ir.DataType.FLOAT)
        return OutputScaled(inner, dtype, stacked=len(shape) == 3)  # [E, out, in]: experts

    return resolve


# --------------------------------------------------------------------------- lazy data
def materialize(binding: Binding, source: TensorSource) -> np.ndarray:
    """The whole initializer as an array (small tensors, tests, onnx_ir's own save path).

    Exports never call this: the writer streams bounded chunks (weights/writer.py).
    """
    parts = []
    for name in binding.sources:
        raw = np.ascontiguousarray(source.read(name)).reshape(-1).view(np.uint8)
        written = binding.conversion.convert(memoryview(raw))
        parts.append(np.frombuffer(written, dtype=binding.target_dtype))
    return np.concatenate(parts).reshape(binding.shape)


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
