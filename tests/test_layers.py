"""The engine's layers import one way, and no module reaches into another's private names.

Read from the source (ast), so the rule holds for lazy imports inside functions too. A
layer may import any layer below it, never one above: a change to the simulator cannot
need a change to the searches' or the formats' code."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine"

#: bottom to top; a module may import its own layer and those before it
LAYERS = ["errors", "ops", "graph", "cluster", "device_runs", "strategy", "costs", "models", "taskgraph", "simulate", "memory",
          "delta", "report", "formats", "trace", "search", "profiling", "export", "sweep", "whatif", "cli"]


def modules():
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield path, ".".join(parts), is_pkg


def imports(path: Path, name: str, is_pkg: bool):
    """(target module, imported names, line) of every engine import in the file."""
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "engine" or target.startswith("engine."):
                yield target, [a.name for a in node.names], node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(("engine.", "app")):
                    yield a.name, [], node.lineno


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_engine_module_has_a_layer():
    missing = {name.split(".")[1] for _, name, _ in modules() if name != "engine"} - set(LAYERS)
    assert not missing, f"add {sorted(missing)} to LAYERS"


def test_imports_go_down_only():
    upward = []
    for path, name, is_pkg in modules():
        mine = layer(name)
        for target, _, line in imports(path, name, is_pkg):
            theirs = layer(target)
            if target.startswith("app") or (mine is not None and theirs is not None and theirs > mine):
                upward.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {target}")
    assert upward == []


def test_no_private_name_imported_across_modules():
    private = []
    for path, name, is_pkg in modules():
        for target, names, line in imports(path, name, is_pkg):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != name:
                    private.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {target}.{n}")
    assert private == []


@pytest.mark.parametrize("path", [p for p, _, _ in modules() if p.name != "ops.py"],
                         ids=lambda p: str(p.relative_to(ENGINE)))
def test_no_engine_file_over_500_lines(path):
    """One concern per file (the operator catalogue, ops.py, a table by kind, is left out)."""
    assert len(path.read_text().splitlines()) <= 500
