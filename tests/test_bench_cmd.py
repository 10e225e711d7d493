"""`mobius bench` as a user runs it: the JSON it writes, and that its timed loops really decode.

The package's timed tokens are checked against run.greedy.greedy on a fresh session; the
transformers peer's against the checkpoint's own model re-run on the whole sequence each step
(no cache), so neither side is checked against bench's own code. No timing is asserted.
"""

from __future__ import annotations

import ctypes
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mobius_lite.cli.main import main
from mobius_lite.layout import DECODER_FILE
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy
from reference_fixtures.nemotron_reference import pinned_torch

PROMPT, DECODE, ROUNDS = 6, 4, 2
SMALL = ["--prompt-tokens", str(PROMPT), "--decode-tokens", str(DECODE)]
SMALL += ["--rounds", str(ROUNDS), "--threads", "1", "--no-progress"]


def bench(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["bench", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def package_greedy(package: Path, prompt: list[int]) -> list[int]:
    """run.greedy.greedy on a fresh session: the prefill's token and one per decode call."""
    session = DecoderSession(package / DECODER_FILE)
    return greedy(session, np.array([prompt], dtype=np.int64), 1 + DECODE).tokens


def uncached_greedy(model: torch.nn.Module, prompt: list[int]) -> list[int]:
    """transformers greedy without a cache: the whole sequence through the model each step."""
    ids = list(prompt)
    with pinned_torch():
        for _ in range(1 + DECODE):
            logits = model(torch.tensor([ids]), use_cache=False).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_bench_writes_every_round_and_decodes_the_model(
    dtype: str, tiny_package, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    package = tiny_package(dtype=dtype)
    out, chart = tmp_path / "bench.json", tmp_path / "bench.png"
    args = [str(package), *SMALL, "--json", str(out), "--chart", str(chart)]
    code, stdout, err = bench(args, capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    assert result["settings"] == {
        "prompt_tokens": PROMPT,
        "decode_tokens": DECODE,
        "rounds": ROUNDS,
        "threads": 1,
        "ep": "cpu",
    }
    assert result["command"] == (
        f"mobius bench {package} --prompt-tokens {PROMPT} --decode-tokens {DECODE} "
        f"--rounds {ROUNDS} --threads 1 --ep cpu"
    )
    assert list(result["peers"]) == ["package"] and result["ratios"] == {}
    assert len(result["prompt"]) == PROMPT
    rounds = result["rounds"]
    assert [(r["round"], r["peer"]) for r in rounds] == [(0, "package"), (1, "package")]
    expected = package_greedy(package, result["prompt"])
    assert result["peers"]["package"]["tokens"] == expected
    for run in rounds:
        assert len(run["decode_ms"]) == DECODE and run["tokens"] == expected
        assert run["prefill_ms"] > 0 and run["load_1min"] is not None
    median = result["peers"]["package"]["median"]
    assert set(median) == {"prefill_ms", "decode_ms_per_token", "tokens_per_s"}
    assert "package" in stdout and "decode ms/token" in stdout
    with Image.open(chart) as image:
        assert image.format == "PNG" and image.size[0] > 100


def test_bench_as_its_own_process_decodes_greedily(tiny_package, tmp_path: Path) -> None:
    """`mobius bench` as its own process puts the package's sessions on onnxruntime's shared
    thread pool, as `mobius generate` does (docs/speculative.md, "Threads"): it still writes
    its run, and the timed tokens are greedy decoding's."""
    import subprocess

    package = tiny_package(dtype="f32")
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "mobius_lite.cli.main", "bench", str(package), *SMALL]
    done = subprocess.run([*command, "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    expected = package_greedy(package, result["prompt"])
    assert all(run["tokens"] == expected for run in result["rounds"])


def test_transformers_peer_decodes_the_same_tokens(
    tiny_package, tiny_checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = tiny_checkpoint()
    out = tmp_path / "bench.json"
    args = [str(tiny_package()), *SMALL, "--checkpoint", str(checkpoint.path), "--json", str(out)]
    code, stdout, err = bench(args, capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    assert list(result["peers"]) == ["package", "transformers"]
    # rotating order: the package first in round 0, transformers first in round 1
    assert [r["peer"] for r in result["rounds"]] == [
        "package",
        "transformers",
        "transformers",
        "package",
    ]
    reference = uncached_greedy(checkpoint.model, result["prompt"])
    assert result["peers"]["transformers"]["tokens"] == reference
    assert result["peers"]["package"]["tokens"] == reference
    assert result["peers"]["transformers"]["tokens_equal_to_package"] == 1 + DECODE
    assert set(result["ratios"]["transformers"]) == {"prefill_ms", "decode_ms_per_token"}
    assert "transformers" in stdout and "package is faster" in stdout


def write_fake_gguf(path: Path) -> Path:
    path.write_bytes(b"GGUF" + bytes(60))
    return path


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "no such package directory"),
        ("not-a-package", "manifest"),
        ("checkpoint", "is a checkpoint"),
        ("gguf-missing", "no such GGUF file"),
        ("gguf-not-gguf", "not a GGUF file"),
        ("gguf-no-llamacpp", "mobius-lite[llamacpp]"),
        ("decode-0", "--decode-tokens must be 1 or more, found 0"),
        ("rounds-negative", "--rounds must be 1 or more, found -2"),
        ("prompt-0", "--prompt-tokens must be 1 or more, found 0"),
        ("checkpoint-not", "is not a checkpoint folder"),
        ("json-folder-missing", "does not exist"),
    ],
)
def test_bad_inputs_are_one_line(
    case: str,
    expected: str,
    tiny_package,
    tiny_checkpoint,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if case == "gguf-no-llamacpp":
        try:
            import llama_cpp  # noqa: F401

            pytest.skip("llama-cpp-python is installed here: the missing-extra line cannot show")
        except ModuleNotFoundError:
            pass
    package = str(tiny_package())
    empty = tmp_path / "empty"
    empty.mkdir()
    args = {
        "missing": [str(tmp_path / "nowhere")],
        "not-a-package": [str(empty)],
        "checkpoint": [str(tiny_checkpoint().path)],
        "gguf-missing": [package, "--gguf", str(tmp_path / "model.gguf")],
        "gguf-not-gguf": [package, "--gguf", str(write_text(tmp_path / "x.gguf"))],
        "gguf-no-llamacpp": [package, "--gguf", str(write_fake_gguf(tmp_path / "m.gguf"))],
        "decode-0": [package, "--decode-tokens", "0"],
        "rounds-negative": [package, "--rounds", "-2"],
        "prompt-0": [package, "--prompt-tokens", "0"],
        "checkpoint-not": [package, "--checkpoint", str(empty)],
        "json-folder-missing": [package, "--json", str(tmp_path / "no" / "b.json")],
    }[case]
    code, stdout, err = bench(args, capsys)
    assert code == 2, err
    assert err.startswith("mobius bench: error: ") and err.count("\n") == 1, err
    assert expected in err, err
    assert stdout == ""


def write_text(path: Path) -> Path:
    path.write_text("not a gguf\n")
    return path


@pytest.fixture(scope="module")
def omni_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import mobius_lite
    from test_omni_package import make_omni

    root = tmp_path_factory.mktemp("bench-omni")
    make_omni(audio=True, final_layernorm=False, rate=0.5, seed=0).save_pretrained(root / "ckpt")
    return mobius_lite.build(root / "ckpt").save(root / "package", quiet=True)


def test_omni_package_times_its_encoders_and_decodes_like_generate(
    omni_package: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mobius_lite.run.omni_session import OmniSession

    out = tmp_path / "bench.json"
    code, stdout, err = bench([str(omni_package), *SMALL, "--json", str(out)], capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    session = OmniSession(omni_package)
    ids = np.array([result["prompt"]], dtype=np.int64)
    expected = session.generate(ids, max_new_tokens=1 + DECODE, stop_at_eos=False).tokens
    assert result["peers"]["package"]["tokens"] == expected
    encoders = {"vision_encoder", "video_encoder", "audio_encoder"}
    for run in result["rounds"]:
        assert run["tokens"] == expected and set(run["encoders_ms"]) == encoders
    median = result["peers"]["package"]["median"]
    assert {f"{name}_ms" for name in encoders} <= set(median)
    assert "encoders (synthetic inputs)" in stdout


def stand_in_llama_cpp(package: Path) -> types.ModuleType:
    """A `llama_cpp` module with the calls the llama.cpp peer makes (Llama(...), reset, eval,
    n_vocab, llama_get_logits_ith on the context), evaluating with the package's decoder.
    llama-cpp-python is not installed here: this checks the peer's sequence of calls (fresh
    context each pass, the prompt in one eval, the last row's argmax fed back), not llama.cpp."""

    class Llama:
        def __init__(self, model_path: str, n_ctx: int, **settings: object) -> None:
            assert Path(model_path).is_file() and n_ctx == PROMPT + DECODE + 1
            self.session = DecoderSession(package / DECODER_FILE)
            self.ctx = self
            self.logits = np.zeros(0, dtype=np.float32)

        def reset(self) -> None:
            self.session.reset(1)

        def eval(self, tokens: list[int]) -> None:
            out = self.session.step(np.array([tokens], dtype=np.int64))
            self.logits = np.ascontiguousarray(out["logits"][0, -1], dtype=np.float32)

        def n_vocab(self) -> int:
            return self.logits.shape[0]

    def llama_get_logits_ith(ctx: Llama, i: int) -> object:
        assert i == -1
        return ctx.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    module = types.ModuleType("llama_cpp")
    module.Llama = Llama
    module.llama_get_logits_ith = llama_get_logits_ith
    return module


def test_three_peers_rotate_and_the_llamacpp_peer_feeds_its_own_tokens(
    tiny_package,
    tiny_checkpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    package = tiny_package()
    monkeypatch.setitem(sys.modules, "llama_cpp", stand_in_llama_cpp(package))
    gguf, out = write_fake_gguf(tmp_path / "model.gguf"), tmp_path / "bench.json"
    args = [str(package), *SMALL, "--gguf", str(gguf), "--json", str(out)]
    code, stdout, err = bench([*args, "--checkpoint", str(tiny_checkpoint().path)], capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    peers = ["package", "llama.cpp", "transformers"]
    assert list(result["peers"]) == peers
    order = [r["peer"] for r in result["rounds"]]
    assert order == peers + peers[1:] + peers[:1]  # round 1 starts one further
    expected = package_greedy(package, result["prompt"])
    for run in result["rounds"]:
        assert run["tokens"] == expected, run["peer"]
    assert set(result["ratios"]) == {"llama.cpp", "transformers"}
    assert "llama.cpp: prefill" in stdout
