"""`mobius generate` (and qualify) on f16 packages of every kind: text, GGUF (Q8_0) and Omni.

Regression: the runtime built its caches from the config in f32 and fed them to every graph,
so each f16 package failed with onnxruntime's "Unexpected input data type". Now every input's
dtype and every cache input's shape come from the session. References: the f32 package's
greedy tokens, which are themselves checked against transformers' greedy decoding (for GGUF,
on the weights gguf-py dequantizes), and the f16 prefill logits against the f32 ones within
the release gates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

from mobius_lite.cli.main import main
from mobius_lite.evaluation.metrics import RELEASE_COSINE, RELEASE_NRMSE, compare
from mobius_lite.media.image import ImageProcessorConfig, preprocess
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, dequantized_state_dict, write_gguf
from reference_fixtures.nemotron_reference import make_reference, pinned_torch
from test_generate import PROCESSOR, reference_greedy, tokenizer_json
from test_omni_package import make_omni

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])
STEPS = 6
WORDS = " ".join(f"w{i}" for i in (3, 17, 40, 8, 61))


def word_tokenizer(path: Path, size: int) -> None:
    vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(size - 1)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def build(model: str | Path, output: Path, dtype: str) -> Path:
    assert (
        main(["build", "--model", str(model), "--output", str(output), "--dtype", dtype, "-q"]) == 0
    )
    return output


def generate(package: Path, capsys, *extra: str, prompt: str = WORDS) -> list[int]:
    args = ["generate", str(package), "--prompt", prompt, "--ids", "--max-new-tokens", str(STEPS)]
    code = main([*args, *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [int(t) for t in captured.out.split()]


def transformers_greedy(model, ids: list[int], steps: int) -> list[int]:
    """transformers' own greedy decoding (no end-of-sequence stop)."""
    with pinned_torch():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(ids) :]]


def assert_prefill_logits_within_release_gates(f16: Path, f32: Path, ids: list[int]) -> None:
    logits = {}
    for name, package in (("f16", f16), ("f32", f32)):
        session = DecoderSession(package / "model.onnx")
        logits[name] = greedy(session, np.array([ids]), 1, prefill_logits=0).outputs[0]["logits"]
    result = compare("logits", logits["f16"], logits["f32"])
    assert result.passes(RELEASE_NRMSE, RELEASE_COSINE), result


def test_f16_text_package_generates_the_f32_tokens(tmp_path: Path, capsys) -> None:
    model = make_reference(LAYERS, seed=3)
    checkpoint = tmp_path / "checkpoint"
    model.save_pretrained(checkpoint)
    word_tokenizer(checkpoint / "tokenizer.json", model.config.vocab_size)
    f32 = generate(build(checkpoint, tmp_path / "f32", "f32"), capsys)
    f16 = generate(build(checkpoint, tmp_path / "f16", "f16"), capsys)
    ids = Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(WORDS).ids
    assert f32 == transformers_greedy(model, ids, STEPS)
    assert f16 == f32
    assert_prefill_logits_within_release_gates(tmp_path / "f16", tmp_path / "f32", ids)


def test_f16_gguf_q8_0_package_generates_the_f32_tokens(tmp_path: Path, capsys) -> None:
    hybrid = {"layers_block_type": ["mamba", "attention", "mlp", "mamba"], "vocab_size": 304}
    model = make_reference(hybrid, seed=4)
    tokenizer = build_bpe_tokenizer(["the quick brown fox", "state space 1234"] * 4, 300)
    (path,) = write_gguf(
        tmp_path / "model-Q8_0.gguf",
        model,
        "nemotron_h",
        {".": "Q8_0"},  # every 2-D tensor whose rows hold 32-element blocks (the rest F16)
        tokenizer=tokenizer,
        special_tokens={"pad": 0, "bos": 1, "eos": 2},
    )
    prompt = "the quick fox"
    f32 = generate(build(path, tmp_path / "f32", "f32"), capsys, prompt=prompt)
    f16 = generate(build(path, tmp_path / "f16", "f16"), capsys, prompt=prompt)
    rebuilt = type(model)(model.config).eval()
    rebuilt.load_state_dict(dequantized_state_dict(path), strict=True)
    ids = Tokenizer.from_file(str(tmp_path / "f32" / "tokenizer.json")).encode(prompt).ids
    assert f32 == transformers_greedy(rebuilt, ids, STEPS)
    assert f16 == f32
    assert_prefill_logits_within_release_gates(tmp_path / "f16", tmp_path / "f32", ids)


@pytest.fixture(scope="module")
def omni(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("omni-f16")
    model = make_omni(audio=False, final_layernorm=False, rate=0.0, seed=6)
    model.save_pretrained(root / "checkpoint")
    tokenizer_json(root / "checkpoint" / "tokenizer.json")
    (root / "checkpoint" / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    packages = {d: build(root / "checkpoint", root / d, d) for d in ("f32", "f16")}
    return model, root / "checkpoint", packages


def test_f16_omni_package_generates_the_f32_tokens(omni, tmp_path: Path, capsys) -> None:
    model, _, packages = omni
    picture = np.random.default_rng(11).integers(0, 256, size=(20, 28, 3)).astype(np.uint8)
    Image.fromarray(picture).save(tmp_path / "picture.png")
    image = ["--image", str(tmp_path / "picture.png")]
    prompt = "w3 <image> w5 w9"
    f32 = generate(packages["f32"], capsys, *image, prompt=prompt)
    f16 = generate(packages["f16"], capsys, *image, prompt=prompt)
    pixels, grid = preprocess([picture], ImageProcessorConfig.from_dict(PROCESSOR))
    count = int(grid.prod() // 4)
    tok = Tokenizer.from_file(str(packages["f32"] / "tokenizer.json"))
    ids = np.array([tok.encode("w3 <img>" + "<image>" * count + "</img> w5 w9").ids])
    expected = reference_greedy(
        model,
        ids,
        STEPS,
        pixel_values=torch.from_numpy(pixels),
        image_grid_hw=torch.from_numpy(grid),
    )
    assert f32 == expected[: len(f32)]  # generate stops at an end-of-sequence id
    assert f16 == f32


def test_qualify_runs_the_f16_omni_package(omni, tmp_path: Path) -> None:
    """qualify's Omni runs drive the f16 graphs through the same runtime: every verdict is
    decided (none NOT_RUN or failing because the package did not run)."""
    from mobius_lite.evaluation.qualify import qualify

    _, checkpoint, packages = omni
    report = qualify(packages["f16"], checkpoint, steps=2, output=tmp_path / "q", quiet=True)
    for name, verdict in report.verdicts.items():
        assert "did not run" not in verdict.summary, (name, verdict.summary)
    assert report.verdicts["generation"].status == "PASS", report.verdicts["generation"].summary
