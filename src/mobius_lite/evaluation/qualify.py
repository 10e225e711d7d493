"""`mobius qualify`: is this exported package the model? Four separate verdicts.

graph_validity, source_fidelity, numerical_parity and generation are decided independently,
each from its own evidence; a PASS in one never implies another. Both sides run the same
inputs: prefill, then N cached decode steps, each side fed its own previous greedy token and
its own state. Every array is saved (arrays.npz) with the package versions and graph hashes,
so `rescore` re-decides numerical_parity and generation offline from the saved arrays.

Runs happen one after another (package graph, instrumented graph, reference) so that only
one copy of the weights is resident at a time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_text_config, read_config_json
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.instrument import (
    Instrumentation,
    execution_order,
    external_data_session_options,
    instrument,
    package_precision,
)
from mobius_lite.evaluation.scoring import FAIL, NOT_RUN, Verdict
from mobius_lite.evaluation.validity import (
    DEFAULT_PROVIDERS,
    check_graph,
    graph_verdict,
    profiled_session_options,
    providers_from_profile,
    source_fidelity,
)
from mobius_lite.graphs.cache import cache_tensors
from mobius_lite.runtime import empty_cache

MODEL_FILE = "model.onnx"
REPORT_FILE = "report.json"
ARRAYS_FILE = "arrays.npz"
RESCORE_FILE = "rescore.json"
VERDICTS = ("graph_validity", "source_fidelity", "numerical_parity", "generation")
DEFAULT_STEPS = 5
DEFAULT_PROMPT_LENGTH = 16
VERSIONED_PACKAGES = (
    "mobius_lite",
    "numpy",
    "ml_dtypes",
    "onnx",
    "onnx-ir",
    "onnxscript",
    "onnxruntime",
    "onnxruntime-genai",
    "torch",
    "transformers",
    "safetensors",
)


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
            **{name: self.verdicts[name].as_dict() for name in VERDICTS},
            "run": self.run,
        }


# ----------------------------------------------------------------------------- facts
def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def graph_files(package_dir: Path) -> dict[str, Any]:
    """sha256 of each graph file and JSON config; external data files (named by the graph's
    own references) with their sizes. Weight bytes are source_fidelity's evidence."""
    hashes = {p.name: sha256_file(p) for p in sorted(package_dir.glob("*.onnx"))}
    for name in ("genai_config.json", "config.json"):
        if (package_dir / name).is_file():
            hashes[name] = sha256_file(package_dir / name)
    data: dict[str, int] = {}
    for p in sorted(package_dir.glob("*.onnx")):
        proto = onnx.load(str(p), load_external_data=False)
        for init in proto.graph.initializer:
            for entry in init.external_data:
                if entry.key == "location" and entry.value not in data:
                    target = package_dir / entry.value
                    data[entry.value] = target.stat().st_size if target.exists() else -1
    return {"sha256": hashes, "external_data_bytes": data}


def parse_prompt_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise ConfigError(f"--prompt-ids {text!r}: expected comma-separated integers") from None
    if not ids:
        raise ConfigError("--prompt-ids is empty")
    return ids


def prompt_tokens(
    config: NemotronHConfig,
    package_dir: Path,
    source: Path,
    prompt_ids: list[int] | None,
    prompt: str | None,
) -> tuple[list[int], str]:
    """The prompt as token ids, and where they came from."""
    if prompt_ids is not None and prompt is not None:
        raise ConfigError("give either --prompt-ids or --prompt, not both")
    if prompt is not None:
        from transformers import AutoTokenizer

        for where in (package_dir, source):
            if (where / "tokenizer.json").is_file() or (where / "tokenizer.model").is_file():
                ids = AutoTokenizer.from_pretrained(str(where))(prompt)["input_ids"]
                return [int(i) for i in ids], f"--prompt tokenized with the tokenizer in {where}"
        raise ConfigError(
            f"--prompt needs a tokenizer, but neither {package_dir} nor {source} has one; "
            "pass --prompt-ids instead"
        )
    if prompt_ids is None:
        rng = np.random.default_rng(0)
        low = min(3, config.vocab_size - 1)
        ids = rng.integers(low, config.vocab_size, size=DEFAULT_PROMPT_LENGTH).tolist()
        return [int(i) for i in ids], f"default: {DEFAULT_PROMPT_LENGTH} ids from numpy seed 0"
    bad = [i for i in prompt_ids if not 0 <= i < config.vocab_size]
    if bad:
        raise ConfigError(f"--prompt-ids {bad} are outside the vocabulary [0, {config.vocab_size})")
    return list(prompt_ids), "--prompt-ids"


