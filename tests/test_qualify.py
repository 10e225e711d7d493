"""`mobius qualify`: four separate verdicts, decided from their own evidence, reproducible
offline from the saved arrays."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import mobius_lite
from mobius_lite.cli.main import main
from mobius_lite.errors import ConfigError, PackageError
from mobius_lite.evaluation.qualify import qualify, rescore
from mobius_lite.evaluation.qualify_report import ARRAYS_FILE, VERDICTS
from mobius_lite.evaluation.scoring import GATE_COSINE, GATE_NRMSE
from reference_fixtures.nemotron_reference import make_reference, pinned_torch

PATTERN = ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"]
PROMPT = [5, 17, 33, 8, 61, 12, 40, 3, 77, 21, 9]
STEPS = 4


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("qualify")
    model = make_reference(dict(layers_block_type=PATTERN), seed=0)
    model.save_pretrained(root / "checkpoint")
    mobius_lite.build(root / "checkpoint").save(root / "package", quiet=True)
    return model, root


@pytest.fixture(scope="module")
def passing(exported, tmp_path_factory: pytest.TempPathFactory):
    _, root = exported
    out = tmp_path_factory.mktemp("qualify-out") / "run"
    args = ["qualify", str(root / "package"), "--source", str(root / "checkpoint")]
    args += ["--prompt-ids", ",".join(map(str, PROMPT)), "--steps", str(STEPS)]
    code = main([*args, "--output", str(out)])
    return code, out, json.loads((out / "report.json").read_text())


def _statuses(report: dict) -> dict[str, str]:
    return {name: report[name]["status"] for name in VERDICTS}


def _copy_package(root: Path, name: str) -> Path:
    target = root.parent / f"{root.name}-{name}"
    shutil.copytree(root / "package", target)
    return target


def _external_span(package: Path, tensor: str) -> tuple[Path, int, int]:
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    init = next(i for i in proto.graph.initializer if i.name == tensor)
    entries = {e.key: e.value for e in init.external_data}
    return package / entries["location"], int(entries.get("offset", 0)), int(entries["length"])


def test_passing_package_passes_every_verdict(exported, passing) -> None:
    model, _ = exported
    code, out, report = passing
    assert code == 0
    assert _statuses(report) == dict.fromkeys(VERDICTS, "PASS")
    evidence = report["numerical_parity"]["evidence"]
    families = evidence["families"]
    calls = STEPS + 1
    # every family at every step: 2 Mamba layers, 1 attention layer, 6 blocks, 2 MoE routers
    assert families["logits"]["compared"] == calls
    assert families["conv_state"]["compared"] == 2 * calls
    assert families["recurrent_state"]["compared"] == 2 * calls
    assert families["attention_kv"]["compared"] == 2 * calls
    assert families["hidden_states"]["compared"] == len(PATTERN) * calls
    assert families["routing_weights"]["compared"] == 2 * calls
    for family in families.values():
        assert family["failed"] == 0
        assert family["worst_nrmse"] <= GATE_NRMSE and family["min_cosine"] >= GATE_COSINE
    assert evidence["routing"]["rows"] == 2 * (len(PROMPT) + STEPS)
    assert evidence["instrumentation"]["identical"] is True
    assert evidence["instrumentation"]["graph_matches_this_build"] is True

    validity = report["graph_validity"]["evidence"]
    assert validity["checker"]["ok"] and validity["session"]["ok"]
    assert set(validity["session"]["nodes_by_provider"]) == {"CPUExecutionProvider"}
    assert report["source_fidelity"]["evidence"]["checked"] > 0

    # The reference's tokens are transformers' own greedy generate, independent of qualify.
    with pinned_torch():
        generated = model.generate(
            torch.tensor([PROMPT]),
            attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
            max_new_tokens=calls,
            do_sample=False,
        )
    expected = generated[0, len(PROMPT) :].tolist()
    assert report["generation"]["evidence"]["expected"] == expected
    assert report["generation"]["evidence"]["actual"] == expected

    run = report["run"]
    assert run["prompt_ids"] == PROMPT
    assert set(run["files"]["sha256"]) >= {"model.onnx", "genai_config.json", "config.json"}
    assert run["versions"]["onnxruntime"] and run["versions"]["torch"]
    assert run["versions"]["transformers"] and run["versions"]["mobius_lite"]
    with np.load(out / ARRAYS_FILE) as arrays:
        assert "package/prefill/hidden_states.0" in arrays.files
        assert "reference/decode3/present.0.recurrent_state" in arrays.files
        saved_run = json.loads(str(arrays["meta/run.json"]))
    assert saved_run["files"] == run["files"] and saved_run["versions"] == run["versions"]


def test_perturbed_weight_fails_parity_and_fidelity_but_not_validity(exported, passing) -> None:
    """One weight changed in the external data after export: the graph is still valid, the
    weights are no longer the source's, and the numbers say so from layer 0 on."""
    _, root = exported
    package = _copy_package(root, "perturbed")
    data, offset, length = _external_span(package, "backbone.layers.0.mixer.in_proj.weight")
    with data.open("r+b") as f:
        f.seek(offset)
        values = np.frombuffer(f.read(length), dtype=np.float32) + np.float32(0.5)
        f.seek(offset)
        f.write(values.tobytes())

    out = root.parent / "perturbed-run"
    report = qualify(package, root / "checkpoint", prompt_ids=PROMPT, steps=STEPS, output=out)
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert statuses["graph_validity"] == "PASS"
    assert statuses["source_fidelity"] == "FAIL"
    assert statuses["numerical_parity"] == "FAIL"
    assert report.exit_code == 1
    mismatches = report.verdicts["source_fidelity"].evidence["mismatches"]
    assert any("backbone.layers.0.mixer.in_proj.weight" in m for m in mismatches)
    first = report.verdicts["numerical_parity"].evidence["first_failure_in_execution_order"]
    assert first["name"].startswith("prefill/")
    assert re.search(r"\.0(\.|$)", first["name"]), first["name"]  # a layer-0 array


