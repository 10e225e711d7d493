"""`mobius qualify` against the file a packed package came from: a GGUF file (the reference runs
transformers on gguf-py's dequantized tensors) and a ModelOpt checkpoint (the reference runs on
the decoded NVFP4 / FP8 weights); a source that is not the package's model is refused with the
field that differs and both values; source_fidelity's counts are counts of tensors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mobius_lite.cli.main import main
from mobius_lite.errors import ConfigError
from mobius_lite.evaluation.qualify import qualify
from mobius_lite.evaluation.qualify_report import VERDICTS
from mobius_lite.evaluation.validity import source_fidelity
from reference_fixtures import modelopt_fixtures as mf
from reference_fixtures.gguf_fixtures import write_gguf
from reference_fixtures.nemotron_reference import make_reference

GGUF_PATTERN = ["mamba", "moe", "attention", "moe"]
PROMPT = [5, 17, 33, 8, 61, 12, 40, 3, 77]
STEPS = 3
FAMILIES = (
    "logits",
    "attention_kv",
    "conv_state",
    "recurrent_state",
    "hidden_states",
    "routing_weights",
)


@pytest.fixture(scope="module")
def gguf_package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the .gguf file, its package, the safetensors checkpoint of the same model)."""
    root = tmp_path_factory.mktemp("qualify_gguf")
    model = make_reference(dict(layers_block_type=GGUF_PATTERN, chunk_size=4), seed=2)
    model.save_pretrained(root / "checkpoint")
    (path,) = write_gguf(root / "tiny-Q8_0.gguf", model, "nemotron_h_moe", {r".": "Q8_0"})
    assert main(["build", "--model", str(path), "--output", str(root / "pkg"), "-q"]) == 0
    return path, root / "pkg", root / "checkpoint"


def _statuses(report) -> dict[str, str]:
    return {name: report.verdicts[name].status for name in VERDICTS}


def test_gguf_package_qualifies_against_its_gguf(gguf_package, tmp_path: Path, capsys) -> None:
    """`mobius qualify PKG` with no --source: the manifest records the .gguf."""
    path, package, _ = gguf_package
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest["source"]["model"] == str(path.resolve())
    out = tmp_path / "q"
    args = ["qualify", str(package), "--prompt-ids", ",".join(map(str, PROMPT))]
    code = main([*args, "--steps", str(STEPS), "--output", str(out), "--quiet"])
    assert code == 0, capsys.readouterr()
    report = json.loads((out / "report.json").read_text())
    assert {name: report[name]["status"] for name in VERDICTS} == dict.fromkeys(VERDICTS, "PASS")
    assert report["source_fidelity"]["evidence"]["checked"] > 0
    parity = report["numerical_parity"]["evidence"]
    for family in FAMILIES:
        compared = parity["families"][family]["compared"]
        assert compared > 0 and parity["families"][family]["failed"] == 0, family
    # the packed graph has nodes a dense build has not: its taps are found by scope, all of them
    assert parity["not_compared"] == {}
    assert parity["families"]["hidden_states"]["compared"] == len(GGUF_PATTERN) * (STEPS + 1)
    assert "gguf-py" in report["run"]["reference"]["weights"]
    assert report["run"]["source"] == str(path.resolve())


def test_an_int8_activation_package_is_reported_not_gated(
    gguf_package, tmp_path: Path, capsys
) -> None:
    """`--activations int8` is not exact by design: qualify runs both sides and reports the
    figures, but holds them to no FP32 gate (NOT_GATED, exit 0; before: FAIL, exit 1, on
    routing flips the route is known for), while the graph and weight verdicts stay gated."""
    path, _, _ = gguf_package
    package = tmp_path / "int8"
    build = ["build", "--model", str(path), "--output", str(package), "-q", "--backend", "ort"]
    assert main([*build, "--activations", "int8"]) == 0
    out = tmp_path / "q"
    args = ["qualify", str(package), "--prompt-ids", ",".join(map(str, PROMPT))]
    code = main([*args, "--steps", str(STEPS), "--output", str(out), "--quiet"])
    captured = capsys.readouterr()
    assert code == 0, captured
    report = json.loads((out / "report.json").read_text())
    assert report["graph_validity"]["status"] == report["source_fidelity"]["status"] == "PASS"
    assert report["run"]["int8_activation_kernels"] > 0
    for name in ("numerical_parity", "generation"):
        verdict = report[name]
        assert verdict["status"] == "NOT_GATED", verdict["summary"]
        assert "int8 activations" in verdict["summary"]
        assert verdict["evidence"]["gated_status"] in ("PASS", "FAIL")
    assert report["numerical_parity"]["evidence"]["families"]["logits"]["compared"] > 0
    assert "NOT_GATED" in captured.out


def test_tied_gguf_qualifies(tmp_path: Path) -> None:
    """A GGUF without `output` (the converter drops it when it equals token_embd): the
    reference computes its logits with token_embd too, as llama.cpp does."""
    import gguf
    import torch

    model = make_reference(dict(layers_block_type=["mamba", "attention"], chunk_size=4), seed=3)
    model.config.tie_word_embeddings = True
    with torch.no_grad():
        model.lm_head.weight.copy_(model.model.embeddings.weight)
    (path,) = write_gguf(tmp_path / "tied.gguf", model, "nemotron_h", {r".": "Q8_0"})
    assert all(not t.name.startswith("output.") for t in gguf.GGUFReader(path).tensors)
    assert main(["build", "--model", str(path), "--output", str(tmp_path / "pkg"), "-q"]) == 0
    report = qualify(tmp_path / "pkg", path, prompt_ids=PROMPT, steps=1, output=tmp_path / "q")
    assert _statuses(report) == dict.fromkeys(VERDICTS, "PASS"), report.as_dict()


