"""`mobius generate` on long runs and bad prompts (issue 30): it keeps no call's outputs, prints
each token as it is chosen, keeps them on SIGINT, refuses empty prompts and prompts past the
package's context_length, takes --prompt-ids without a tokenizer, and reports its speed.

Before: greedy kept every call's logits and cache arrays (memory grew with the square of the
tokens), tokens were printed only at the end (a SIGINT lost them all, exit 2), an empty prompt
was an onnxruntime Reshape traceback, and --max-new-tokens past context_length was not
mentioned. The tokens are checked against transformers' own greedy continuation.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from mobius_lite.cli.main import main
from mobius_lite.cli.token_stream import TokenPrinter
from mobius_lite.errors import ConfigError
from mobius_lite.run.decoder_session import DecoderSession
from mobius_lite.run.greedy import greedy, greedy_tokens
from reference_fixtures.nemotron_reference import make_reference
from test_cli_errors import assert_one_line, run_cli, word_tokenizer
from test_runtime_dtypes import transformers_greedy

LAYERS = dict(layers_block_type=["mamba", "moe", "attention", "mlp"])
CONTEXT = 64  # the checkpoint's max_position_embeddings: the package's context_length
PROMPT = "w1 w2 w3"  # ids 2 3 4 of the word-level tokenizer


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tokenizer, list[int]]:
    """A text package with a tokenizer, and transformers' greedy continuation of PROMPT."""
    root = tmp_path_factory.mktemp("stream")
    model = make_reference({**LAYERS, "max_position_embeddings": CONTEXT}, seed=1)
    model.save_pretrained(root / "checkpoint")
    word_tokenizer(root / "checkpoint" / "tokenizer.json", model.config.vocab_size)
    out = root / "pkg"
    assert main(["build", "--model", str(root / "checkpoint"), "--output", str(out), "-q"]) == 0
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    reference = transformers_greedy(model, tokenizer.encode(PROMPT).ids, 32)
    return out, tokenizer, reference


def generate(package: Path, capsys, *extra: str) -> tuple[int, str, str]:
    args = ["generate", str(package), *extra]
    return run_cli(args, capsys)


