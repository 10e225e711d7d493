"""docs/architecture.md stays true to the code: every file and folder it names exists, its layer
table is tests/test_layers.py's LAYERS, and its registry listing is what the code prints.

A path is a word ending in `.py` or `.md`, or in `/` (a folder), anywhere in the page. It is
looked up under the repository root, src/mobius_lite/, tests/, benchmarks/ and docs/; a path
given inside its stage (`open.py` under sources/, `relayout/exact_codes.py` under
formats/ggml/) may name any file ending so. Two kinds of path must not exist:
the files the worked examples add, written "new `path`", and the files the history says are
gone, written "former `path`". `mobius_lite.a.b` names a module, and
`mobius_lite.a.b:function` a function in it. A dotted name in backticks that starts with a
top-level module (`source_kinds.SOURCE_KINDS`) or a class of the package
(`GraphRole.file_name`) must name something that module or class defines.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

from test_layers import LAYERS

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "architecture.md"
SRC = REPO / "src" / "mobius_lite"
ROOTS = (REPO, SRC, REPO / "tests", REPO / "benchmarks", REPO / "docs")
# where a path named inside its stage is searched for by its ending
SEARCHED = (SRC, REPO / "tests", REPO / "benchmarks", REPO / "reference_fixtures")

PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w-]+\.(?:py|md)|(?:[\w.-]+/)+)(?![\w/])")
# "new `path`" (a file a worked example adds), "former `path`" (a file that is gone)
NOT_YET_OR_GONE = re.compile(r"\b(?:new|former)\s+`$", re.IGNORECASE)
MODULE = re.compile(r"\bmobius_lite(?:\.\w+)+(?::\w+)?")


@cache
def _endings() -> frozenset[str]:
    """Every file and folder under the searched trees, as each of its path endings."""
    found: set[str] = set()
    for root in SEARCHED:
        for path in root.rglob("*"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).parts
            found |= {"/".join(parts[i:]) for i in range(len(parts))}
    return frozenset(found)


def path_exists(path: str) -> bool:
    """Whether a path as the page writes it names a file or folder of the repository."""
    bare = path.rstrip("/")
    if any((root / bare).exists() for root in ROOTS):
        return True
    return bare in _endings()


def named_paths(text: str, existing: bool = True) -> list[str]:
    """The paths a page names as existing files, or (existing=False) those it marks as files
    to add or files that are gone."""
    return [
        m.group(1)
        for m in PATH.finditer(text)
        if existing != bool(NOT_YET_OR_GONE.search(text[max(0, m.start() - 8) : m.start()]))
    ]


def stale_paths(text: str) -> list[str]:
    """Paths named as existing that do not exist, and paths named as new or gone that do."""
    stale = {p for p in named_paths(text) if not path_exists(p)}
    stale |= {p for p in named_paths(text, existing=False) if path_exists(p)}
    return sorted(stale)


def module_exists(name: str) -> bool:
    """mobius_lite.a.b (a module or package) or mobius_lite.a.b:function (defined in it)."""
    module, _, function = name.partition(":")
    base = REPO / "src" / Path(*module.split("."))
    file = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if not file.is_file():
        return False
    return not function or re.search(rf"^def {function}\(", file.read_text(), re.M) is not None


def test_every_named_path_exists() -> None:
    text = DOC.read_text()
    assert len(named_paths(text)) > 100  # the page names its files; the pattern finds them
    assert not stale_paths(text), stale_paths(text)


def test_a_stale_path_is_found() -> None:
    """The check fails on a path that no longer exists (and skips files marked as new)."""
    text = "see `models/quantized_names.py` and formats/ggml/exact_codes.py; sources/open.py"
    assert stale_paths(text) == ["formats/ggml/exact_codes.py", "models/quantized_names.py"]
    assert stale_paths("1. new `sources/x_file.py`: its index") == []
    assert stale_paths("the former `registry.py`, now hub_pins.py") == []
    assert stale_paths("the former `hub_pins.py`; new `sources/open.py`") == [
        "hub_pins.py",
        "sources/open.py",
    ]
    assert stale_paths("greedy.py and omni_greedy.py at the root") == ["omni_greedy.py"]
    assert stale_paths("benchmarks/fixtures/ and run/") == ["benchmarks/fixtures/"]


def test_every_named_module_exists() -> None:
    names = sorted(set(MODULE.findall(DOC.read_text())))
    assert names
    assert [n for n in names if not module_exists(n)] == []


DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.\w+)+)`")


def _defined(body: list[ast.stmt]) -> set[str]:
    """The names a module or class body defines (functions, classes, assignments, imports)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {a.asname or a.name for a in node.names}
    return names


@cache
def _classes() -> dict[str, set[str]]:
    """Every class of the package -> the names its body defines (merged over equal names)."""
    members: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                members.setdefault(node.name, set()).update(_defined(node.body))
    return members


def dotted_name_exists(name: str) -> bool | None:
    """Whether `module.attr` / `Class.member` is defined; None for a name of neither form."""
    parts = name.split(".")
    if (SRC / parts[0]).is_dir() or (SRC / f"{parts[0]}.py").is_file():
        for i in range(len(parts) - 1, 0, -1):
            base = SRC.joinpath(*parts[:i])
            file = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base
            file = file / "__init__.py" if file.is_dir() else file
            if file.is_file():
                return parts[i] in _defined(ast.parse(file.read_text()).body)
        return False
    if parts[0] in _classes():
        return parts[1] in _classes()[parts[0]]
    return None


def test_every_dotted_name_exists() -> None:
    text = DOC.read_text()
    paths = set(named_paths(text)) | set(named_paths(text, existing=False))
    names = sorted(set(DOTTED.findall(text)) - paths)
    checked = [n for n in names if dotted_name_exists(n) is not None]
    assert len(checked) > 20
    assert [n for n in checked if not dotted_name_exists(n)] == []
    assert dotted_name_exists("GraphRole.REWARD") is False
    assert dotted_name_exists("source_kinds.REGISTRY") is False
    assert dotted_name_exists("formats.ggml.types.GGML_TYPES") is True


def doc_layers(text: str) -> list[tuple[str, ...]]:
    """The rows of the page's layer table, bottom to top."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+)[^|]*\| ([^|]+) \|$", section, re.M)
    assert [int(n) for n, _ in rows] == list(range(len(rows)))
    return [tuple(name.strip() for name in names.split(",")) for _, names in rows]


def test_layer_table_is_the_enforced_one() -> None:
    assert doc_layers(DOC.read_text()) == LAYERS


def test_registry_listing_is_what_the_code_prints() -> None:
    text = DOC.read_text()
    found = re.search(r"```python\n(.*?)```\n\nprints.*?\n\n```\n(.*?)```", text, re.S)
    assert found, "the registries section's example and its output"
    code, printed = found.groups()
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert run.stdout == printed
