"""The engine's layers import one way, no module imports itself round a circle, and no module
reaches into another's private names.

Read from the source (ast), so the rules hold for lazy imports inside functions too. A layer
may import any layer below it, never one above: a change to the simulator cannot need a change
to the searches' or the formats' code. Inside a layer, modules import each other without a
circle (a package's modules import their siblings, never their own package's face)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
import pytest

ENGINE = Path(__file__).resolve().parents[1] / "engine"

#: the engine's packages (and its three root modules), bottom to top: a module may import its
#: own layer and those below it
LAYERS = [
    "errors",  # errors a user can act on
    "ops",  # the operator catalogue
    "moe",  # the mixture-of-experts routing vocabulary
    "graph",  # OpGraph, layer blocks
    "cluster",  # devices, nodes, links, presets
    "costs",  # kernels, transfers, collectives, offload
    "strategy",  # Config, Strategy, device runs, recomputation
    "layout",  # the Layout record, its rules, the enumerator, building a layout
    "models",  # builders and importers
    "formats",  # versioned JSON files
    "taskgraph",  # (graph, strategy, cluster) -> task arrays
    "sim",  # full, delta and steady simulation, memory, the report, traces
    "export",  # Megatron-LM, DeepSpeed, torchtitan (a constrained search asks it what a framework takes)
    "search",  # the searches and the baselines
    "studies",  # sweeps, what-ifs, profiling
    "experiments",  # the init-sweep: a one-way wing
    "cli",  # the soapbox command
]
#: the modules the engine's root may hold beside its packages (the ground vocabulary)
ROOT_MODULES = {"__init__.py", "errors.py", "moe.py"}
#: the longest function a module may hold without saying why in its docstring ("Long:")
MAX_FUNCTION_LINES = 120


def modules():
    for path in sorted(ENGINE.rglob("*.py")):
        rel = path.relative_to(ENGINE.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        yield path, ".".join(parts), is_pkg


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for annotations
    only, never run)."""
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and
            ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
            for child in node.body for n in ast.walk(child)}
    return (n for n in ast.walk(tree) if id(n) not in skip)


def imports(path: Path, name: str, is_pkg: bool):
    """(target module, imported names, line) of every engine import in the file (lazy ones
    inside functions too; not those for annotations only); ``from package import module``
    yields the module."""
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "engine" or target.startswith("engine."):
                subs = [a.name for a in node.names if _is_module(f"{target}.{a.name}")]
                for sub in subs:
                    yield f"{target}.{sub}", [], node.lineno
                rest = [a.name for a in node.names if a.name not in subs]
                if rest or not subs:
                    yield target, rest, node.lineno
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(("engine.", "app")):
                    yield a.name, [], node.lineno


def _is_module(dotted: str) -> bool:
    path = ENGINE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_tests_mirror_the_packages():
    """A module's tests sit in the folder named as its package (``tests/sim/`` for
    ``engine/sim/``; ``tests/moe/`` for the root's ``moe.py``), the app's in ``tests/app/`` and
    the benchmark scripts' in ``tests/benchmarks/``; only shared helpers and this file of the
    whole house's rules sit at the top."""
    tests = Path(__file__).parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and p.name not in ("data", "__pycache__")}
    assert folders == {n for n in LAYERS if n != "errors"} | {"app", "benchmarks"}
    assert {p.name for p in tests.glob("test_*.py")} == {"test_layers.py"}


def test_every_engine_module_has_a_layer():
    missing = {name.split(".")[1] for _, name, _ in modules() if name != "engine"} - set(LAYERS)
    assert not missing, f"add {sorted(missing)} to LAYERS"


def test_the_engine_root_holds_packages_and_the_ground_vocabulary():
    """A newcomer reads the root as the data flow: packages, and only the vocabulary every one
    of them speaks (errors, the MoE routing terms) beside them."""
    assert {p.name for p in ENGINE.glob("*.py")} <= ROOT_MODULES
    assert len(ROOT_MODULES) <= 5


def test_imports_go_down_only():
    upward = []
    for path, name, is_pkg in modules():
        mine = layer(name)
        for target, _, line in imports(path, name, is_pkg):
            theirs = layer(target)
            if target.startswith("app") or (mine is not None and theirs is not None and theirs > mine):
                upward.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {target}")
    assert upward == []


def import_graph() -> nx.DiGraph:
    """Module -> module, for every import anywhere in a file (lazy ones inside functions too).
    Importing ``a.b.c`` runs the faces ``a.b`` first: an edge to each package above the target
    that does not hold the importer (its own packages are already being imported)."""
    g = nx.DiGraph()
    for path, name, is_pkg in modules():
        g.add_node(name)
        for target, _, _ in imports(path, name, is_pkg):
            parts = target.split(".")
            for k in range(2, len(parts)):
                face = ".".join(parts[:k])
                if not (name == face or name.startswith(face + ".")):
                    g.add_edge(name, face)
            if target != name:
                g.add_edge(name, target)
    return g


