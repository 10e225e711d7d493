"""`mobius generate` on a text package stops at the model's end-of-sequence token.

Regression: text generation ran to --max-new-tokens past eos_token_id (Omni stopped). The
reference is transformers' own greedy continuation without a stop; the package's eos id is
set to a token that continuation reaches, so generate must print it and stop there, and with
--ignore-eos print the whole continuation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from mobius_lite.cli.main import main
from reference_fixtures.nemotron_reference import make_reference
from test_runtime_dtypes import LAYERS, WORDS, build, transformers_greedy, word_tokenizer

STEPS = 8


@pytest.fixture(scope="module")
def text_package(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    root = tmp_path_factory.mktemp("eos")
    model = make_reference(LAYERS, seed=3)
    model.save_pretrained(root / "checkpoint")
    word_tokenizer(root / "checkpoint" / "tokenizer.json", model.config.vocab_size)
    package = build(root / "checkpoint", root / "package", "f32")
    ids = Tokenizer.from_file(str(root / "checkpoint" / "tokenizer.json")).encode(WORDS).ids
    return package, transformers_greedy(model, ids, STEPS)


def set_eos(package: Path, eos: int | list[int]) -> None:
    path = package / "config.json"
    config = json.loads(path.read_text())
    config["eos_token_id"] = eos
    path.write_text(json.dumps(config))


def run_generate(package: Path, capsys, *extra: str) -> list[int]:
    args = ["generate", str(package), "--prompt", WORDS, "--ids", "--max-new-tokens", str(STEPS)]
    code = main([*args, *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return [int(t) for t in captured.out.split()]


@pytest.mark.parametrize("form", ["int", "list"])
def test_text_generate_stops_at_eos(text_package, capsys, form: str) -> None:
    package, reference = text_package
    stop = reference[3]
    first = reference.index(stop)
    set_eos(package, stop if form == "int" else [reference[-1] + 1000, stop])
    assert run_generate(package, capsys) == reference[: first + 1]
    assert run_generate(package, capsys, "--ignore-eos") == reference
