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

import importlib.metadata
import json
import platform
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.configs import NemotronHConfig
from mobius_lite.configs.loader import load_text_config
from mobius_lite.configs.model_types import MODEL_TYPES, model_type_of
from mobius_lite.configs.omni import OMNI_MODEL_TYPE
from mobius_lite.enums import Task
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.evaluation import scoring
from mobius_lite.evaluation.dense_reference import ReferenceRequest
from mobius_lite.evaluation.instrument import (
    Instrumentation,
    execution_order,
    external_data_session_options,
    instrument,
)
from mobius_lite.evaluation.qualify_output import is_used, replacing
from mobius_lite.evaluation.qualify_report import (
    ARRAYS_FILE,
    REPORT_FILE,
    RESCORE_FILE,
    QualifyReport,
    load_arrays,
    save_arrays,
    to_json,
)
from mobius_lite.evaluation.qualify_sources import check_same_model, source_config, source_kind
from mobius_lite.evaluation.scoring import NOT_RUN, Verdict
from mobius_lite.evaluation.validity import (
    check_graph,
    graph_verdict,
    profiled_session_options,
    providers_from_profile,
    source_fidelity,
)
from mobius_lite.hashing import sha256_file
from mobius_lite.io_contract import LOGITS, is_window_output
from mobius_lite.layout import CONFIG_FILE, DECODER_FILE, GENAI_CONFIG_FILE, GRAPH_FILES
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from mobius_lite.run.ort_session import session_providers
from mobius_lite.source_kinds import SAFETENSORS_KIND, SourceKind
from mobius_lite.sources.config_json import read_config_json
from mobius_lite.weights.external_data import external_references
from mobius_lite.weights.manifest import read_manifest
from mobius_lite.weights.verify import quantized_at_export

DEFAULT_STEPS = 5
DEFAULT_PROMPT_LENGTH = 16
DEQUANTIZED_WEIGHTS = (
    "the checkpoint's tensors, each one the package quantized at export replaced by the values "
    "its blocks stand for (gguf-py / onnxruntime's quantizer, decoded apart from the export)"
)
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
    "gguf",
)


# ----------------------------------------------------------------------------- facts
def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def graph_files(package_dir: Path) -> dict[str, Any]:
    """sha256 of each graph file (as the manifest lists them, a head's further depth graphs
    included; else the known graph names) and JSON config; external data files (named by
    the graphs' own references, subgraphs included) with their sizes. Weight bytes are
    source_fidelity's evidence."""
    try:
        listed = [package_dir / g["file"] for g in read_manifest(package_dir)["graphs"].values()]
    except (PackageError, KeyError, TypeError):
        listed = []
    graphs = [p for p in listed if p.is_file()] or [
        package_dir / name for name in GRAPH_FILES if (package_dir / name).is_file()
    ]
    hashes = {p.name: sha256_file(p) for p in graphs}
    for name in (GENAI_CONFIG_FILE, CONFIG_FILE):
        if (package_dir / name).is_file():
            hashes[name] = sha256_file(package_dir / name)
    data: dict[str, int] = {}
    for graph in graphs:
        for ref in external_references(graph):
            target = package_dir / ref.location
            data.setdefault(ref.location, target.stat().st_size if target.exists() else -1)
    return {"sha256": hashes, "external_data_bytes": dict(sorted(data.items()))}


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
    """The prompt as token ids, and where they came from: at least one id, each inside the
    vocabulary (the package would fail on an empty or out-of-range prompt, mid-run)."""
    if prompt_ids is not None and prompt is not None:
        raise ConfigError("give either --prompt-ids or --prompt, not both")
    if prompt is not None:
        ids, origin = _tokenized(prompt, package_dir, source)
        if not ids:
            raise ConfigError(
                f"the prompt {prompt!r} tokenizes to no tokens; give a prompt with text in it "
                "(or prompt ids)"
            )
    elif prompt_ids is None:
        rng = np.random.default_rng(0)
        low = min(3, config.vocab_size - 1)
        ids = rng.integers(low, config.vocab_size, size=DEFAULT_PROMPT_LENGTH).tolist()
        return [int(i) for i in ids], f"default: {DEFAULT_PROMPT_LENGTH} ids from numpy seed 0"
    else:
        if not prompt_ids:
            raise ConfigError("the prompt ids are empty; give at least one token id")
        ids, origin = list(prompt_ids), "--prompt-ids"
    bad = [i for i in ids if not 0 <= i < config.vocab_size]
    if bad:
        raise ConfigError(f"--prompt-ids {bad} are outside the vocabulary [0, {config.vocab_size})")
    return ids, origin