def test_no_import_cycles():
    """Regression (issue 41): ``search/mcmc.py`` imported ``parallel.py`` and ``polish.py``, both of
    which imported it back (lazily, so Python never complained)."""
    cycles = sorted(" -> ".join(c + [c[0]]) for c in nx.simple_cycles(import_graph()))
    assert cycles == []


def test_the_cycle_test_sees_lazy_imports(tmp_path, monkeypatch):
    """The cycle finder reads imports inside functions too (the circle it was written for hid there)."""
    pkg = tmp_path / "engine" / "demo"
    pkg.mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def x():\n    from .a import y\n")
    monkeypatch.setattr(__import__(__name__), "ENGINE", tmp_path / "engine")
    assert list(nx.simple_cycles(import_graph())) != []


def test_experiments_are_a_one_way_wing():
    """Only the command line may reach the experiments; the core never imports them."""
    found = [f"{path.relative_to(ENGINE.parent)}:{line}" for path, name, is_pkg in modules()
             if not name.startswith(("engine.experiments", "engine.cli"))
             for target, _, line in imports(path, name, is_pkg) if target.startswith("engine.experiments")]
    assert found == []


def test_no_private_name_imported_across_modules():
    private = []
    for path, name, is_pkg in modules():
        for target, names, line in imports(path, name, is_pkg):
            for n in names:
                if n.startswith("_") and not n.startswith("__") and target != name:
                    private.append(f"{path.relative_to(ENGINE.parent)}:{line} imports {target}.{n}")
    assert private == []


def test_one_public_constant_name_per_meaning():
    """Regression (issue 41): two different shares were both called ``POLISH_SHARE`` (auto's
    polish and MCMC's final one). A public constant's name is defined in one module only."""
    where: dict[str, list[str]] = {}
    for path, name, _ in modules():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and re.fullmatch(r"[A-Z][A-Z0-9_]*", t.id):
                    where.setdefault(t.id, []).append(name)
    assert {k: v for k, v in where.items() if len(v) > 1} == {}


@pytest.mark.parametrize("path", [p for p, _, _ in modules()], ids=lambda p: str(p.relative_to(ENGINE)))
def test_no_engine_file_over_500_lines(path):
    """A tripwire: a file that grows is split by concern (never trimmed to fit)."""
    assert len(path.read_text().splitlines()) <= 500