# --------------------------------------------------------------------------- memory
def test_generate_keeps_no_call_outputs(text, capsys, monkeypatch) -> None:
    """Every decoder call's outputs (logits, present.*) are released once its token is chosen
    and the next call has run: after call i returns, nothing of calls 0 .. i-2 is alive."""
    package, _, reference = text
    original = DecoderSession.step
    calls: list[list[weakref.ref]] = []
    alive_old: list[int] = []

    def step(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        alive_old.append(sum(any(r() is not None for r in refs) for refs in calls[:-1]))
        calls.append([weakref.ref(v) for v in out.values()])
        return out

    monkeypatch.setattr(DecoderSession, "step", step)
    code, out, err = generate(package, capsys, "--prompt", PROMPT, "--ids", "--ignore-eos")
    assert code == 0, err
    assert [int(t) for t in out.split()] == reference  # the default --max-new-tokens 32
    assert len(calls) == 32 and max(alive_old) == 0, alive_old


def test_greedy_keeps_outputs_only_when_asked(text) -> None:
    package, tokenizer, reference = text
    decoder = DecoderSession(package / "model.onnx")
    ids = np.array([tokenizer.encode(PROMPT).ids])
    kept = greedy(decoder, ids, 6)
    plain = greedy(decoder, ids, 6, keep_outputs=False)
    assert kept.tokens == plain.tokens == reference[:6]
    assert len(kept.outputs) == 6 and plain.outputs == []
    assert list(greedy_tokens(decoder, ids, 6)) == reference[:6]


def test_decoder_session_keeps_no_memory_plan_per_shape(text) -> None:
    """onnxruntime keeps one memory-pattern plan per set of input shapes, and every decode
    call has a new past length: with the pattern on, peak RSS grew by about 7 KB a token
    (measured: docs/cli.md)."""
    decoder = DecoderSession(text[0] / "model.onnx")
    assert decoder.session.get_session_options().enable_mem_pattern is False


# --------------------------------------------------------------------------- streaming
CHILD = textwrap.dedent(
    """\
    import sys, time
    from mobius_lite.cli.main import main
    from mobius_lite.run.decoder_session import DecoderSession

    original = DecoderSession.step
    calls = 0

    def paused(self, *args, **kwargs):
        global calls
        calls += 1
        if calls == 6:  # five tokens chosen and printed; the sixth call waits
            print("READY", file=sys.stderr, flush=True)
            # short sleeps: a signal that lands between the print and a sleep's syscall runs
            # its handler at the next loop turn (one long sleep would hold it for an hour)
            for _ in range(36000):
                time.sleep(0.1)
        return original(self, *args, **kwargs)

    DecoderSession.step = paused
    sys.exit(main(sys.argv[1:]))
    """
)


@pytest.mark.parametrize(
    ("mode", "name", "status"),
    [("ids", "SIGINT", 130), ("text", "SIGINT", 130), ("ids", "SIGTERM", 143)],
)
def test_signal_keeps_the_printed_tokens(text, tmp_path, mode: str, name: str, status: int) -> None:
    package, tokenizer, reference = text
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    args = ["generate", str(package), "--prompt", PROMPT, "--max-new-tokens", "40"]
    args += ["--ignore-eos"] + (["--ids"] if mode == "ids" else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("READY") or len(lines) > 5:
            break
    if not lines or not lines[-1].startswith("READY"):
        proc.kill()
        raise AssertionError(f"generate did not reach the pause: {lines}")
    proc.send_signal(getattr(signal, name))
    out, err = proc.communicate(timeout=60)
    first = reference[:5]
    expected = " ".join(map(str, first)) if mode == "ids" else tokenizer.decode(first)
    assert out == expected + "\n"
    assert proc.returncode == status, err
    interrupted = f"mobius generate: interrupted by {name} after 5 tokens"
    assert err == f"{interrupted}; the tokens printed above are kept\n"


def byte_level_tokenizer() -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2 style) trained on text with multi-byte characters,
    with one special token."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    corpus = ["héllo wörld 日本語 ünïcode ✓ naïve café", "the cat sat on the mat"] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens([AddedToken("<|end|>", special=True)])
    return tokenizer


class Recording(io.StringIO):
    """A stream that records what was written at each flush."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())


def test_text_is_written_as_it_comes_and_joins_to_the_whole_decode() -> None:
    """Tokens split inside multi-byte characters: each flush is a prefix of the final text
    (no U+FFFD), the whole is tokenizers' decode of all tokens, and the special token is
    hidden."""
    tokenizer = byte_level_tokenizer()
    special = tokenizer.token_to_id("<|end|>")
    ids = tokenizer.encode("naïve 日本語 😀 café ✓ the cat").ids  # 😀: 4 bytes, never merged
    tokens = ids[:5] + [special] + ids[5:]
    # bytes of one character split over tokens: a byte-level piece alone decodes to U+FFFD
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokens)
    out = Recording()
    printer = TokenPrinter(tokenizer, out)
    for token in tokens:
        printer.add(token)
    printer.close()
    whole = tokenizer.decode(tokens, skip_special_tokens=True)
    assert out.getvalue() == whole + "\n"
    assert "<|end|>" not in whole and len(out.flushed) > 3
    for text in out.flushed[:-1]:
        assert whole.startswith(text) and "\ufffd" not in text


def test_word_tokens_are_printed_with_their_spaces() -> None:
    vocab = {"<unk>": 0, "a": 1, "b": 2, "c": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.add_special_tokens([AddedToken("</s>", special=True)])
    out = io.StringIO()
    printer = TokenPrinter(tokenizer, out)
    for token in [1, 2, 4, 3, 1]:
        printer.add(token)
    printer.close()
    assert out.getvalue() == tokenizer.decode([1, 2, 4, 3, 1]) + "\n" == "a b c a\n"


# --------------------------------------------------------------------------- prompts
def test_prompt_count_and_speed_on_stderr(text, capsys) -> None:
    package, tokenizer, reference = text
    code, out, err = generate(package, capsys, "--prompt", PROMPT, "--max-new-tokens", "6")
    assert code == 0, err
    assert out == tokenizer.decode(reference[:6]) + "\n"
    lines = err.splitlines()
    assert lines[0] == "prompt: 3 tokens"
    assert lines[-1].startswith("generated 6 tokens in ") and "tokens/s" in lines[-1]


def test_prompt_ids_without_a_tokenizer(text, tmp_path, capsys) -> None:
    package, tokenizer, reference = text
    bare = tmp_path / "pkg"
    shutil.copytree(package, bare)
    (bare / "tokenizer.json").unlink()
    ids = ",".join(map(str, tokenizer.encode(PROMPT).ids))
    code, out, err = generate(bare, capsys, "--prompt-ids", ids, "--max-new-tokens", "5")
    assert code == 0, err
    assert [int(t) for t in out.split()] == reference[:5]
    assert "has no tokenizer.json: printing token ids" in err
    code, _, err = generate(bare, capsys, "--prompt", PROMPT)
    assert_one_line(code, err, "generate", "has no tokenizer.json", "--prompt-ids")


@pytest.mark.parametrize("value", ["", ",", "1,x"])
def test_bad_prompt_ids(text, capsys, value: str) -> None:
    code, _, err = generate(text[0], capsys, "--prompt-ids", value)
    assert_one_line(code, err, "generate", "--prompt-ids")


@pytest.mark.parametrize("prompt", ["", "   "])
@pytest.mark.parametrize("extra", [[], ["--ids"], ["--speculative", "2"]])
def test_empty_prompt_is_one_line(text, capsys, monkeypatch, prompt, extra) -> None:
    """Refused before any session: session creation is made to fail if it is reached."""
    import mobius_lite.run.cached_session as cached_session

    monkeypatch.setattr(cached_session, "create_session", _no_session)
    code, out, err = generate(text[0], capsys, "--prompt", prompt, *extra)
    assert_one_line(code, err, "generate", "encodes to no tokens")
    assert out == ""


def _no_session(*args, **kwargs):
    raise AssertionError("a session was created before the prompt was checked")


def test_empty_prompt_in_the_api(text) -> None:
    decoder = DecoderSession(text[0] / "model.onnx")
    with pytest.raises(ConfigError, match="the prompt is empty"):
        greedy(decoder, np.zeros((1, 0), dtype=np.int64), 4)


def test_past_the_context_length(text, capsys, monkeypatch) -> None:
    """prompt 3 + 61 new = 64 = context_length runs; one more token is refused before any
    session, naming both numbers."""
    package, _, _ = text
    assert json.loads((package / "genai_config.json").read_text())["model"]["context_length"] == 64
    code, out, err = generate(package, capsys, "--prompt", PROMPT, "--ids", "--ignore-eos",
                              "--max-new-tokens", "61")  # fmt: skip
    assert code == 0 and len(out.split()) == 61, err
    import mobius_lite.run.cached_session as cached_session

    monkeypatch.setattr(cached_session, "create_session", _no_session)
    code, _, err = generate(package, capsys, "--prompt", PROMPT, "--max-new-tokens", "62")
    assert_one_line(
        code, err, "generate", "context_length 64", "--max-new-tokens 62", "65 tokens",
        "--max-new-tokens 61 or less",
    )  # fmt: skip


# --------------------------------------------------------------------------- --ep
@pytest.fixture(scope="module")
def bf16_package(text) -> Path:
    """The text checkpoint built as bf16 for the CUDA provider (it builds anywhere)."""
    package = text[0]
    checkpoint, out = package.parent / "checkpoint", package.parent / "bf16"
    args = ["build", "--model", str(checkpoint), "--output", str(out), "-q"]
    assert main([*args, "--dtype", "bf16", "--ep", "cuda"]) == 0
    return out


def test_bf16_package_on_the_cpu_is_refused_before_a_session(
    text, bf16_package, capsys, monkeypatch
) -> None:
    """Before: onnxruntime's NOT_IMPLEMENTED traceback from session creation (generate), a
    graph_validity FAIL after the reference ran (qualify)."""
    import mobius_lite.run.cached_session as cached_session

    monkeypatch.setattr(cached_session, "create_session", _no_session)
    code, _, err = generate(bf16_package, capsys, "--prompt", PROMPT, "--ep", "cpu")
    assert_one_line(code, err, "generate", "bf16 weights", "built for cuda", "--ep cuda")
    qualify = ["qualify", str(bf16_package), "--source", str(text[0].parent / "checkpoint")]
    code, _, err = run_cli([*qualify, "--ep", "cpu", "-q"], capsys)
    assert_one_line(code, err, "qualify", "bf16 weights", "--ep cuda")


def with_node(package: Path, tmp_path: Path, domain: str, op_type: str) -> Path:
    """A copy of `package` whose decoder also computes one node of `op_type` on constant
    inputs (its output a graph output, so no optimizer drops it)."""
    import onnx
    from onnx import TensorProto, helper

    copy = tmp_path / "pkg"
    shutil.copytree(package, copy)
    model = onnx.load(str(copy / "model.onnx"), load_external_data=False)
    consts = {
        "x": helper.make_tensor("x", TensorProto.FLOAT16, [2, 32], [0.0] * 64),
        "w": helper.make_tensor("w", TensorProto.UINT8, [16, 16], [0] * 256),
        "s": helper.make_tensor("s", TensorProto.UINT8, [16, 2], [0] * 32),
        "s2": helper.make_tensor("s2", TensorProto.FLOAT, [], [1.0]),
    }
    model.graph.initializer.extend(consts.values())
    node = helper.make_node(op_type, list(consts), ["extra"], domain=domain, block_size=16)
    model.graph.node.append(node)
    model.graph.output.append(helper.make_tensor_value_info("extra", TensorProto.FLOAT16, None))
    if domain and domain not in {o.domain for o in model.opset_import}:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    onnx.save(model, str(copy / "model.onnx"))
    return copy


def test_cuda_only_operator_on_the_cpu_is_refused(text, tmp_path, capsys, monkeypatch) -> None:
    """A ModelOpt --weights-backend ort decoder's NVFP4 kernel: onnxruntime has it for CUDA
    only. onnxruntime itself refuses the session; generate says so before creating one."""
    from mobius_lite.run.ort_session import SessionError, create_session

    package = with_node(text[0], tmp_path, "com.microsoft", "MatMulBlockQuantizedFp4Weight")
    with pytest.raises(SessionError, match="MatMulBlockQuantizedFp4Weight"):
        create_session(package / "model.onnx")  # the independent evidence: onnxruntime's own
    import mobius_lite.run.cached_session as cached_session

    monkeypatch.setattr(cached_session, "create_session", _no_session)
    code, _, err = generate(package, capsys, "--prompt", PROMPT)
    assert_one_line(
        code, err, "generate", "com.microsoft.MatMulBlockQuantizedFp4Weight", "no cpu kernel"
    )


def test_session_creation_failure_is_one_line(text, tmp_path, capsys) -> None:
    """A graph onnxruntime cannot load for a reason no check foresees: its message, one line."""
    package = with_node(text[0], tmp_path, "", "NoSuchOperator")
    code, _, err = generate(package, capsys, "--prompt", PROMPT)
    assert_one_line(code, err, "generate", "onnxruntime cannot create a session for model.onnx")
    assert "NoSuchOperator" in err


def _accuracy_levels(model_file: Path) -> set[int]:
    import onnx

    graph = onnx.load(str(model_file), load_external_data=False).graph
    return {
        a.i
        for node in graph.node
        if node.op_type in ("MatMulNBits", "QMoE")
        for a in node.attribute
        if a.name == "accuracy_level"
    }


def test_speculation_on_int8_activations_is_said(tmp_path, capsys) -> None:
    """An --activations int8 package built before its experts ran row by row in verifying
    calls (the mid-model benchmark found its speculative tokens differ from plain greedy
    ones) gets one warning line from generate --speculative; one built now, whose decoder
    records the row-by-row window, does not, nor does an exact one."""
    import shutil

    import onnx

    from mobius_lite.demo import write_demo
    from mobius_lite.io_contract import ROW_BY_ROW_WINDOW

    write_demo("mtp", tmp_path / "ckpt")
    flags = ["--quantize", "q8_0", "--backend", "ort"]
    for name, extra in (("int8", ["--activations", "int8"]), ("exact", [])):
        out = tmp_path / name
        args = ["build", "--model", str(tmp_path / "ckpt"), "--output", str(out), "-q"]
        assert main([*args, *flags, *extra]) == 0
    assert 4 in _accuracy_levels(tmp_path / "int8" / "model.onnx")
    assert 4 not in _accuracy_levels(tmp_path / "exact" / "model.onnx")
    shutil.copytree(tmp_path / "int8", tmp_path / "int8_before")
    decoder = tmp_path / "int8_before" / "model.onnx"
    model = onnx.load(str(decoder), load_external_data=False)
    kept = [p for p in model.metadata_props if p.key != ROW_BY_ROW_WINDOW]
    assert len(kept) == len(model.metadata_props) - 1
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(decoder))
    capsys.readouterr()
    for name, warned in (("int8_before", True), ("int8", False), ("exact", False)):
        code, _, err = generate(
            tmp_path / name, capsys, "--prompt-ids", "5,6,7", "--speculative", "2"
        )
        assert code == 0
        assert ("warning: this decoder computes with int8 activations" in err) is warned, err
