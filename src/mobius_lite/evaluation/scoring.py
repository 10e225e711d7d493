"""Scoring saved arrays into the numerical_parity and generation verdicts.

Works from arrays alone (the package's and the reference's, per step and name) plus the
graph execution order recorded at capture time, so a saved run re-scores offline with the
same result. The gates are constants; nothing loosens them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, Comparison, compare
from mobius_lite.io_contract import LAYER_HIDDEN_PREFIX

PASS = "PASS"
FAIL = "FAIL"
NOT_RUN = "NOT_RUN"
# computed and reported, but no fixed gate applies (a package with int8 activations)
NOT_GATED = "NOT_GATED"

# Fixed qualification gates (LESSONS): all finite, NRMSE <= 0.03, cosine >= 0.999, exact tokens.
GATE_NRMSE = RELEASE_NRMSE
GATE_COSINE = RELEASE_COSINE
GATES = {"finite": True, "nrmse_max": GATE_NRMSE, "cosine_min": GATE_COSINE, "tokens": "exact"}

# Families every package run must produce when its layers carry them; the rest are optional.
REQUIRED_FAMILIES = ("logits", "attention_kv", "conv_state", "recurrent_state")
WORST_LISTED = 5
ROUTING_EXAMPLES = 5


@dataclass
class Verdict:
    """One top-level verdict: PASS / FAIL / NOT_RUN / NOT_GATED, a one-line summary, and its
    evidence."""

    status: str
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "summary": self.summary, "evidence": self.evidence}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(data["status"], data.get("summary", ""), dict(data.get("evidence", {})))


def family_of(name: str) -> str:
    """The array family of an output name (logits, hidden_states, attention_kv, ...)."""
    if name == "logits":
        return "logits"
    if name.startswith(LAYER_HIDDEN_PREFIX):
        return "hidden_states"
    if name.startswith("routing.") and name.endswith(".weights"):
        return "routing_weights"
    if name.startswith("routing.") and name.endswith(".indices"):
        return "routing_sets"
    if name.endswith((".key", ".value")):
        return "attention_kv"
    if name.endswith(".conv_state"):
        return "conv_state"
    if name.endswith(".recurrent_state"):
        return "recurrent_state"
    if name.endswith("_features"):  # Omni: image / video / audio encoder outputs
        return "media_features"
    return "other"


def split_key(key: str) -> tuple[str, str]:
    step, _, name = key.partition("/")
    return step, name


def greedy_tokens(arrays: Mapping[str, np.ndarray], steps: list[str]) -> list[int]:
    """The greedy token chosen after each step: argmax of the last position's logits (row 0)."""
    return [int(np.argmax(arrays[f"{step}/logits"][0, -1])) for step in steps]


def _comparison_dict(c: Comparison, order: int, passed: bool) -> dict[str, Any]:
    d = c.as_dict()
    d["shape"] = list(c.shape)
    d["family"] = family_of(split_key(c.name)[1])
    d["execution_order"] = order
    d["passed"] = passed
    return d


def _routing(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], keys: list[str]
) -> tuple[dict[str, Any], list[tuple[str, np.ndarray, np.ndarray]]]:
    """Compare chosen expert sets row by row; weights are compared only where the sets agree,
    aligned by expert id. Differing sets are evidence, reported in full count, never gated."""
    rows = differing = 0
    examples = []
    weight_pairs = []
    for key in keys:
        ours, ref = actual[key], expected[key]
        ours = ours.reshape(-1, ours.shape[-1])
        ref = ref.reshape(-1, ref.shape[-1])
        same = np.ones(ours.shape[0], dtype=bool)
        for row in range(min(ours.shape[0], ref.shape[0])):
            rows += 1
            if set(ours[row].tolist()) != set(ref[row].tolist()):
                same[row] = False
                differing += 1
                if len(examples) < ROUTING_EXAMPLES:
                    examples.append(
                        {
                            "array": key,
                            "row": row,
                            "package": sorted(ours[row].tolist()),
                            "reference": sorted(ref[row].tolist()),
                        }
                    )
        weights_key = key[: -len("indices")] + "weights"
        if weights_key in actual and weights_key in expected and same.any():
            w_ours = actual[weights_key].reshape(ours.shape)[same]
            w_ref = expected[weights_key].reshape(ref.shape)[same]
            # align weights by expert id: sort each row's experts
            o_idx = np.argsort(ours[same], axis=-1)
            r_idx = np.argsort(ref[same], axis=-1)
            w_ours = np.take_along_axis(w_ours, o_idx, axis=-1)
            w_ref = np.take_along_axis(w_ref, r_idx, axis=-1)
            weight_pairs.append((weights_key, w_ours, w_ref))
    evidence = {
        "rows": rows,
        "rows_with_different_expert_sets": differing,
        "examples": examples,
        "note": "routing is discrete: differing expert sets are reported, not gated; their "
        "effect is gated through hidden states, caches and logits. Router weights are compared "
        "(gated) on rows whose sets agree, aligned by expert id.",
    }
    return evidence, weight_pairs


