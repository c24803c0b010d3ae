"""The package's layers, read from its own imports: data flows one way and no module imports a layer above its own.

Every `import` / `from ... import` (at module level, inside functions, under TYPE_CHECKING; relative ones resolved)
and every `importlib.import_module("...")` / `__import__("...")` of a literal name counts. Strings that the method
registry holds (config/methods.py: a method's classes by import path, loaded when a method is looked up) are data,
not imports. A module of no listed layer fails too, so a new package is placed on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "infinitehip"

# Lowest first; a module may import its own layer and the ones before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("config", ("infinitehip.config",)),
    ("kernels and distributed primitives", ("infinitehip.distributed", "infinitehip.triton_interpreter",
                                            "infinitehip.host_values", "infinitehip.graph_recorders",
                                            "infinitehip.profiling")),
    ("model", ("infinitehip.model",)),
    ("kv", ("infinitehip.kv",)),
    ("attention methods", ("infinitehip.attention",)),
    ("engine", ("infinitehip.engine",)),
    # `infinitehip` itself: the package face (`from infinitehip import LLM`)
    ("entry points", ("infinitehip.cli", "infinitehip.server", "infinitehip.eval", "infinitehip.integrations",
                      "infinitehip")),
]


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest prefix naming module; None outside the package or of no listed layer."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), index)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) of every import in the file (source: its text, read from path if None)."""
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, one level up per extra dot
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((node.lineno, target))
            # `from infinitehip import engine` names a module too
            found += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def is_module(name: str) -> bool:
    relative = Path(*name.split("."))
    return (PACKAGE.parent / relative).with_suffix(".py").is_file() or (PACKAGE.parent / relative).is_dir()


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    assert SOURCES, PACKAGE
    assert [module_name(p) for p in SOURCES if layer_of(module_name(p)) is None] == []


def upward_imports(path: Path, source: str | None = None) -> list[str]:
    own = layer_of(module_name(path))
    upward = []
    for line, name in sorted(imported_names(path, source)):
        # `from infinitehip.x import name`: name may be a module or an object; only modules decide layers
        target = layer_of(name) if name.partition(".")[0] == "infinitehip" else None
        if target is not None and is_module(name) and target > own:
            upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({LAYERS[own][0]}) imports {name} "
                          f"({LAYERS[target][0]})")
    return upward


def test_no_module_imports_a_layer_above_its_own():
    assert [found for path in SOURCES for found in upward_imports(path)] == []


@pytest.mark.parametrize("source, expected", [
    ("from infinitehip.engine.llm import LLM\n", ["infinitehip.engine.llm", "infinitehip.engine.llm.LLM"]),
    ("def f():\n    import infinitehip.attention.base\n", ["infinitehip.attention.base"]),
    ("import importlib\nimportlib.import_module('infinitehip.server.app')\n", ["importlib", "infinitehip.server.app"]),
    ("from . import shard\n", ["infinitehip.distributed", "infinitehip.distributed.shard"]),
    ("from ..engine import rank\n", ["infinitehip.engine", "infinitehip.engine.rank"]),
])
def test_imports_are_read_wherever_they_stand(source, expected):
    # as if in a file of distributed/ (relative imports resolve against its package)
    assert [name for _, name in imported_names(PACKAGE / "distributed" / "probe.py", source)] == expected


def test_an_upward_import_is_reported_and_a_downward_one_is_not():
    model_file = PACKAGE / "model" / "llama.py"
    source = ("from infinitehip.distributed.state import ParallelState\n"
              "def build():\n    from infinitehip.engine.rank import build_rank\n"
              "from infinitehip import LLM\n")
    assert upward_imports(model_file, source) == [
        "infinitehip/model/llama.py:3 (model) imports infinitehip.engine.rank (engine)",
        "infinitehip/model/llama.py:4 (model) imports infinitehip (entry points)"]
