"""`pip install -e .` exports every source kind: the export and verify of a GGUF (tokenizer
included) and of a safetensors checkpoint run with torch, onnxruntime and Pillow made
unimportable, and every package mobius_lite's own code imports on the way is a base
dependency."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from reference_fixtures.gguf_fixtures import build_bpe_tokenizer, write_gguf
from reference_fixtures.nemotron_reference import make_reference

ROOT = Path(__file__).resolve().parents[1]
NOT_BASE = ("torch", "onnxruntime", "PIL")
CHILD = """
import builtins, json, sys
for name in {blocked!r}:
    sys.modules[name] = None  # import fails, as where the package is not installed
direct = set()  # what mobius_lite's own code imports, as it runs
real_import = builtins.__import__
def spy(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0 and str((globals or {{}}).get("__name__", "")).startswith("mobius_lite"):
        direct.add(name.split(".")[0])
    return real_import(name, globals, locals, fromlist, level)
builtins.__import__ = spy
from mobius_lite.cli.main import main
codes = [main(args) for args in {commands!r}]
print(json.dumps({{"codes": codes, "modules": sorted(direct)}}))
"""


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
def test_export_and_verify_need_only_the_base_dependencies(tmp_path: Path) -> None:
    model = make_reference(
        dict(layers_block_type=["mamba", "attention", "mlp", "mamba"], vocab_size=304), seed=1
    )
    tokenizer = build_bpe_tokenizer(["a tiny corpus", "for a tiny tokenizer"] * 4, 300)
    (gguf_file,) = write_gguf(
        tmp_path / "tiny-Q8_0.gguf", model, "nemotron_h", {r".": "Q8_0"}, tokenizer=tokenizer
    )
    model.save_pretrained(tmp_path / "checkpoint")
    commands = [
        ["build", "--model", str(gguf_file), "--output", str(tmp_path / "gguf_pkg"), "-q"],
        ["build", "--model", str(tmp_path / "checkpoint"), "--output", str(tmp_path / "st"), "-q"],
        ["verify", str(tmp_path / "gguf_pkg")],
        ["verify", str(tmp_path / "st")],
    ]
    child = CHILD.format(blocked=NOT_BASE, commands=commands)
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["codes"] == [0, 0, 0, 0], done.stderr[-2000:]
    assert (tmp_path / "gguf_pkg" / "tokenizer.json").is_file()

    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {_normalise(re.match(r"[A-Za-z0-9_.\-]+", r)[0]) for r in base}
    owners = importlib.metadata.packages_distributions()
    imported = {
        _normalise(dist)
        for module in result["modules"]
        if module not in sys.stdlib_module_names and module != "mobius_lite"
        for dist in owners.get(module, [module])
    }
    assert imported, result
    assert imported - declared == set(), f"imported, not base dependencies: {imported - declared}"