def test_graph_edit_is_localised_in_execution_order(exported, passing) -> None:
    """The residual Add of layer 3 turned into Sub: weights untouched (fidelity PASS), graph
    valid, parity FAIL with the first failure at layer 3's output, not at the first array in
    report order; layers 0-2 stay within the gates."""
    _, root = exported
    package = _copy_package(root, "edited")
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    residual = [
        n for n in proto.graph.node if re.fullmatch(r"backbone/layers\.3/Add_node_\d+", n.name)
    ]
    assert len(residual) == 1
    residual[0].op_type = "Sub"
    (package / "model.onnx").write_bytes(proto.SerializeToString())

    out = root.parent / "edited-run"
    report = qualify(package, root / "checkpoint", prompt_ids=PROMPT, steps=STEPS, output=out)
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert statuses["graph_validity"] == "PASS"
    assert statuses["source_fidelity"] == "PASS"
    assert statuses["numerical_parity"] == "FAIL"
    evidence = report.verdicts["numerical_parity"].evidence
    assert evidence["first_failure_in_execution_order"]["name"] == "prefill/hidden_states.3"
    assert evidence["instrumentation"]["graph_matches_this_build"] is False
    assert (
        "backbone/layers.3/Add_node"
        in evidence["instrumentation"]["first_difference_from_this_build"]
    )
    prefill = {
        c["name"]: c["passed"] for c in evidence["comparisons"] if c["name"].startswith("prefill/")
    }
    early = [n for n in prefill if re.search(r"\.(0|1|2)(\.|$)", n)]
    assert early and all(prefill[n] for n in early)
    # report order would name another array first: logits sort before hidden_states
    assert sorted(c["name"] for c in evidence["comparisons"] if not c["passed"])[0] != (
        "prefill/hidden_states.3"
    )


