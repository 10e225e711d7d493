"""What the benchmarks share: the onnxruntime CPU session options, opening a package's decoder,
timing calls, a timed greedy decode and a timed `mobius build` in a child process."""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mobius_lite.layout import DECODER_FILE, MANIFEST_FILE

PEAK_RSS = re.compile(r"Maximum resident set size \(kbytes\): (\d+)")
# The file that marks a folder as a benchmark's own scratch workdir, which it may delete.
WORKDIR_MARK = ".mobius-benchmark-workdir"


def claim_workdir(path: Path, fresh: bool = True) -> Path:
    """Make `path` this benchmark's scratch folder, marked as such: created if missing,
    emptied first when `fresh` and a benchmark made it. A non-empty folder no benchmark made
    is refused (exit with one line), so a mistyped --workdir never deletes anyone's files."""
    if path.is_dir() and any(path.iterdir()) and not (path / WORKDIR_MARK).is_file():
        raise SystemExit(
            f"--workdir {path} is a non-empty folder that no benchmark created; give a new or "
            "empty folder (the benchmark deletes its workdir when it ends)"
        )
    if path.exists() and not path.is_dir():
        raise SystemExit(f"--workdir {path} is a file; give a new or empty folder")
    if fresh:
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, exist_ok=True)
    (path / WORKDIR_MARK).write_text("scratch folder of a mobius_lite benchmark\n")
    return path


def release_workdir(path: Path) -> None:
    """Delete a workdir that claim_workdir marked; anything else is left alone."""
    if (path / WORKDIR_MARK).is_file():
        shutil.rmtree(path, ignore_errors=True)


def package_with_graph(package: Path, out: Path, model: Any) -> Path:
    """A copy of `package` in `out` whose decoder is `model` (an edited graph, timing only):
    model.onnx written there beside hard links of the package's other files."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out / DECODER_FILE))
    for f in package.iterdir():
        if f.name != DECODER_FILE and not (out / f.name).exists():
            os.link(f, out / f.name)
    return out


def session_options(threads: int) -> Any:
    """SessionOptions with `threads` intra-op threads and one inter-op thread (sessions run
    sequentially, so the benchmarks compare kernels, not scheduling)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return options


def open_package(package: Path, options: Any, model_file: Path | None = None) -> tuple[Any, float]:
    """(DecoderSession over the package's decoder, seconds its creation took); `model_file`:
    another decoder graph. The session reads its inputs' dtypes and cache shapes itself."""
    from mobius_lite.run.runtime import DecoderSession

    start = time.perf_counter()
    session = DecoderSession(model_file or package / DECODER_FILE, session_options=options)
    return session, time.perf_counter() - start


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall seconds of `repeats` calls of fn()."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class TimedDecode:
    """Wall seconds of each greedy decode step and the tokens it chose (batch row 0)."""

    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    @property
    def median_after_first(self) -> float:
        """The median step time without the first step (its allocations stay out)."""
        return statistics.median(self.seconds[1:])


def timed_decode(
    session: Any,
    logits: np.ndarray,
    steps: int,
    each: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> TimedDecode:
    """`steps` greedy decode calls of a DecoderSession after the call that gave `logits`
    ([batch, sequence, vocab]); `each` sees every step's outputs."""
    timed = TimedDecode()
    token = logits[:, -1].argmax(-1)[:, None]
    for _ in range(steps):
        start = time.perf_counter()
        out = session.step(token.astype(np.int64))
        timed.seconds.append(time.perf_counter() - start)
        if each is not None:
            each(out)
        token = out["logits"][:, -1].argmax(-1)[:, None]
        timed.tokens.append(int(token[0, 0]))
    return timed


def timed_export(model: Path, output: Path, flags: Sequence[str] = ()) -> dict[str, Any]:
    """`mobius build --model MODEL --output OUTPUT --overwrite -q FLAGS...` in a child process
    under /usr/bin/time: wall seconds, peak resident MiB and the weight bytes written."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "mobius_lite.cli.main", "build"]
    cmd += ["--model", str(model), "--output", str(output), "--overwrite", "--quiet", *flags]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"export failed:\n{proc.stderr[-4000:]}")
    rss = PEAK_RSS.search(proc.stderr)
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    return {
        "export_wall_s": wall,
        "export_peak_rss_mib": int(rss[1]) / 1024 if rss else None,
        "package_weight_bytes": manifest["totals"]["bytes_written"],
    }