def _tokenized(prompt: str, package_dir: Path, source: Path) -> tuple[list[int], str]:
    """`prompt` tokenized with the package's tokenizer, else the source's."""
    from transformers import AutoTokenizer

    for where in (package_dir, source):
        if (where / "tokenizer.json").is_file() or (where / "tokenizer.model").is_file():
            ids = AutoTokenizer.from_pretrained(str(where))(prompt)["input_ids"]
            return [int(i) for i in ids], f"--prompt tokenized with the tokenizer in {where}"
    raise ConfigError(
        f"--prompt needs a tokenizer, but neither {package_dir} nor {source} has one; "
        "pass --prompt-ids instead"
    )


# ----------------------------------------------------------------------------- runs
def _step_names(steps: int) -> list[str]:
    return ["prefill"] + [f"decode{i}" for i in range(steps)]


def _run_onnx(
    stepper: DecoderSession, prompt: list[int], steps: int, feed: list[int] | None = None
) -> tuple[list[dict[str, np.ndarray]], list[int]]:
    """prefill + steps decode calls from a fresh cache (every logit kept); feed the given
    tokens, or the session's own greedy ones."""
    run = greedy(
        stepper, np.array([prompt], dtype=np.int64), steps + 1, forced=feed, prefill_logits=0
    )
    return run.outputs, run.tokens