def score_parity(
    actual: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    steps: list[str],
    order: Mapping[str, int],
    not_compared: Mapping[str, str] | None = None,
    instrumentation: Mapping[str, Any] | None = None,
) -> Verdict:
    """Every array present on both sides, compared against the fixed gates."""
    shared = [k for k in actual if k in expected]
    routing_keys = [k for k in shared if family_of(split_key(k)[1]) == "routing_sets"]
    routing, weight_pairs = _routing(actual, expected, routing_keys)
    pairs = [
        (key, actual[key], expected[key])
        for key in shared
        if family_of(split_key(key)[1]) not in ("routing_sets", "routing_weights")
    ]
    comparisons, problems = _compare_pairs([*pairs, *weight_pairs], steps, order)

    one_sided = sorted(set(actual) ^ set(expected))
    missing_required = [k for k in one_sided if family_of(split_key(k)[1]) in REQUIRED_FAMILIES]
    failures = sorted(
        (c for c in comparisons if not c["passed"]), key=lambda c: c["execution_order"]
    )
    worst = sorted(comparisons, key=lambda c: (-c["nrmse"], c["cosine"]))[:WORST_LISTED]
    invariant = True if instrumentation is None else bool(instrumentation.get("identical", True))
    diverged = _inputs_differ_from(actual, expected, steps)
    same_inputs = [
        c for c in failures if diverged is None or split_key(c["name"])[0] not in steps[diverged:]
    ]

    evidence: dict[str, Any] = {
        "gates": GATES,
        "families": _families(comparisons),
        "compared": len(comparisons),
        "failed": len(failures),
        "worst": worst,
        "first_failure_in_execution_order": failures[0] if failures else None,
        "inputs_differ_from_step": steps[diverged] if diverged is not None else None,
        "failed_on_identical_inputs": len(same_inputs),
        "execution_order": "step by step; within a step, the topological position of the node "
        "producing the array in the package graph",
        "routing": routing,
        "not_compared": dict(not_compared or {}),
        "one_sided_arrays": one_sided,
        "instrumentation": dict(instrumentation or {}),
        "comparisons": sorted(comparisons, key=lambda c: c["execution_order"]),
    }
    if missing_required:
        problems.append(f"arrays produced by one side only: {', '.join(missing_required[:10])}")
    if not invariant:
        problems.append("the instrumented graph changed an output of the package graph")
    evidence["problems"] = problems
    if not comparisons:
        return Verdict(NOT_RUN, "no arrays to compare", evidence)
    if failures or problems:
        first = failures[0]["name"] if failures else problems[0]
        summary = f"{len(failures)}/{len(comparisons)} arrays outside the gates; first: {first}"
        if diverged is not None:
            summary += (
                f" ({len(same_inputs)} on identical inputs; from {steps[diverged]} on each side "
                "decodes its own, different, greedy token)"
            )
        return Verdict(FAIL, summary, evidence)
    return Verdict(PASS, _pass_summary(worst[0], len(comparisons), not_compared), evidence)


