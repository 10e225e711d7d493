"""The package's layers (docs/architecture.md): no module imports a layer above its own, and
no modules import each other in a circle.

Every `import mobius_lite...` / `from mobius_lite... import` in src/, at module level or inside
functions, is read with ast; the importing module's layer must be at or above the imported one,
and the graph of those imports (function-level ones included) has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import mobius_lite

ROOT = Path(mobius_lite.__file__).parent

# Bottom to top; a module may import its own layer and those below it.
LAYERS: list[tuple[str, ...]] = [
    (
        "enums",
        "errors",
        "io_contract",
        "layout",
        "listing",
        "sizes",
        "hashing",
        "hub_pins",
        "version",
        "optional",
    ),
    ("formats",),
    ("sources",),
    ("configs",),
    ("components",),
    ("models",),
    ("source_kinds",),
    ("graphs",),
    ("weights",),
    ("package", "genai_config", "run", "media", "routes"),
    ("tasks",),
    ("build", "demo"),
    ("evaluation",),
    ("bench",),
    ("cli",),
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}


def layer(module: str) -> int:
    """The layer of mobius_lite.<first>.<...>; the package's __init__ sits on top."""
    first = module.split(".")[1] if "." in module else "__init__"
    if first == "__init__":
        return len(LAYERS)
    assert first in LAYER_OF, f"mobius_lite.{first} is in no layer: add it to LAYERS and the docs"
    return LAYER_OF[first]


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "mobius_lite":
                found += [f"mobius_lite.{alias.name}" for alias in node.names]
            elif node.module.startswith("mobius_lite."):
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("mobius_lite.")]
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(relative.parts)
        if module.endswith(".__init__") and module.count(".") == 1:
            continue  # the package's own __init__ re-exports the entry points
        own = layer(module)
        for target in imports(path):
            if layer(target) > own:
                violations.append(f"{module} imports {target}")
    assert not violations, "\n".join(violations)


def _module_name(path: Path) -> str:
    """mobius_lite.a.b for a/b.py, mobius_lite.a for a/__init__.py."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _executed(tree: ast.AST) -> list[ast.AST]:
    """The nodes of a module but those under `if TYPE_CHECKING:` (imports for annotations only,
    never run)."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            stack.extend(node.orelse)
            continue
        found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the src modules it imports (anywhere in it, functions included; not under
    TYPE_CHECKING); `from package import module` counts as importing that module."""
    paths = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        targets: set[str] = set()
        for node in _executed(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if not node.module.startswith("mobius_lite"):
                    continue
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.add(sub if sub in paths else node.module)
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.startswith("mobius_lite.")}
        graph[module] = {t for t in targets if t in paths and t != module}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module)
            if found is not None:
                return found
    return None


def test_no_import_cycle() -> None:
    """No module imports itself through others, counting imports inside functions (a cycle
    they hide still couples the modules; the package's own __init__ re-exports entry points
    and is left out)."""
    graph = import_graph()
    graph.pop("mobius_lite", None)
    for targets in graph.values():
        targets.discard("mobius_lite")
    cycle = import_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_no_component_imports_a_storage_format() -> None:
    """Components ask a slot's WeightFormat; only the generic formats modules (the protocols,
    the typed re-layout plan, com.microsoft helpers) are theirs to import."""
    specific = ("mobius_lite.formats.ggml", "mobius_lite.formats.modelopt")
    specific += ("mobius_lite.formats.quantize",)
    found = [
        f"{module} imports {target}"
        for module, targets in import_graph().items()
        if module.startswith("mobius_lite.components.")
        for target in targets
        if target.startswith(specific)
    ]
    assert not found, "\n".join(found)


def test_import_cycle_is_found() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_is_in_a_layer() -> None:
    for path in ROOT.iterdir():
        name = path.stem
        if name.startswith("_") or (path.is_file() and path.suffix != ".py"):
            continue
        if path.is_dir() and not (path / "__init__.py").is_file():
            continue
        assert name in LAYER_OF, f"mobius_lite.{name} is in no layer"


def test_qualify_references_are_named_evaluation_callables() -> None:
    """A model type names its qualify reference instead of importing it (evaluation sits above
    configs): every name must be an evaluation module's callable."""
    from mobius_lite.configs.model_types import MODEL_TYPES

    for model_type in MODEL_TYPES.values():
        module = model_type.reference.partition(":")[0]
        assert layer(module) == LAYER_OF["evaluation"], model_type.reference
        assert callable(model_type.qualify_reference()), model_type.reference