def _package_runs(
    package_dir: Path,
    config: NemotronHConfig,
    prompt: list[int],
    steps: int,
    workdir: Path,
    providers: list[str],
    say: Any,
) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, str], dict[str, int]]:
    """Run the package graph (profiled first call) and its instrumented twin.

    Returns (graph facts, arrays by step/name, names not captured with the reason,
    execution order of every captured name).
    """
    model_path = package_dir / DECODER_FILE
    say(f"checking {DECODER_FILE}")
    facts: dict[str, Any] = {"checker": check_graph(model_path)}
    say(f"running the package: prefill of {len(prompt)} tokens + {steps} decode steps")
    try:
        options = profiled_session_options(workdir / "profile")
        stepper = DecoderSession(model_path, providers, options)
    except Exception as exc:
        facts["session"] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        return facts, {}, {"*": "the package graph did not load"}, {}
    facts["session"], arrays, tokens = _profiled_run(stepper, prompt, steps)
    del stepper

    taps: Instrumentation = instrument(model_path, config)
    not_compared: dict[str, str] = {}
    for reason in taps.missing:
        not_compared[reason.split(":")[0]] = reason
    tapped: list[dict[str, np.ndarray]] = []
    if taps.taps:
        say("running the instrumented twin (hidden states and routing taps)")
        try:
            tapped = _twin_run(package_dir, taps, prompt, steps, tokens, providers)
        except Exception as exc:  # the taps are lost, the package's own arrays are not
            reason = f"the instrumented graph did not run: {type(exc).__name__}: {exc}"[:500]
            not_compared.update(dict.fromkeys(taps.taps, reason))
    differing = _merge_taps(_step_names(steps), tapped, taps, arrays)
    facts["instrumentation"] = {
        "identical": not differing,
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


def _profiled_run(
    stepper: DecoderSession, prompt: list[int], steps: int
) -> tuple[dict[str, Any], dict[str, np.ndarray], list[int]]:
    """(session facts, arrays by step/name, greedy tokens) of the package graph: a profiled
    prefill (which providers ran the nodes), then the run from a fresh cache."""
    session = stepper.session
    facts: dict[str, Any] = {"ok": True, "providers": session.get_providers()}
    stepper.reset(1)
    first = stepper.step(np.array([prompt], dtype=np.int64))
    facts["nodes_by_provider"] = providers_from_profile(session.end_profiling())
    # the profiled call is the prefill: restart cleanly so every step runs the same way
    plain, tokens = _run_onnx(stepper, prompt, steps)
    facts["profiled_call_identical"] = all(np.array_equal(first[k], plain[0][k]) for k in first)
    arrays: dict[str, np.ndarray] = {}
    for step, out in zip(_step_names(steps), plain, strict=True):
        for name, value in out.items():
            if not is_window_output(name):  # a runtime aid with no reference array
                arrays[f"{step}/{name}"] = value
    return facts, arrays, tokens


def _twin_run(
    package_dir: Path,
    taps: Instrumentation,
    prompt: list[int],
    steps: int,
    tokens: list[int],
    providers: list[str],
) -> list[dict[str, np.ndarray]]:
    """The instrumented graph's outputs per step, fed the package's own greedy tokens."""
    options = external_data_session_options(package_dir)
    twin = DecoderSession(taps.model_bytes, providers, options)
    tapped, _ = _run_onnx(twin, prompt, steps, feed=tokens)
    return tapped


def _merge_taps(
    names: list[str],
    tapped: list[dict[str, np.ndarray]],
    taps: Instrumentation,
    arrays: dict[str, np.ndarray],
) -> list[str]:
    """Add the twin's tapped arrays to `arrays`; return the package outputs the twin computed
    otherwise (any byte differing), by step/name."""
    differing: list[str] = []
    if not tapped:
        return differing
    for step, out in zip(names, tapped, strict=True):
        for name, value in out.items():
            key = f"{step}/{name}"
            if is_window_output(name):
                continue
            if name in taps.taps:
                arrays[key] = value
            elif not (
                value.dtype == arrays[key].dtype
                and value.shape == arrays[key].shape
                and value.tobytes() == arrays[key].tobytes()
            ):
                differing.append(key)
    return differing


def _reference_run(
    source: Path,
    config: NemotronHConfig,
    model_type: str,
    prompt: list[int],
    steps: int,
    kind: SourceKind = SAFETENSORS_KIND,
    source_raw: dict[str, Any] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    from mobius_lite.evaluation.reference import ReferenceRunner, load_reference, pinned_torch

    kinds = [layer.kind for layer in config.layers]
    arrays: dict[str, np.ndarray] = {}
    with pinned_torch() as pinned, tempfile.TemporaryDirectory(prefix="mobius-dense-") as tmp:
        request = ReferenceRequest(source, source_raw or {}, Path(tmp))
        checkpoint = kind.reference_checkpoint()(request)
        model = load_reference(checkpoint, model_type)
        runner = ReferenceRunner(model, kinds)
        ids = np.array([prompt], dtype=np.int64)
        for step in _step_names(steps):
            out = runner.step(ids)
            for name, value in out.items():
                arrays[f"{step}/{name}"] = value
            ids = np.array([[int(np.argmax(out[LOGITS][0, -1]))]], dtype=np.int64)
        runner.close()
        del model, runner
    facts = {"implementation": MODEL_TYPES[model_type].reference_name}
    facts["weights"] = kind.reference_description
    facts["torch_flags"] = pinned
    return arrays, facts


# ----------------------------------------------------------------------------- entry points
def default_output(package_dir: Path) -> Path:
    """A new temporary directory named after the package (never the current directory)."""
    prefix = f"mobius-qualify-{package_dir.resolve().name}-"
    return Path(tempfile.mkdtemp(prefix=prefix))


def _no_prompt_for_omni(package_dir: Path, prompt_given: bool) -> None:
    if prompt_given:
        raise ConfigError(
            f"{package_dir} is an Omni package: qualify runs it on its own synthetic prompt "
            "(random token ids around two generated images), so it takes no prompt; leave "
            "the prompt out"
        )


def _check_output(out_dir: Path) -> None:
    """Refuse a file, or a used directory (overwrite handled by the caller), as the output."""
    if out_dir.exists() and not out_dir.is_dir():
        raise PackageError(
            f"{out_dir} is a file, not a directory; choose a directory path for the report"
        )
    if is_used(out_dir):
        raise PackageError(
            f"{out_dir} exists and is not empty; choose another output directory, or allow "
            "replacing an earlier qualify output (--overwrite)"
        )


def _replacing(output: Path, run: Callable[[Path], QualifyReport]) -> QualifyReport:
    """`run` into a hidden sibling of the earlier qualify output `output`, which it replaces
    when the run returns (evaluation/qualify_output.py)."""
    with replacing(output) as staging:
        report = run(staging)
    report.directory = output
    return report


def qualify(
    package: str | Path,
    source: str | Path,
    *,
    prompt_ids: list[int] | None = None,
    prompt: str | None = None,
    steps: int = DEFAULT_STEPS,
    output: str | Path | None = None,
    ep: str = "cpu",
    quiet: bool = True,
    overwrite: bool = False,
) -> QualifyReport:
    """Qualify `package` against `source`, the checkpoint directory or .gguf file it was built
    from (GGUF and ModelOpt weights are decoded to FP32 for the reference); write report.json
    + arrays.npz into `output` (default: a new temporary directory, report.directory says
    which; `overwrite`: an earlier qualify output there is replaced when the run ends). `ep`
    picks the onnxruntime execution provider; unless `quiet`, each long step is announced
    on stderr."""
    if overwrite and output is not None and is_used(Path(output)):
        options = dict(prompt_ids=prompt_ids, prompt=prompt, steps=steps, ep=ep, quiet=quiet)
        return _replacing(
            Path(output), lambda staging: qualify(package, source, output=staging, **options)
        )
    package_dir = Path(package)
    source_dir = Path(source)
    if not (package_dir / DECODER_FILE).is_file():
        raise PackageError(f"{package_dir}: no {DECODER_FILE}; pass a package directory")
    kind = source_kind(source_dir)
    if steps < 0:
        raise ConfigError(f"--steps must be >= 0, found {steps}")
    out_dir = Path(output) if output is not None else None  # created once inputs are good
    providers = session_providers(ep)
    if out_dir is not None:
        _check_output(out_dir)
    raw = read_config_json(package_dir)
    if model_type_of(raw).task is Task.IMAGE_TEXT_TO_TEXT:  # media graphs: their own runs
        _no_prompt_for_omni(package_dir, prompt_ids is not None or prompt is not None)
        return _qualify_omni(package_dir, source_dir, steps, output, providers, quiet)
    config = load_text_config(raw)
    source_raw = source_config(source_dir, kind, raw)
    model_type = str(source_raw.get("model_type", raw.get("model_type")))
    check_same_model(config, load_text_config(source_raw), source_dir)
    ids, prompt_origin = prompt_tokens(config, package_dir, source_dir, prompt_ids, prompt)
    if out_dir is None:
        out_dir = default_output(package_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = _Inputs(package_dir, source_dir, config, model_type, ids, steps, kind, source_raw)
    return _text_run(inputs, prompt_origin, out_dir, providers, _announcer(quiet))


def _announcer(quiet: bool) -> Callable[[str], None]:
    """`say`: one progress line on stderr, unless `quiet`."""

    def say(message: str) -> None:
        if not quiet:
            print(f"qualify: {message}", file=sys.stderr, flush=True)

    return say


@dataclass(frozen=True)
class _Inputs:
    """What the reference side of a text run reads."""

    package_dir: Path
    source_dir: Path
    config: NemotronHConfig
    model_type: str
    ids: list[int]
    steps: int
    kind: SourceKind
    source_raw: dict[str, Any]


def _text_run(
    inputs: _Inputs,
    prompt_origin: str,
    out_dir: Path,
    providers: list[str],
    say: Callable[[str], None],
) -> QualifyReport:
    """A text package's run: the package (and its instrumented twin), then the reference
    when the package loaded; the verdicts and arrays saved into `out_dir`."""
    package_dir, ids, steps = inputs.package_dir, inputs.ids, inputs.steps
    facts, ours, not_compared, order = _package_runs(
        package_dir, inputs.config, ids, steps, out_dir, providers, say
    )
    verdicts = {"graph_validity": graph_verdict(facts["checker"], facts["session"])}
    verdicts["source_fidelity"] = source_fidelity(package_dir, inputs.source_dir)
    reference: dict[str, np.ndarray] = {}
    reference_facts: dict[str, Any] = {}
    quantization: dict[str, Any] = {}
    head_facts: dict[str, Any] | None = None
    if facts["session"].get("ok"):
        say("running the reference (transformers, torch FP32)")
        reference, reference_facts, quantization, head_facts = _references(
            inputs, ours, facts["tokens"], providers, say
        )
    run = _run_facts(package_dir, inputs.source_dir, inputs.model_type, providers, verdicts)
    if head_facts is not None:
        run["mtp"] = head_facts
    run.update(
        prompt_ids=ids,
        prompt_origin=prompt_origin,
        steps=_step_names(steps),
        execution_order=order,
        not_compared=not_compared,
        instrumentation=facts.get("instrumentation", {}),
        reference=reference_facts,
        int8_activation_kernels=facts["checker"].get("int8_activation_kernels", 0),
    )
    if quantization:
        run["quantization_error"] = quantization
    return _finish(out_dir, _decide(run, ours, reference), ours, reference)


def _references(
    inputs: _Inputs,
    ours: dict[str, np.ndarray],
    tokens: list[int],
    providers: list[str],
    say: Any,
) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, Any], dict[str, Any] | None]:
    """(reference arrays, their facts, the quantization's own error, the MTP head's facts).

    The reference (and the MTP head's) reads the source; for a package quantized at export,
    the source with those tensors dequantized (evaluation/quantized_reference.py), and a
    second run on the unquantized source gives the quantization's error. The head's arrays
    join `ours` and the reference's under "mtp/..."."""
    recipes = quantized_at_export(read_manifest(inputs.package_dir))
    quantization: dict[str, Any] = {}
    head_facts = None
    with tempfile.TemporaryDirectory(prefix="mobius-dequantized-") as tmp:
        where, kind = inputs.source_dir, inputs.kind
        try:
            if recipes:  # the kind's reference with those tensors dequantized
                request = ReferenceRequest(where, inputs.source_raw, Path(tmp), recipes=recipes)
                where = kind.reference_checkpoint()(request)
                kind = SAFETENSORS_KIND  # a dense checkpoint, read as it is
            reference, facts = _reference_run(
                where,
                inputs.config,
                inputs.model_type,
                inputs.ids,
                inputs.steps,
                kind,
                inputs.source_raw,
            )
            if recipes:
                facts["weights"] = DEQUANTIZED_WEIGHTS
                say("running the unquantized source, for the quantization's own error")
                unquantized, _ = _reference_run(
                    inputs.source_dir,
                    inputs.config,
                    inputs.model_type,
                    inputs.ids,
                    inputs.steps,
                    inputs.kind,
                    inputs.source_raw,
                )
                quantization = scoring.quantization_error(ours, unquantized)
        except Exception as exc:  # evidence for the report, never a traceback
            reference, facts = {}, {"error": f"{type(exc).__name__}: {exc}"[:1000]}
        if inputs.config.has_mtp_head:
            from mobius_lite.evaluation.qualify_mtp import run_heads

            say("running the MTP head and the reference head, then speculative decoding")
            names = _step_names(inputs.steps)
            head_facts, head_ours, head_reference = run_heads(
                inputs.package_dir,
                where,
                inputs.ids,
                tokens,
                ours,
                names,
                providers,
                kind=kind,
                source_raw=inputs.source_raw,
            )
            ours.update(head_ours)
            reference.update(head_reference)
    return reference, facts, quantization, head_facts


def _run_facts(
    package_dir: Path,
    source_dir: Path,
    model_type: str,
    providers: list[str],
    verdicts: dict[str, Verdict],
) -> dict[str, Any]:
    """The facts every run records (report.json's "run"), before the run's own."""
    return {
        "package": str(package_dir.resolve()),
        "source": str(source_dir.resolve()),
        "model_type": model_type,
        "providers": providers,
        "versions": versions(),
        "files": graph_files(package_dir),
        "arrays": ARRAYS_FILE,
        "saved_verdicts": {
            "graph_validity": verdicts["graph_validity"].as_dict(),
            "source_fidelity": verdicts["source_fidelity"].as_dict(),
        },
    }


def _finish(
    out_dir: Path,
    report: QualifyReport,
    ours: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
) -> QualifyReport:
    """Save the arrays and report.json of a run into `out_dir`."""
    save_arrays(out_dir / ARRAYS_FILE, ours, reference, report.run)
    report.directory = out_dir
    (out_dir / REPORT_FILE).write_text(json.dumps(report.as_dict(), indent=2, default=to_json))
    return report


def _qualify_omni(
    package_dir: Path,
    source_dir: Path,
    steps: int,
    output: str | Path | None,
    providers: list[str],
    quiet: bool,
) -> QualifyReport:
    """The Omni package's verdicts (evaluation/qualify_omni.py), saved like a text run's."""
    from mobius_lite.evaluation.qualify_omni import qualify_omni_verdicts

    out_dir = Path(output) if output is not None else default_output(package_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    verdicts, facts, ours, reference = qualify_omni_verdicts(
        package_dir, source_dir, steps, providers, quiet
    )
    run = _run_facts(package_dir, source_dir, OMNI_MODEL_TYPE, providers, verdicts)
    run.update(
        prompt_origin="synthetic processed media and a two-image prompt (qualify_omni.py)",
        not_compared={},
        instrumentation={},
        **facts,
    )
    return _finish(out_dir, QualifyReport(verdicts, run), ours, reference)


def _decide(
    run: dict[str, Any], ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]
) -> QualifyReport:
    """All four verdicts from a run's facts and arrays (shared by qualify and rescore)."""
    saved = run["saved_verdicts"]
    head_verdict = None
    if "mtp" in run:  # the head's arrays have their own verdict (evaluation/qualify_mtp.py)
        from mobius_lite.evaluation.qualify_mtp import score_head, split_head_arrays

        ours, head_ours = split_head_arrays(ours)
        reference, head_reference = split_head_arrays(reference)
        head_verdict = score_head(run["mtp"], head_ours, head_reference, run["steps"])
    verdicts = {
        "graph_validity": Verdict.from_dict(saved["graph_validity"]),
        "source_fidelity": Verdict.from_dict(saved["source_fidelity"]),
    }
    if not ours or not reference:
        error = run.get("reference", {}).get("error")
        reason = (
            "the package graph did not run"
            if not ours
            else "the reference did not run" + (f": {error}" if error else "")
        )
        verdicts["numerical_parity"] = Verdict(NOT_RUN, reason, {})
        verdicts["generation"] = Verdict(NOT_RUN, reason, {})
        if head_verdict is not None:
            verdicts["mtp_head"] = head_verdict
        return QualifyReport(verdicts, run)
    steps = run["steps"]
    verdicts["numerical_parity"] = scoring.score_parity(
        ours, reference, steps, run["execution_order"], run["not_compared"], run["instrumentation"]
    )
    if "omni" in run:  # the EVS masks must be exactly equal (evaluation/qualify_omni.py)
        from mobius_lite.evaluation.qualify_omni import with_evs_check

        verdicts["numerical_parity"] = with_evs_check(verdicts["numerical_parity"], run["omni"])
    verdicts["generation"] = scoring.score_generation(ours, reference, steps)
    if run.get("int8_activation_kernels"):
        for name in ("numerical_parity", "generation"):
            verdicts[name] = scoring.not_gated(verdicts[name], run["int8_activation_kernels"])
    if head_verdict is not None:
        verdicts["mtp_head"] = head_verdict
    return QualifyReport(verdicts, run)


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
    (directory / RESCORE_FILE).write_text(json.dumps(report.as_dict(), indent=2, default=to_json))
    return report