def _check_same_model(package: NemotronHConfig, source: NemotronHConfig, where: Path) -> None:
    """The source must describe the same decoder as the package, or nothing is comparable."""
    problems = []
    for name in ("vocab_size", "hidden_size", "num_hidden_layers"):
        if getattr(package, name) != getattr(source, name):
            problems.append(f"{name} {getattr(package, name)} vs {getattr(source, name)}")
    if not problems:
        differing = [
            f"layer {a.index} ({a.kind.value} vs {b.kind.value})"
            for a, b in zip(package.layers, source.layers, strict=True)
            if a != b
        ]
        problems += differing[:3]
    if problems:
        raise ConfigError(
            f"--source {where} is not the model this package was built from (package vs "
            f"source: {'; '.join(problems)}); pass the checkpoint the package was exported from"
        )


# ----------------------------------------------------------------------------- runs
class _Stepper:
    """Feeds an onnxruntime session one call at a time, carrying its cache."""

    def __init__(self, session: Any, config: NemotronHConfig, dtype: Any) -> None:
        self.session = session
        self.cache = cache_tensors(config.layers, dtype)
        self.names = [o.name for o in session.get_outputs()]
        self.past = empty_cache(self.cache, 1)
        self.length = 0

    def step(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        self.length += ids.shape[1]
        feeds = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((1, self.length), np.int64),
            **self.past,
        }
        out = dict(zip(self.names, self.session.run(None, feeds), strict=True))
        self.past = {c.past_name: out[c.present_name] for c in self.cache}
        return out


def _step_names(steps: int) -> list[str]:
    return ["prefill"] + [f"decode{i}" for i in range(steps)]