def test_invalid_graph_fails_validity_only(exported) -> None:
    _, root = exported
    package = _copy_package(root, "invalid")
    proto = onnx.load(str(package / "model.onnx"), load_external_data=False)
    proto.graph.node[0].op_type = "NoSuchOperator"
    (package / "model.onnx").write_bytes(proto.SerializeToString())
    out = root.parent / "invalid-run"
    report = qualify(package, root / "checkpoint", prompt_ids=PROMPT, steps=1, output=out)
    statuses = {name: v.status for name, v in report.verdicts.items()}
    assert statuses == {
        "graph_validity": "FAIL",
        "source_fidelity": "PASS",
        "numerical_parity": "NOT_RUN",
        "generation": "NOT_RUN",
    }
    assert "NoSuchOperator" in json.dumps(report.verdicts["graph_validity"].evidence)


def test_rescore_reproduces_and_recomputes(passing, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, report = passing
    again = rescore(out)
    reproduced = json.loads(json.dumps(again.as_dict(), default=str))
    for name in VERDICTS:
        assert reproduced[name] == report[name], name
    assert main(["qualify", "--rescore", str(out)]) == 0
    assert "numerical_parity  PASS" in capsys.readouterr().out

    # Rescoring really re-decides from the arrays: change one saved reference array.
    tampered = out.parent / "tampered"
    shutil.copytree(out, tampered)
    with np.load(out / ARRAYS_FILE) as data:
        arrays = {k: data[k] for k in data.files}
    key = "reference/decode1/present.0.recurrent_state"
    arrays[key] = arrays[key] * 2
    np.savez(tampered / ARRAYS_FILE, **arrays)
    changed = rescore(tampered)
    assert changed.verdicts["numerical_parity"].status == "FAIL"
    first = changed.verdicts["numerical_parity"].evidence["first_failure_in_execution_order"]
    assert first["name"] == "decode1/present.0.recurrent_state"
    assert changed.verdicts["generation"].status == "PASS"
    assert main(["qualify", "--rescore", str(tampered)]) == 1


def test_bad_requests_fail_before_any_run(exported, tmp_path: Path) -> None:
    _, root = exported
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        qualify(root / "package", root / "checkpoint", prompt_ids=[5, 500], output=tmp_path / "a")
    with pytest.raises(PackageError, match="no model.onnx"):
        qualify(root / "checkpoint", root / "checkpoint", output=tmp_path / "b")
    other = tmp_path / "other-checkpoint"
    make_reference(dict(layers_block_type=["mlp", *PATTERN[1:]]), seed=0).save_pretrained(other)
    with pytest.raises(ConfigError, match=r"not the model this package was built from.*layer 0"):
        qualify(root / "package", other, output=tmp_path / "c")
    with pytest.raises(PackageError, match="not a qualify output"):
        rescore(tmp_path)
    assert not any((tmp_path / d).exists() for d in ("a", "b", "c"))
    assert main(["qualify"]) == 2  # no PACKAGE (without --source the manifest's source is used)


def test_puzzle_package_qualifies_against_the_puzzle_reference(tmp_path: Path) -> None:
    """model_type nemotron_h_puzzle dispatches to the Puzzle reference (per-layer mixers)."""
    from reference_fixtures.puzzle_fixtures import (
        HETEROGENEOUS_BLOCKS,
        puzzle_raw_config,
        write_puzzle_checkpoint,
    )

    checkpoint, _ = write_puzzle_checkpoint(
        puzzle_raw_config(HETEROGENEOUS_BLOCKS), tmp_path / "checkpoint"
    )
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    report = qualify(package, checkpoint, prompt_ids=PROMPT, steps=2, output=tmp_path / "run")
    assert {n: v.status for n, v in report.verdicts.items()} == dict.fromkeys(VERDICTS, "PASS")
    assert report.run["reference"]["implementation"] == "puzzle"
    families = report.verdicts["numerical_parity"].evidence["families"]
    assert {"conv_state", "recurrent_state", "attention_kv", "hidden_states"} <= set(families)


def test_scores_separate_identical_inputs_from_diverged_ones() -> None:
    """After the greedy tokens part, each side decodes its own token: failures from then on are
    counted apart from failures on identical inputs, and the near-tie is shown."""
    from mobius_lite.evaluation.scoring import score_generation, score_parity

    steps = ["prefill", "decode0", "decode1"]
    rng = np.random.default_rng(0)
    expected = {f"{s}/logits": rng.standard_normal((1, 1, 7)).astype(np.float32) for s in steps}
    actual = {k: v.copy() for k, v in expected.items()}
    top = int(np.argmax(expected["prefill/logits"][0, -1]))
    other = (top + 1) % 7
    # a near tie in the reference, broken the other way by the package (a tiny difference)
    expected["prefill/logits"][0, -1, other] = expected["prefill/logits"][0, -1, top] - 1e-4
    actual["prefill/logits"] = expected["prefill/logits"].copy()
    actual["prefill/logits"][0, -1, [top, other]] = expected["prefill/logits"][0, -1, [other, top]]
    actual["decode0/logits"] = -expected["decode0/logits"]  # a different input, different output
    order = {"logits": 10}
    parity = score_parity(actual, expected, steps, order)
    assert parity.status == "FAIL"
    assert parity.evidence["inputs_differ_from_step"] == "decode0"
    assert parity.evidence["failed_on_identical_inputs"] == 0
    assert parity.evidence["first_failure_in_execution_order"]["name"] == "decode0/logits"
    generation = score_generation(actual, expected, steps)
    assert generation.status == "FAIL"
    assert generation.evidence["first_difference"] == 0
    margin = generation.evidence["at_first_difference"]["reference_margin"]
    assert margin == pytest.approx(
        float(expected["prefill/logits"][0, -1, top] - expected["prefill/logits"][0, -1, other])
    )


@pytest.mark.parametrize("pattern", [["mamba", "mlp", "mamba", "moe"], ["attention", "mlp"]])
def test_packages_without_one_state_kind_qualify(pattern: list[str], tmp_path: Path) -> None:
    """No attention layer (the reference then needs explicit positions and no causal mask) or
    no Mamba layer: the families that exist are compared, the others are simply absent."""
    make_reference(dict(layers_block_type=pattern), seed=2).save_pretrained(tmp_path / "ckpt")
    package = mobius_lite.build(tmp_path / "ckpt").save(tmp_path / "package", quiet=True)
    report = qualify(package, tmp_path / "ckpt", prompt_ids=PROMPT, steps=2, output=tmp_path / "q")
    assert {n: v.status for n, v in report.verdicts.items()} == dict.fromkeys(VERDICTS, "PASS")
    families = set(report.verdicts["numerical_parity"].evidence["families"])
    has_mamba = "mamba" in pattern
    assert ("conv_state" in families) == has_mamba
    assert ("attention_kv" in families) == (not has_mamba)


def test_reference_pins_torch_flags_and_restores_them() -> None:
    from mobius_lite.evaluation.reference import pinned_torch as qualify_pinned

    matmul = torch.backends.cuda.matmul
    before = (matmul.fp32_precision, matmul.allow_fp16_reduced_precision_reduction)
    matmul.fp32_precision = "tf32"
    matmul.allow_fp16_reduced_precision_reduction = True
    try:
        with qualify_pinned() as pinned:
            assert matmul.fp32_precision == "ieee" and torch.backends.fp32_precision == "ieee"
            assert matmul.allow_fp16_reduced_precision_reduction is False
            assert torch.are_deterministic_algorithms_enabled() and not torch.is_grad_enabled()
            assert pinned["fp32_precision"] == "ieee"
        assert matmul.fp32_precision == "tf32"
        assert matmul.allow_fp16_reduced_precision_reduction is True
        assert not torch.are_deterministic_algorithms_enabled() and torch.is_grad_enabled()
    finally:
        matmul.fp32_precision, matmul.allow_fp16_reduced_precision_reduction = before


def test_prompt_text_goes_through_the_checkpoint_tokenizer(tmp_path: Path) -> None:
    """--prompt is tokenized with the tokenizer exported with the package (a word-level
    tokenizer here: "w5" is id 5), so the ids are known independently of qualify."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    checkpoint = tmp_path / "ckpt"
    make_reference(dict(layers_block_type=["mamba", "attention"]), seed=4).save_pretrained(
        checkpoint
    )
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    package = mobius_lite.build(checkpoint).save(tmp_path / "package", quiet=True)
    assert (package / "tokenizer.json").is_file()
    code = main(
        ["qualify", str(package), "--source", str(checkpoint), "--prompt", "w5 w17 w33 w8"]
        + ["--steps", "1", "--output", str(tmp_path / "q")]
    )
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    assert code == 0
    assert report["run"]["prompt_ids"] == [5, 17, 33, 8]
    assert "tokenizer" in report["run"]["prompt_origin"]


def test_default_output_is_a_new_temporary_directory(
    exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Regression: qualify wrote qualify-<package>-<time>/ into the current directory (two such
    folders were committed). Now the default is a new temporary directory, printed at the end;
    nothing lands in the current directory, and no onnxruntime profile file is left behind."""
    import tempfile

    _, root = exported
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    args = ["qualify", str(root / "package"), "--source", str(root / "checkpoint")]
    code = main([*args, "--prompt-ids", "5,17,33", "--steps", "1"])
    captured = capsys.readouterr()
    assert code == 0, captured.out
    assert list(cwd.iterdir()) == []
    (line,) = [line for line in captured.out.splitlines() if line.startswith("report: ")]
    report = Path(line.removeprefix("report: "))
    directory = report.parent
    assert directory.parent == Path(tempfile.gettempdir())
    assert directory.name.startswith("mobius-qualify-package-")
    assert sorted(p.name for p in directory.iterdir()) == ["arrays.npz", "report.json"]
    # progress on stderr by default, none with --quiet
    assert "qualify: running the reference" in captured.err
    code = main([*args, "--prompt-ids", "5,17,33", "--steps", "1", "--quiet"])
    captured = capsys.readouterr()
    assert code == 0 and "qualify:" not in captured.err
    shutil.rmtree(directory)


def test_ep_cuda_without_the_provider_is_one_clear_error(exported, tmp_path: Path) -> None:
    import onnxruntime as ort

    _, root = exported
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the refusal cannot be observed")
    args = ["qualify", str(root / "package"), "--source", str(root / "checkpoint")]
    with pytest.raises(mobius_lite.errors.RouteError, match="install onnxruntime-gpu"):
        qualify(root / "package", root / "checkpoint", ep="cuda", output=tmp_path / "q")
    assert main([*args, "--ep", "cuda", "--output", str(tmp_path / "q")]) == 2
    assert not (tmp_path / "q").exists()


def test_help_shows_every_default(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["qualify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 5)" in text and "(default: cpu;" in text
    assert "default: a new temporary directory" in text and "--quiet" in text


def test_a_reference_that_breaks_is_reported_not_raised(
    exported, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reference that cannot run (a config transformers rejects, a missing kernel) leaves
    numerical_parity and generation NOT_RUN with the error as the reason, not a traceback."""
    from mobius_lite.evaluation import qualify as harness

    def broken(*args, **kwargs):
        raise IndexError("index 1 is out of bounds")

    monkeypatch.setattr(harness, "_reference_run", broken)
    _, root = exported
    report = qualify(root / "package", root / "checkpoint", steps=1, output=tmp_path / "q")
    for name in ("numerical_parity", "generation"):
        verdict = report.verdicts[name]
        assert (
            verdict.status == "NOT_RUN"
            and "IndexError: index 1 is out of bounds" in verdict.summary
        )
    assert report.verdicts["graph_validity"].status == "PASS"
