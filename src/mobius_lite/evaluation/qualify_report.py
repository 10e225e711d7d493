"""What `mobius qualify` writes and reads back: the report (four verdicts plus the run's
facts), the saved arrays and the short human table."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.scoring import FAIL, Verdict

REPORT_FILE = "report.json"
ARRAYS_FILE = "arrays.npz"
RESCORE_FILE = "rescore.json"
VERDICTS = ("graph_validity", "source_fidelity", "numerical_parity", "generation")
OPTIONAL_VERDICTS = ("mtp_head",)  # packages with an MTP head (evaluation/qualify_mtp.py)


@dataclass
class QualifyReport:
    """The four verdicts plus the run's facts; `as_dict` is what report.json holds."""

    verdicts: dict[str, Verdict]
    run: dict[str, Any] = field(default_factory=dict)
    directory: Path | None = None

    @property
    def failed(self) -> bool:
        return any(v.status == FAIL for v in self.verdicts.values())

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            **{
                name: self.verdicts[name].as_dict()
                for name in VERDICTS + OPTIONAL_VERDICTS
                if name in self.verdicts
            },
            "run": self.run,
        }


RUN_KEY = "meta/run.json"


def save_arrays(
    path: Path, ours: dict[str, np.ndarray], reference: dict[str, np.ndarray], run: dict
) -> None:
    """Every array, plus the run's facts (versions, graph hashes, execution order) as JSON
    text under meta/run.json, so the file documents itself."""
    payload = {f"package/{k}": v for k, v in ours.items()}
    payload.update({f"reference/{k}": v for k, v in reference.items()})
    payload[RUN_KEY] = np.array(json.dumps(run, default=to_json))
    np.savez(path, **payload)


def load_arrays(path: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    ours: dict[str, np.ndarray] = {}
    reference: dict[str, np.ndarray] = {}
    with np.load(path, allow_pickle=False) as data:
        for key in data.files:
            side, _, rest = key.partition("/")
            if side == "package":
                ours[rest] = data[key]
            elif side == "reference":
                reference[rest] = data[key]
    return ours, reference


def to_json(value: Any) -> Any:
    """JSON for the values run facts hold beyond JSON's own (numpy scalars, paths, tuples)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


# ----------------------------------------------------------------------------- human output
def format_table(report: QualifyReport) -> str:
    """A short table readable in ten seconds: one line per verdict, one per array family."""
    lines = [f"{'verdict':<18}{'result':<11}evidence"]
    for name in (*VERDICTS, *(n for n in OPTIONAL_VERDICTS if n in report.verdicts)):
        v = report.verdicts[name]
        lines.append(f"{name:<18}{v.status:<11}{v.summary}")
    families = report.verdicts["numerical_parity"].evidence.get("families", {})
    if families:
        lines.append("")
        lines.append(f"{'array family':<18}{'pass':>9}  {'worst NRMSE':>11}  {'min cosine':>10}")
        for fam, f in families.items():
            lines.append(
                f"{fam:<18}{f['passed']:>4}/{f['compared']:<4}  {f['worst_nrmse']:>11.2e}  "
                f"{f['min_cosine']:>10.6f}"
            )
        routing = report.verdicts["numerical_parity"].evidence.get("routing", {})
        if routing.get("rows"):
            same = routing["rows"] - routing["rows_with_different_expert_sets"]
            lines.append(
                f"{'routing sets':<18}{same:>4}/{routing['rows']:<4}  rows choose the same "
                "experts (reported, not gated)"
            )
    gates = (
        f"gates: finite, NRMSE <= {scoring.GATE_NRMSE}, cosine >= {scoring.GATE_COSINE}, "
        "exact tokens"
    )
    lines += ["", gates]
    quantization = report.run.get("quantization_error")
    if quantization and quantization.get("logits_nrmse_mean") is not None:
        lines.append(
            "quantization error (reported, not gated; the verdicts hold the graph to its "
            f"dequantized weights): logits NRMSE {quantization['logits_nrmse_mean']:.2e} mean, "
            f"{quantization['logits_nrmse_max']:.2e} max against the unquantized source"
        )
    if report.directory is not None:
        lines.append(f"report: {report.directory / REPORT_FILE}")
    return "\n".join(lines)