def test_gguf_with_scale_sidecars_qualifies(tmp_path: Path) -> None:
    """llama.cpp's `.scale` tensors (per tensor and per expert, far from 1): the reference's
    weights are the blocks times their scale, as llama.cpp computes."""
    model = make_reference(dict(layers_block_type=GGUF_PATTERN, chunk_size=4), seed=4)
    experts = model.config.n_routed_experts
    scales = {
        "blk.0.ssm_in.weight": np.array([2.5], np.float32),
        "blk.2.attn_q.weight": np.array([0.3], np.float32),
        "blk.1.ffn_up_exps.weight": np.linspace(0.2, 3.0, experts, dtype=np.float32),
    }
    (path,) = write_gguf(
        tmp_path / "scaled.gguf", model, "nemotron_h_moe", {r".": "Q8_0"}, scales=scales
    )
    assert main(["build", "--model", str(path), "--output", str(tmp_path / "pkg"), "-q"]) == 0
    report = qualify(tmp_path / "pkg", path, prompt_ids=PROMPT, steps=1, output=tmp_path / "q")
    assert _statuses(report) == dict.fromkeys(VERDICTS, "PASS"), report.as_dict()


def test_gguf_package_against_the_original_checkpoint_names_the_field(
    gguf_package, tmp_path: Path, capsys
) -> None:
    """The GGUF does not carry chunk_size (the package has the default 128); the safetensors
    checkpoint says 4. The refusal names the field and both values, not 'mamba vs mamba'."""
    _, package, checkpoint = gguf_package
    with pytest.raises(ConfigError) as caught:
        qualify(package, checkpoint, prompt_ids=PROMPT, steps=1, output=tmp_path / "q")
    message = str(caught.value)
    assert "layer 0: mixer.chunk_size 128 vs 4" in message, message
    assert "mamba vs mamba" not in message

    code = main(
        ["qualify", str(package), "--source", str(checkpoint), "--output", str(tmp_path / "c")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "chunk_size 128 vs 4" in err and "Traceback" not in err
    assert not (tmp_path / "c").exists()


def test_a_different_gguf_is_refused_naming_the_field(gguf_package, tmp_path: Path) -> None:
    _, package, _ = gguf_package
    other = make_reference(dict(layers_block_type=GGUF_PATTERN, num_experts_per_tok=3), seed=2)
    (path,) = write_gguf(tmp_path / "other.gguf", other, "nemotron_h_moe", {r".": "Q8_0"})
    with pytest.raises(ConfigError) as caught:
        qualify(package, path, prompt_ids=PROMPT, steps=1, output=tmp_path / "q")
    message = str(caught.value)
    assert "num_experts_per_tok" in message and "3" in message and "2" in message, message


@pytest.mark.parametrize("variant", ["mixed"])
def test_modelopt_package_qualifies_against_its_checkpoint(variant: str, tmp_path: Path) -> None:
    checkpoint, package = tmp_path / "checkpoint", tmp_path / "pkg"
    mf.write_checkpoint(variant, checkpoint)
    assert main(["build", "--model", str(checkpoint), "--output", str(package), "-q"]) == 0
    report = qualify(package, checkpoint, prompt_ids=PROMPT, steps=STEPS, output=tmp_path / "q")
    assert _statuses(report) == dict.fromkeys(VERDICTS, "PASS"), report.as_dict()
    assert "ModelOpt" in report.run["reference"]["weights"]
    evidence = report.verdicts["numerical_parity"].evidence
    assert evidence["not_compared"] == {}
    for family in FAMILIES:
        assert evidence["families"][family]["compared"] > 0, family


def test_source_fidelity_counts_tensors_not_problems(gguf_package, tmp_path: Path) -> None:
    """Every name missing from the source: the summary gives the package's tensor count and how
    many were compared, never 'N of 0 tensors differ'."""
    _, _, checkpoint = gguf_package
    package = tmp_path / "pkg"
    assert main(["build", "--model", str(checkpoint), "--output", str(package), "-q"]) == 0
    renamed = tmp_path / "renamed"
    shutil.copytree(checkpoint, renamed)
    tensors = load_file(renamed / "model.safetensors")
    save_file({"x." + k: v for k, v in tensors.items()}, renamed / "model.safetensors")
    total = len(json.loads((package / "manifest.json").read_text())["sources"])
    verdict = source_fidelity(package, renamed)
    assert verdict.status == "FAIL"
    assert f"over the package's {total} source tensors" in verdict.summary, verdict.summary
    assert f"{verdict.evidence['checked']} of them compared" in verdict.summary


def test_taps_by_scope_are_the_dense_builds_taps() -> None:
    """On a dense build the scope rule finds exactly the values the name-for-name rule does."""
    import onnx_ir as ir

    from mobius_lite.components.context import BuildContext
    from mobius_lite.configs.loader import load_text_config
    from mobius_lite.enums import Precision
    from mobius_lite.evaluation.instrument import _wanted_taps, scoped_taps
    from mobius_lite.graphs.decoder import build_decoder

    config = load_text_config(make_reference(dict(layers_block_type=GGUF_PATTERN)).config.to_dict())
    wanted, _ = _wanted_taps(config, Precision.F32, False)
    model, _ = build_decoder(config, BuildContext.dense(Precision.F32))
    found = scoped_taps(list(ir.to_proto(model).graph.node), config)
    assert found == wanted and len(found) == len(GGUF_PATTERN) + 2 * GGUF_PATTERN.count("moe")
