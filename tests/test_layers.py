"""The package's layers (docs/architecture.md): no module imports a layer above its own.

Every `import mobius_lite...` / `from mobius_lite... import` in src/, at module level or inside
functions, is read with ast; the importing module's layer must be at or above the imported one.
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