def _run_onnx(
    stepper: _Stepper, prompt: list[int], steps: int, feed: list[int] | None = None
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """prefill + steps decode calls; feed the given tokens, or the session's own greedy ones."""
    outputs, tokens = [], []
    ids = np.array([prompt], dtype=np.int64)
    for i in range(steps + 1):
        out = stepper.step(ids)
        outputs.append(out)
        tokens.append(int(np.argmax(out["logits"][0, -1])))
        nxt = feed[i] if feed is not None else tokens[-1]
        ids = np.array([[nxt]], dtype=np.int64)
    return outputs, tokens


def _package_runs(
    package_dir: Path,
    config: NemotronHConfig,
    prompt: list[int],
    steps: int,
    workdir: Path,
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, str], dict[str, int]]:
    """Run the package graph (profiled first call) and its instrumented twin.

    Returns (graph facts, arrays by step/name, names not captured with the reason,
    execution order of every captured name).
    """
    import onnxruntime as ort

    model_path = package_dir / MODEL_FILE
    facts: dict[str, Any] = {"checker": check_graph(model_path)}
    names = _step_names(steps)
    arrays: dict[str, np.ndarray] = {}
    not_compared: dict[str, str] = {}
    proto = onnx.load(str(model_path), load_external_data=False)
    dtype = package_precision(proto).ir_dtype
    del proto
    try:
        options = profiled_session_options(workdir / "profile")
        session = ort.InferenceSession(
            str(model_path), sess_options=options, providers=list(DEFAULT_PROVIDERS)
        )
    except Exception as exc:
        facts["session"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        return facts, arrays, {"*": "the package graph did not load"}, {}
    facts["session"] = {"ok": True, "providers": session.get_providers()}
    stepper = _Stepper(session, config, dtype)
    first = stepper.step(np.array([prompt], dtype=np.int64))
    facts["session"]["nodes_by_provider"] = providers_from_profile(session.end_profiling())
    # the profiled call is the prefill: restart cleanly so every step runs the same way
    stepper = _Stepper(session, config, dtype)
    plain, tokens = _run_onnx(stepper, prompt, steps)
    facts["session"]["profiled_call_identical"] = all(
        np.array_equal(first[k], plain[0][k]) for k in first
    )
    del session, stepper
    for step, out in zip(names, plain, strict=True):
        for name, value in out.items():
            arrays[f"{step}/{name}"] = value

    taps: Instrumentation = instrument(model_path, config)
    for reason in taps.missing:
        not_compared[reason.split(":")[0]] = reason
    identical = True
    differing: list[str] = []
    tapped: list[dict[str, np.ndarray]] = []
    if taps.taps:
        try:
            options = external_data_session_options(package_dir)
            session = ort.InferenceSession(
                taps.model_bytes, sess_options=options, providers=list(DEFAULT_PROVIDERS)
            )
            tapped, _ = _run_onnx(_Stepper(session, config, dtype), prompt, steps, feed=tokens)
            del session
        except Exception as exc:  # the taps are lost, the package's own arrays are not
            reason = f"the instrumented graph did not run: {type(exc).__name__}: {exc}"[:500]
            not_compared.update(dict.fromkeys(taps.taps, reason))
    if tapped:
        for step, out in zip(names, tapped, strict=True):
            for name, value in out.items():
                key = f"{step}/{name}"
                if name in taps.taps:
                    arrays[key] = value
                elif not (
                    value.dtype == arrays[key].dtype
                    and value.shape == arrays[key].shape
                    and value.tobytes() == arrays[key].tobytes()
                ):
                    identical = False
                    differing.append(key)
    facts["instrumentation"] = {
        "identical": identical,
        "differing_outputs": differing[:20],
        "taps": taps.tap_producers,
        "graph_matches_this_build": taps.matches_build,
        "first_difference_from_this_build": taps.first_difference,
        "check": "every output the package graph has is byte-identical in the instrumented "
        "graph at every step",
    }
    facts["tokens"] = tokens
    order = execution_order(model_path, taps.taps)
    return facts, arrays, not_compared, order


def _reference_run(
    source: Path, config: NemotronHConfig, model_type: str, prompt: list[int], steps: int
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from mobius_lite.evaluation.reference import ReferenceRunner, load_reference, pinned_torch

    kinds = [layer.kind for layer in config.layers]
    arrays: dict[str, np.ndarray] = {}
    with pinned_torch() as pinned:
        model = load_reference(source, model_type)
        runner = ReferenceRunner(model, kinds)
        ids = np.array([prompt], dtype=np.int64)
        for step in _step_names(steps):
            out = runner.step(ids)
            for name, value in out.items():
                arrays[f"{step}/{name}"] = value
            ids = np.array([[int(np.argmax(out["logits"][0, -1]))]], dtype=np.int64)
        runner.close()
        del model, runner
    facts = {"implementation": "transformers" if model_type != "nemotron_h_puzzle" else "puzzle"}
    facts["torch_flags"] = pinned
    return arrays, facts


# ----------------------------------------------------------------------------- entry points
def default_output(package_dir: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return Path.cwd() / f"qualify-{package_dir.resolve().name}-{stamp}"


def qualify(
    package: str | Path,
    source: str | Path,
    *,
    prompt_ids: list[int] | None = None,
    prompt: str | None = None,
    steps: int = DEFAULT_STEPS,
    output: str | Path | None = None,
) -> QualifyReport:
    """Qualify `package` against the checkpoint `source`; write report.json + arrays.npz."""
    package_dir = Path(package)
    source_dir = Path(source)
    if not (package_dir / MODEL_FILE).is_file():
        raise PackageError(f"{package_dir}: no {MODEL_FILE}; pass a package directory")
    if not source_dir.is_dir():
        raise ConfigError(f"--source {source_dir}: not a checkpoint directory")
    if steps < 0:
        raise ConfigError(f"--steps must be >= 0, found {steps}")
    out_dir = Path(output) if output is not None else default_output(package_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise PackageError(f"{out_dir} exists and is not empty; choose another --output")
    raw = read_config_json(package_dir)
    config = load_text_config(raw)
    source_raw = read_config_json(source_dir)
    model_type = str(source_raw.get("model_type", raw.get("model_type")))
    _check_same_model(config, load_text_config(source_raw), source_dir)
    ids, prompt_origin = prompt_tokens(config, package_dir, source_dir, prompt_ids, prompt)
    out_dir.mkdir(parents=True, exist_ok=True)

    facts, ours, not_compared, order = _package_runs(package_dir, config, ids, steps, out_dir)
    verdicts = {"graph_validity": graph_verdict(facts["checker"], facts["session"])}
    verdicts["source_fidelity"] = source_fidelity(package_dir, source_dir)
    names = _step_names(steps)
    reference: dict[str, np.ndarray] = {}
    reference_facts: dict[str, Any] = {}
    if facts["session"].get("ok"):
        reference, reference_facts = _reference_run(source_dir, config, model_type, ids, steps)

    run = {
        "package": str(package_dir.resolve()),
        "source": str(source_dir.resolve()),
        "model_type": model_type,
        "prompt_ids": ids,
        "prompt_origin": prompt_origin,
        "steps": names,
        "execution_order": order,
        "not_compared": not_compared,
        "instrumentation": facts.get("instrumentation", {}),
        "reference": reference_facts,
        "versions": versions(),
        "files": graph_files(package_dir),
        "arrays": ARRAYS_FILE,
        "saved_verdicts": {
            "graph_validity": verdicts["graph_validity"].as_dict(),
            "source_fidelity": verdicts["source_fidelity"].as_dict(),
        },
    }
    _save_arrays(out_dir / ARRAYS_FILE, ours, reference, run)
    report = _decide(run, ours, reference)
    report.directory = out_dir
    (out_dir / REPORT_FILE).write_text(json.dumps(report.as_dict(), indent=2, default=_json))
    return report


def _decide(
    run: dict[str, Any], ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]
) -> QualifyReport:
    """All four verdicts from a run's facts and arrays (shared by qualify and rescore)."""
    saved = run["saved_verdicts"]
    verdicts = {
        "graph_validity": Verdict.from_dict(saved["graph_validity"]),
        "source_fidelity": Verdict.from_dict(saved["source_fidelity"]),
    }
    if not ours or not reference:
        reason = "the package graph did not run" if not ours else "the reference did not run"
        verdicts["numerical_parity"] = Verdict(NOT_RUN, reason, {})
        verdicts["generation"] = Verdict(NOT_RUN, reason, {})
        return QualifyReport(verdicts, run)
    steps = run["steps"]
    verdicts["numerical_parity"] = scoring.score_parity(
        ours, reference, steps, run["execution_order"], run["not_compared"], run["instrumentation"]
    )
    verdicts["generation"] = scoring.score_generation(ours, reference, steps)
    return QualifyReport(verdicts, run)


RUN_KEY = "meta/run.json"


def _save_arrays(
    path: Path, ours: dict[str, np.ndarray], reference: dict[str, np.ndarray], run: dict
) -> None:
    """Every array, plus the run's facts (versions, graph hashes, execution order) as JSON
    text under meta/run.json, so the file documents itself."""
    payload = {f"package/{k}": v for k, v in ours.items()}
    payload.update({f"reference/{k}": v for k, v in reference.items()})
    payload[RUN_KEY] = np.array(json.dumps(run, default=_json))
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


def rescore(directory: str | Path) -> QualifyReport:
    """Re-decide the verdicts of a saved run from its arrays alone (no model, no session).

    graph_validity and source_fidelity are carried over from the saved run (they do not come
    from arrays); numerical_parity and generation are recomputed. Writes rescore.json.
    """
    directory = Path(directory)
    report_path = directory / REPORT_FILE
    if not report_path.is_file() or not (directory / ARRAYS_FILE).is_file():
        raise PackageError(
            f"{directory}: not a qualify output (needs {REPORT_FILE} and {ARRAYS_FILE})"
        )
    run = json.loads(report_path.read_text())["run"]
    ours, reference = load_arrays(directory / run.get("arrays", ARRAYS_FILE))
    report = _decide(run, ours, reference)
    report.directory = directory
    (directory / RESCORE_FILE).write_text(json.dumps(report.as_dict(), indent=2, default=_json))
    return report


def _json(value: Any) -> Any:
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
    lines = [f"{'verdict':<18}{'result':<9}evidence"]
    for name in VERDICTS:
        v = report.verdicts[name]
        lines.append(f"{name:<18}{v.status:<9}{v.summary}")
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
    if report.directory is not None:
        lines.append(f"report: {report.directory / REPORT_FILE}")
    return "\n".join(lines)