def _compare_pairs(
    pairs: list[tuple[str, np.ndarray, np.ndarray]], steps: list[str], order: Mapping[str, int]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Each (key, package array, reference array) against the gates, placed in execution order
    (step by step, then the producing node's position): the comparisons, and the arrays that
    could not be compared at all."""
    step_index = {s: i for i, s in enumerate(steps)}
    span = max(order.values(), default=0) + 1
    comparisons: list[dict[str, Any]] = []
    problems: list[str] = []
    for key, a, e in pairs:
        step, name = split_key(key)
        where = step_index.get(step, len(steps)) * span + order.get(name, span)
        # contiguous first: float64 reductions then sum in one order, in memory or from npz
        a, e = np.ascontiguousarray(a), np.ascontiguousarray(e)
        try:
            c = compare(key, a, e)
        except ValueError as exc:
            problems.append(str(exc))
            comparisons.append(_incomparable(key, name, a, where, exc))
            continue
        comparisons.append(_comparison_dict(c, where, c.passes(GATE_NRMSE, GATE_COSINE)))
    return comparisons, problems


def _incomparable(key: str, name: str, a: np.ndarray, where: int, exc: Exception) -> dict[str, Any]:
    """The failed comparison of two arrays `compare` refuses (e.g. shapes that differ)."""
    return {
        "name": key,
        "family": family_of(name),
        "shape": list(np.shape(a)),
        "finite": bool(np.isfinite(a).all()),
        "nrmse": float("inf"),
        "cosine": -1.0,
        "max_abs": float("inf"),
        "execution_order": where,
        "passed": False,
        "error": str(exc),
    }


def _families(comparisons: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per array family: compared / passed / failed counts and the worst figures."""
    families: dict[str, dict[str, Any]] = {}
    for c in comparisons:
        f = families.setdefault(
            c["family"],
            {
                "compared": 0,
                "passed": 0,
                "failed": 0,
                "worst_nrmse": 0.0,
                "min_cosine": 1.0,
                "max_abs": 0.0,
            },
        )
        f["compared"] += 1
        f["passed" if c["passed"] else "failed"] += 1
        f["worst_nrmse"] = max(f["worst_nrmse"], c["nrmse"])
        f["min_cosine"] = min(f["min_cosine"], c["cosine"])
        f["max_abs"] = max(f["max_abs"], c["max_abs"])
    return families


def _pass_summary(
    worst: dict[str, Any], compared: int, not_compared: Mapping[str, str] | None
) -> str:
    summary = (
        f"{compared}/{compared} arrays within the gates "
        f"(worst {worst['name']}: NRMSE {worst['nrmse']:.1e}, "
        f"cosine {worst['cosine']:.6f})"
    )
    if not_compared:
        summary += f"; {len(not_compared)} arrays not compared (see not_compared)"
    return summary


def _inputs_differ_from(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], steps: list[str]
) -> int | None:
    """Index of the first step fed different tokens on the two sides (None: never)."""
    for i, step in enumerate(steps[:-1]):
        key = f"{step}/logits"
        if key not in actual or key not in expected:
            return None
        if int(np.argmax(actual[key][0, -1])) != int(np.argmax(expected[key][0, -1])):
            return i + 1
    return None


def score_generation(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], steps: list[str]
) -> Verdict:
    """Exact greedy tokens: each side fed its own previous token and state; FAIL whenever
    either side's logits are not all finite."""
    if not steps or any(
        f"{s}/logits" not in actual or f"{s}/logits" not in expected for s in steps
    ):
        return Verdict(NOT_RUN, "logits missing for a step", {})
    nonfinite = {
        f"{side}/{s}": int(
            np.size(arrays[f"{s}/logits"]) - np.isfinite(arrays[f"{s}/logits"]).sum()
        )
        for side, arrays in (("package", actual), ("reference", expected))
        for s in steps
        if not np.isfinite(arrays[f"{s}/logits"]).all()
    }
    if nonfinite:
        # argmax over NaN logits picks token 0 on both sides: equal tokens mean nothing.
        where = ", ".join(f"{k} ({n} values)" for k, n in nonfinite.items())
        return Verdict(
            FAIL,
            f"non-finite logits, so greedy tokens are not evidence: {where}",
            {"nonfinite_logits": nonfinite},
        )
    ours = greedy_tokens(actual, steps)
    ref = greedy_tokens(expected, steps)
    first = next((i for i, (a, e) in enumerate(zip(ours, ref, strict=True)) if a != e), None)
    evidence = {
        "expected": ref,
        "actual": ours,
        "first_difference": first,
        "fed": "each side its own previous greedy token and its own state",
    }
    if first is None:
        return Verdict(PASS, f"{len(ours)}/{len(ref)} greedy tokens identical", evidence)
    # how close the call was: both candidates' logits on both sides at the first difference
    key = f"{steps[first]}/logits"
    a, e = actual[key][0, -1], expected[key][0, -1]
    evidence["at_first_difference"] = {
        "reference_logits": {
            str(ref[first]): float(e[ref[first]]),
            str(ours[first]): float(e[ours[first]]),
        },
        "package_logits": {
            str(ref[first]): float(a[ref[first]]),
            str(ours[first]): float(a[ours[first]]),
        },
        "reference_margin": float(e[ref[first]] - e[ours[first]]),
    }
    margin = evidence["at_first_difference"]["reference_margin"]
    return Verdict(
        FAIL,
        f"greedy tokens differ from token {first} (reference margin there {margin:.1e}): "
        f"{ours} vs {ref}",
        evidence,
    )


def not_gated(verdict: Verdict, kernels: int) -> Verdict:
    """A package on int8 activations (`--activations int8`) is not exact by design: its
    comparison with the FP32 reference is reported with the measured figures, not gated
    (the route's gate is llama.cpp's own error on the same weights, docs/performance.md)."""
    summary = (
        f"not gated: {kernels} kernels compute with int8 activations (--activations int8), "
        f"which the FP32 gates do not apply to; measured: {verdict.summary}"
    )
    evidence = {**verdict.evidence, "gated_status": verdict.status}
    return Verdict(NOT_GATED, summary, evidence)


def quantization_error(
    ours: dict[str, np.ndarray], unquantized: dict[str, np.ndarray]
) -> dict[str, Any]:
    """The package's logits against transformers on the unquantized source: the quantization's
    own error, reported beside the verdicts and never gated (the verdicts hold the graph to
    its dequantized weights)."""
    steps = []
    for name in sorted(n for n in ours if n.endswith("/logits") and n in unquantized):
        c = compare(name, ours[name], unquantized[name])
        steps.append({"array": name, "nrmse": c.nrmse, "cosine": c.cosine, "finite": c.finite})
    nrmse = [s["nrmse"] for s in steps]
    return {
        "against": "transformers on the unquantized source checkpoint (torch FP32)",
        "gated": False,
        "logits_nrmse_mean": float(np.mean(nrmse)) if nrmse else None,
        "logits_nrmse_max": float(np.max(nrmse)) if nrmse else None,
        "steps": steps,
    }