def long_functions(root: Path):
    """(file:line name, lines) of every function over :data:`MAX_FUNCTION_LINES` whose docstring
    does not say why it is long (a paragraph starting "Long:")."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and "\nLong:" not in "\n" + (ast.get_docstring(node) or ""):
                    yield f"{path.relative_to(root.parent)}:{node.lineno} {node.name}", n


@pytest.mark.parametrize("top", ["engine", "app"])
def test_no_function_over_120_lines_without_a_reason(top):
    assert dict(long_functions(ENGINE.parent / top)) == {}


# --------------------------------------------------------------------------- the app's floors

APP = ENGINE.parent / "app"

#: the app's floors, bottom to top: a module may import its own floor and those below it (the
#: engine too, never the other way). Rooms of one concern each: what the server keeps
#: (``sessions``), where a model or cluster comes from (``sources``), the page's state
#: (``state``), its simulation (``simulation``), what a user does (``actions``, ``profiles``, ``uploads``,
#: ``links``, ``fitscan``), each tab's layout and callbacks (``tabs``), the one reducer
#: (``events``), and the wiring (``callbacks``, ``layout``, the package's ``create_app``).
APP_LAYERS = ["cache", "clients", "edge", "recycle", "fmt", "panel", "learn", "datadir", "fairqueue", "storefaults", "storeschema", "store", "sessions", "sources", "state", "simulation", "gantt",
              "views", "figures", "gantt_figure", "learn_figures", "components", "actions", "profiles", "uploads", "links", "fitscan",
              "jobs", "planjob", "worker", "tabs", "events", "layout", "warmup", "callbacks", "guard", "", "cli"]
#: module-level names that hold mutable state outside :class:`app.sessions.Sessions`, and why:
#: the process's one handle to the server's Sessions, to its SQLite store and to its search
#: workers (services the process opens once; every cache and build lives in Sessions), and the
#: reverse proxies ``soapbox serve --trusted-proxy`` names (set once, at start), whether the
#: command owns its process (set once, by the console entry) and the data directory's lock
#: handed over by the image before this one (:mod:`app.recycle`; set once, at start, taken once)
HANDLES = {("sessions", "_current"), ("sessions", "_current_lock"), ("store", "_current"), ("store", "_current_lock"),
           ("jobs", "_pool"), ("jobs", "_pool_lock"), ("cli", "_served"), ("clients", "_trusted"),
           ("cli", "_own_process"), ("datadir", "_handed")}


def app_modules():
    for path in sorted(APP.rglob("*.py")):
        rel = path.relative_to(APP).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        yield path, ".".join(parts), path.name == "__init__.py"


def app_imports(path: Path, name: str, is_pkg: bool):
    """(target module inside app, imported names, line) of every import of an app module."""
    package = name.split(".") if is_pkg else name.split(".")[:-1]
    if name == "":
        package = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - (node.level - 1)] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
                names = [a.name for a in node.names]
                if not node.module:  # from . import x, y: a module each, or a name of the package
                    for a in names:
                        sub = APP.joinpath(*base, a)
                        if sub.with_suffix(".py").exists() or sub.is_dir():
                            yield ".".join(base + [a]), [], node.lineno
                        else:
                            yield ".".join(base), [a], node.lineno
                    continue
                yield target, names, node.lineno
            elif node.module and (node.module == "app" or node.module.startswith("app.")):
                yield node.module.removeprefix("app").lstrip("."), [a.name for a in node.names], node.lineno


def app_floor(module: str) -> int:
    top = module.split(".")[0]
    return APP_LAYERS.index(top)


def test_every_app_module_has_a_floor():
    missing = {name.split(".")[0] for _, name, _ in app_modules()} - set(APP_LAYERS)
    assert not missing, f"add {sorted(missing)} to APP_LAYERS"


def test_app_imports_go_down_only():
    upward = []
    for path, name, is_pkg in app_modules():
        mine = app_floor(name)
        for target, _, line in app_imports(path, name, is_pkg):
            if app_floor(target) > mine:
                upward.append(f"{path.relative_to(APP.parent)}:{line} imports app.{target}")
    assert upward == []


def test_no_private_name_imported_across_app_modules():
    private = [f"{path.relative_to(APP.parent)}:{line} imports app.{target}.{n}"
               for path, name, is_pkg in app_modules() for target, names, line in app_imports(path, name, is_pkg)
               for n in names if n.startswith("_") and not n.startswith("__") and target != name]
    assert private == []


def test_tests_use_public_names_of_the_app():
    """A test reaches the app through its public names only (a private one may change under it)."""
    pattern = __import__("re").compile(
        r"\b(?:SRC|ST|SIM|ACT|UP|LNK|FIT|EV|SES|EXP|TL|ED|CMP|SRCH|EXPT|LRN|WU|V|G|F|jobs|store|worker)\._[a-z]")
    tests = sorted((Path(__file__).parent / "app").glob("test_*.py"))
    found = [f"{p.name}:{i}" for p in tests
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


@pytest.mark.parametrize("path", [p for p, _, _ in app_modules()], ids=lambda p: str(p.relative_to(APP)))
def test_no_app_file_over_500_lines(path):
    assert len(path.read_text().splitlines()) <= 500


def _mutable_module_state(path: Path):
    """Module-level names bound to something that changes at run time: a container or lock
    made by a call or a literal, a lowercase name rebound (``global``), or a cache decorator on
    a function with arguments (a no-argument ``lru_cache`` is a constant built lazily)."""
    tree = ast.parse(path.read_text())
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = [t.id for t in node.targets if isinstance(t, ast.Name)], node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            targets, value = [node.target.id], node.value
        for name in targets:
            constant = name.lstrip("_")[:1].isupper() or name == "__all__"
            if not constant:
                yield name
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if "cache" in ast.unparse(d) and node.args.args:
                    yield node.name


def test_no_module_level_mutable_state_outside_sessions():
    found = [(name, n) for path, name, _ in app_modules() for n in _mutable_module_state(path)
             if (name, n) not in HANDLES]
    assert found == []


def test_every_package_is_installed():
    """Regression (issue 24): app/tabs/ was left out of pyproject.toml's package list, so
    ``pip install .`` (the README's run command) made a soapbox whose explorer could not start;
    the editable install the tests use hid it."""
    import tomllib

    root = ENGINE.parent
    from setuptools import find_packages

    include = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    listed = set(find_packages(str(root), include=include))
    found = {".".join(p.parent.relative_to(root).parts) for top in ("engine", "app")
             for p in (root / top).rglob("__init__.py")}
    assert found - listed == set()


def test_the_app_s_data_files_are_package_data():
    """The Learn tab draws app/data/init_sweep.json: an installed app (``pip install .``, the
    Docker image) has it only as package data, not from the source tree's benchmarks/."""
    import fnmatch
    import tomllib

    root = ENGINE.parent
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["app"]
    files = [p.relative_to(root / "app").as_posix() for p in (root / "app" / "data").iterdir() if p.is_file()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), files
