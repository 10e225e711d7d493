"""The bad-input survey of issue 30 (docs/bad_inputs.md): every `mobius` command run as a new
user would, with bad values, missing files, the wrong kind of package and signals, on the demo
checkpoints (`mobius demo`). Run it to regenerate the table:

    python tests/survey_bad_inputs.py [WORKDIR]

Each case records the exit status, the last line of stderr, whether a Python traceback was
printed, and a check of its own (e.g. the files it must not touch). The fixed cases are also
tests (tests/test_bad_input_survey.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300
MAX_MESSAGE = 300  # characters of a message shown in the table


@dataclass
class Case:
    kind: str  # what is wrong: "bad value", "missing file", "wrong package", "signal", ...
    args: list[str]
    expect: int = 2  # the exit status a user should get
    setup: Callable[[Path], None] | None = None
    check: Callable[[Path], str | None] | None = None  # a problem on disk, or None
    signal_after: float | None = None  # send SIGINT this many seconds after start
    signal_when: str | None = None  # ... or as soon as this glob matches in the work dir
    cwd: str = "."  # relative to the work dir
    notes: str = ""
    printed: bool = False  # stdout must hold something (tokens printed before a signal)
    owner: str = ""  # a failure here is another engineer's to fix (issue 30: "generate", "build")


@dataclass
class Outcome:
    case: Case
    code: int
    message: str
    traceback: bool
    problem: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        one_line = self.code == 0 or bool(self.message)
        return (
            self.code == self.case.expect and not self.traceback and not self.problem and one_line
        )


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}


def mobius(args: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "mobius_lite.cli.main", *args]
    return subprocess.run(
        command, cwd=cwd, env=env(), capture_output=True, text=True, timeout=TIMEOUT, **kw
    )


def prepare(work: Path) -> None:
    """Demo checkpoints and packages the cases run on (in `work`)."""
    for kind in ("text", "mtp", "omni"):
        mobius(["demo", kind, f"{kind}-ckpt"], work)
        mobius(["build", "--model", f"{kind}-ckpt", "--output", f"{kind}-pkg", "-q"], work)
    mobius(["demo", "gguf", "demo.gguf"], work)
    mobius(
        ["qualify", "text-pkg", "--source", "text-ckpt", "--steps", "1", "--output", "q1", "-q"],
        work,
    )
    (work / "notes").mkdir(exist_ok=True)
    (work / "notes" / "mine.txt").write_text("mine")
    (work / "file.txt").write_text("not a directory")
    (work / "not-a-picture.png").write_text("text, not an image")
    (work / "empty").mkdir(exist_ok=True)
    (work / "empty-cwd").mkdir(exist_ok=True)
    from PIL import Image

    Image.new("RGB", (16, 16), (200, 30, 30)).save(work / "red.png")
    truncated = work / "truncated-pkg"
    shutil.copytree(work / "text-pkg", truncated)
    data = truncated / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    shutil.copytree(work / "text-pkg", work / "no-tokenizer-pkg")
    (work / "no-tokenizer-pkg" / "tokenizer.json").unlink()


def run_case(case: Case, work: Path) -> Outcome:
    if case.setup:
        case.setup(work)
    command = [sys.executable, "-m", "mobius_lite.cli.main", *case.args]
    process = subprocess.Popen(
        command,
        cwd=work / case.cwd,
        env=env(),
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if case.signal_after is not None:
        time.sleep(case.signal_after)
        process.send_signal(signal.SIGINT)
    elif case.signal_when is not None:
        deadline = time.time() + TIMEOUT
        while process.poll() is None and time.time() < deadline:
            if any(work.glob(case.signal_when)):
                process.send_signal(signal.SIGINT)
                break
            time.sleep(0.002)
    try:
        out, err = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        return Outcome(case, -9, f"no result in {TIMEOUT} s", False)
    lines = [line for line in err.splitlines() if line.strip() and "it/s]" not in line]
    errors = [line for line in lines if ": error: " in line or "interrupted" in line]
    message = (errors or lines or [""])[-1]
    problem = case.check(work) if case.check else None
    if case.printed and not out.strip():
        problem = "nothing was printed on stdout"
    outcome = Outcome(case, process.returncode, message.strip(), "Traceback" in err, problem)
    outcome.extra["stdout_lines"] = len(out.splitlines())
    return outcome


def untouched(path: str, content: str) -> Callable[[Path], str | None]:
    def check(work: Path) -> str | None:
        target = work / path
        if not target.is_file() or target.read_text() != content:
            return f"{path} was changed"
        return None

    return check


def absent_or_complete(path: str) -> Callable[[Path], str | None]:
    """Interrupted: nothing left behind; finished first: a whole package."""

    def check(work: Path) -> str | None:
        if (work / path / "manifest.json").is_file():
            return None
        return absent(path)(work)

    return check


def absent(path: str) -> Callable[[Path], str | None]:
    def check(work: Path) -> str | None:
        leftovers = [p.name for p in work.iterdir() if p.name.startswith(f".{path}.")]
        if (work / path).exists() or leftovers:
            return f"{path} or its staging directory was left behind"
        return None

    return check


def cases() -> list[Case]:
    B, G, Q, V, Ins, D = "build", "generate", "qualify", "verify", "inspect", "demo"
    return [
        # top level
        Case("bad value", ["frobnicate"], notes="unknown command"),
        Case("bad value", [], notes="no command"),
        # demo
        Case("bad value", [D, "foo", "x"], notes="unknown kind"),
        Case("missing value", [D, "text"]),
        Case("existing output", [D, "text", "notes"], check=untouched("notes/mine.txt", "mine")),
        Case(
            "existing output",
            [D, "text", "file.txt"],
            check=untouched("file.txt", "not a directory"),
        ),
        Case("bad value", [D, "gguf", "demo-out"], notes="GGUF name without .gguf"),
        Case("missing directory", [D, "text", "no/such/parent/ckpt"]),
        Case("bad value", [D, "text", "ok-ckpt", "--seed", "x"]),
        # build
        Case("missing file", [B, "--model", "no/such/dir", "--output", "o1"], check=absent("o1")),
        Case(
            "missing file",
            [B, "--model", "text-ck", "--output", "o1"],
            notes="mistyped relative path",
            check=absent("o1"),
        ),
        Case("missing file", [B, "--model", "missing.gguf", "--output", "o1"], check=absent("o1")),
        Case(
            "wrong input",
            [B, "--model", "text-pkg", "--output", "o1"],
            notes="a package as --model",
            check=absent("o1"),
        ),
        Case("wrong input", [B, "--model", "file.txt", "--output", "o1"], check=absent("o1")),
        Case(
            "existing output",
            [B, "--model", "text-ckpt", "--output", "notes"],
            check=untouched("notes/mine.txt", "mine"),
        ),
        Case(
            "existing output",
            [B, "--model", "text-ckpt", "--output", "notes", "--overwrite"],
            notes="not a package",
            check=untouched("notes/mine.txt", "mine"),
        ),
        Case(
            "existing output",
            [B, "--model", "text-ckpt", "--output", "file.txt"],
            check=untouched("file.txt", "not a directory"),
        ),
        Case("bad value", [B, "--model", "text-ckpt", "--output", "o1", "--dtype", "f8"]),
        Case("bad value", [B, "--model", "text-ckpt", "--output", "o1", "--shard-size", "0"]),
        Case("bad value", [B, "--model", "text-ckpt", "--output", "o1", "--shard-size", "12XB"]),
        Case("bad value", [B, "--model", "text-ckpt", "--output", "o1", "--ep", "tpu"]),
        Case(
            "bad route",
            [B, "--model", "text-ckpt", "--output", "o1", "--dtype", "bf16"],
            notes="bf16 on the CPU EP",
            check=absent("o1"),
        ),
        Case(
            "bad route",
            [B, "--model", "text-ckpt", "--output", "o1", "--activations", "int8"],
            notes="int8 activations on a dense checkpoint",
            check=absent("o1"),
        ),
        Case(
            "bad value",
            [B, "--model", "text-ckpt", "--output", "o1", "--task", "image-text-to-text"],
            check=absent("o1"),
        ),
        Case(
            "bad value",
            [B, "--model", "text-ckpt", "--output", "o1", "--config", "nope.json"],
            owner="build",
            check=absent("o1"),
        ),
        Case(
            "bad value",
            [B, "--model", "demo.gguf", "--output", "o1", "--config", "file.txt"],
            check=absent("o1"),
        ),
        Case(
            "bad value",
            [B, "--model", "text-ckpt", "--output", "o1", "--gguf-file", "x.gguf"],
            notes="--gguf-file with a local directory",
            check=absent("o1"),
        ),
        Case(
            "bad value",
            [B, "--model", "demo.gguf", "--output", "."],
            notes="--output .",
            check=None,
        ),
        Case("bad value", [B, "--model", "demo.gguf", "--output", ""], notes='--output ""'),
        Case(
            "signal",
            [B, "--model", "omni-ckpt", "--output", "o-sig"],
            signal_when=".o-sig.partial-*",
            check=absent_or_complete("o-sig"),
            notes="SIGINT as soon as the staging directory appears",
        ),
        Case(
            "bad value",
            [B, "--model", "../demo.gguf", "--output", "."],
            expect=0,
            cwd="empty-cwd",
            notes="--output . in an empty directory",
            owner="build",
        ),
        Case(
            "bad value",
            [B, "--model", "text-ckpt", "--output", "o1", "--revision", "abc"],
            notes="--revision with a local directory",
        ),
        Case("bad value", [D, "gguf", "demo.gguf"], notes="the GGUF file exists"),
        # inspect
        Case("missing file", [Ins, "no-such-pkg"]),
        Case("wrong input", [Ins, "text-ckpt"], notes="a checkpoint, not a package"),
        Case("wrong input", [Ins, "file.txt"]),
        Case("wrong input", [Ins, "empty"]),
        # verify
        Case("missing file", [V, "no-such-pkg"]),
        Case("wrong input", [V, "text-ckpt"], notes="a checkpoint as the package"),
        Case(
            "wrong source",
            [V, "text-pkg", "--source", "mtp-ckpt"],
            expect=1,
            notes="another checkpoint: mismatches listed",
        ),
        Case("missing file", [V, "text-pkg", "--source", "no/such/ckpt"]),
        Case("wrong source", [V, "text-pkg", "--source", "demo.gguf"], expect=1),
        # qualify
        Case("missing value", [Q]),
        Case("missing file", [Q, "no-such-pkg", "--source", "text-ckpt"]),
        Case("wrong input", [Q, "text-ckpt", "--source", "text-ckpt"]),
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--steps", "-1"]),
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--steps", "many"]),
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--prompt-ids", "1,x"]),
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--prompt-ids", "99999"]),
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--prompt", ""]),
        Case(
            "existing output",
            [Q, "text-pkg", "--source", "text-ckpt", "--output", "q1"],
            notes="an earlier qualify output, no --overwrite",
        ),
        Case(
            "existing output",
            [Q, "text-pkg", "--source", "text-ckpt", "--output", "notes", "--overwrite"],
            check=untouched("notes/mine.txt", "mine"),
        ),
        Case(
            "wrong source",
            [Q, "text-pkg", "--source", "mtp-ckpt", "--steps", "1"],
            expect=1,
            notes="same shapes, other weights: verdicts FAIL",
        ),
        Case("bad value", [Q, "--rescore", "notes"]),
        Case("bad value", [Q, "--rescore", "q1", "--overwrite"]),
        Case(
            "bad value",
            [Q, "text-pkg", "--source", "text-ckpt", "--ep", "cuda", "--steps", "1"],
            notes="CUDA EP without onnxruntime-gpu",
        ),
        # generate
        Case("missing value", [G, "text-pkg"], notes="no --prompt"),
        Case("wrong input", [G, "text-ckpt", "--prompt", "hi"]),
        Case("bad value", [G, "text-pkg", "--prompt", ""], notes="empty prompt", owner="generate"),
        Case("bad value", [G, "text-pkg", "--prompt", "hi", "--max-new-tokens", "0"]),
        Case("bad value", [G, "text-pkg", "--prompt", "hi", "--max-new-tokens", "-3"]),
        Case(
            "bad value",
            [G, "text-pkg", "--prompt", "hi", "--max-new-tokens", "100000"],
            notes="past context_length (4096)",
            owner="generate",
        ),
        Case(
            "bad value",
            [G, "text-pkg", "--prompt", "hi", "--speculative", "2"],
            notes="no MTP head",
        ),
        Case(
            "documented value",
            [G, "mtp-pkg", "--prompt", "hi", "--speculative", "0"],
            expect=0,
            notes="0 turns speculation off, as --help says",
        ),
        Case(
            "bad value",
            [G, "text-pkg", "--prompt", "<image> hi", "--image", "x.png"],
            notes="an image for a text package",
        ),
        Case("missing file", [G, "omni-pkg", "--prompt", "<image> hi", "--image", "missing.png"]),
        Case(
            "bad value", [G, "omni-pkg", "--prompt", "<image> hi", "--image", "not-a-picture.png"]
        ),
        Case(
            "bad value",
            [G, "omni-pkg", "--prompt", "hi", "--image", "red.png"],
            expect=0,
            notes="an image but no <image> marker: put at the start, as processors do",
        ),
        Case("bad value", [G, "omni-pkg", "--prompt", "<image> hi"], notes="marker, no image"),
        Case(
            "bad value",
            [G, "text-pkg", "--prompt", "hi", "--ep", "cuda"],
            notes="CUDA EP without onnxruntime-gpu",
        ),
        Case(
            "bad value",
            [G, "omni-pkg", "--prompt", "<so_embedding> hi", "--audio", "red.png"],
            notes="audio for a package without an audio tower",
            owner="generate",
        ),
        Case("missing file", [G, "no-tokenizer-pkg", "--prompt", "hi"], notes="no tokenizer.json"),
        Case(
            "signal",
            [G, "text-pkg", "--prompt", "hi", "--max-new-tokens", "3000", "--ignore-eos"],
            signal_after=3.0,
            expect=130,
            notes="SIGINT mid-generation: the tokens made so far are printed, status 130",
            printed=True,
        ),
        # a package whose data file is truncated, in every command
        Case("broken package", [Ins, "truncated-pkg"]),
        Case("broken package", [V, "truncated-pkg", "--source", "text-ckpt"]),
        Case("broken package", [Q, "truncated-pkg", "--source", "text-ckpt", "--steps", "1"]),
        Case("broken package", [G, "truncated-pkg", "--prompt", "hi"]),
        # qualify's prompt and output
        Case("bad value", [Q, "text-pkg", "--source", "text-ckpt", "--prompt-ids", ""]),
        Case(
            "bad value",
            [Q, "omni-pkg", "--source", "omni-ckpt", "--prompt", "hi"],
            notes="a prompt for an Omni package",
        ),
        Case(
            "existing output",
            [Q, "text-pkg", "--source", "text-ckpt", "--output", "file.txt"],
            check=untouched("file.txt", "not a directory"),
        ),
        Case("missing file", [V, "no-such-pkg", "--json"]),
    ]


def survey(work: Path) -> list[Outcome]:
    prepare(work)
    outcomes = []
    for case in cases():
        outcomes.append(run_case(case, work))
        for name in ("o1", "o-sig", "ok-ckpt", "demo-out", "empty-cwd"):
            path = work / name
            if path.is_dir():
                shutil.rmtree(path)
        (work / "empty-cwd").mkdir()
    return outcomes


def table(outcomes: list[Outcome]) -> str:
    rows = ["| kind | command | exit | message | verdict |", "| --- | --- | --- | --- | --- |"]
    for o in outcomes:
        command = "mobius " + " ".join(
            json.dumps(a) if (" " in a or not a) else a for a in o.case.args
        )
        if o.case.signal_after is not None:
            command += f" (SIGINT after {o.case.signal_after:g} s)"
        verdict = "ok" if o.ok else "FAIL"
        if not o.ok and o.case.owner:
            verdict = f"open: owned by {o.case.owner} work"
        if o.traceback:
            verdict += ", traceback"
        if o.problem:
            verdict += f", {o.problem}"
        if o.code != o.case.expect:
            verdict += f", expected {o.case.expect}"
        message = o.message if len(o.message) <= MAX_MESSAGE else o.message[:MAX_MESSAGE] + " ..."
        message = message.replace("|", "\\|")
        note = f" ({o.case.notes})" if o.case.notes else ""
        note, message = (t.replace("<", "&lt;") for t in (note, message))  # not HTML tags
        rows.append(f"| {o.case.kind}{note} | `{command}` | {o.code} | {message} | {verdict} |")
    return "\n".join(rows)


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="survey-"))
    where.mkdir(parents=True, exist_ok=True)
    results = survey(where)
    saved = [
        {"args": o.case.args, "code": o.code, "message": o.message, "ok": o.ok} for o in results
    ]
    (where / "outcomes.json").write_text(json.dumps(saved, indent=2))
    print(table(results))
    print(f"\n{sum(o.ok for o in results)} of {len(results)} as expected", file=sys.stderr)
