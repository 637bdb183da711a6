"""The layout's promises, checked over the AST of every module (imports inside functions included).

* no import cycle among the project's modules;
* ``agentlog.core`` imports nothing that does Kafka, ClickHouse or Faust I/O, directly or through
  the project modules it imports;
* only ``agentlog.worker`` imports Faust, and of it only the app module reads the Faust app off a ``Wiring``;
* ``agentlog.audit`` (the store and its sink) reaches nothing of ``agentlog.worker``: the worker starts the sink;
* no module touches a private attribute of Faust, mode, aiokafka or any other library;
* the top level holds what the design card names, and ``processors/`` only a handful of modules;
* nothing reads ``../shared`` (the tests and ``capabilities`` run from a clone alone).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "streams", "processors", "infra")
ENGINE_LIBRARIES = {"faust", "mode", "aiokafka", "kafka", "clickhouse_connect", "chdb", "confluent_kafka"}
#: Private names of the standard library's public API (namedtuple), not internals.
PUBLIC_UNDERSCORED = {"_replace", "_asdict", "_fields", "_make"}


#: The import package each repository folder installs as (pyproject.toml's package-dir).
INSTALLED_AS = {"processors": ["agentlog"], "schemas": ["agentlog", "schemas"], "streams": ["agentlog", "streams"],
                "infra": ["agentlog", "infra"], "tests": ["tests"]}


def _module_name(path: Path) -> str:
    folder, *parts = path.relative_to(REPO).with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(INSTALLED_AS[folder] + parts)


def _modules(roots: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            if "__pycache__" not in path.parts:
                out[_module_name(path)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """Every module ``name`` imports, anywhere in its body; a project submodule is named as itself."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = [f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known]
            if submodules and len(submodules) == len(node.names):
                yield from submodules  # `from pkg import mod, mod2`: the package is not what is used
            else:
                yield module
                yield from submodules


def import_graph(roots: tuple[str, ...] = PACKAGES) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between project modules, external top-level modules imported) per project module."""
    known = _modules(roots)
    internal: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in known.items():
        internal[name], external[name] = set(), set()
        for target in _imports(name, path, known):
            if target in known:
                internal[name].add(target)
            elif target.split(".")[0] in {INSTALLED_AS[r][0] for r in roots}:
                parent = target
                while parent and parent not in known:
                    parent = parent.rpartition(".")[0]
                if parent:
                    internal[name].add(parent)
            else:
                external[name].add(target.split(".")[0])
    return internal, external


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(), list(start)
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo.extend(graph.get(v, ()))
    return seen


GRAPH, EXTERNAL = import_graph()


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(GRAPH) == []


def test_the_tests_import_no_cycle_either():
    graph, _ = import_graph(PACKAGES + ("tests",))
    assert cycles(graph) == []


def test_core_reaches_no_engine_library():
    core = {m for m in GRAPH if m == "agentlog.core" or m.startswith("agentlog.core.")}
    reached = _reachable(GRAPH, core)
    offenders = {m: EXTERNAL[m] & ENGINE_LIBRARIES for m in reached if EXTERNAL[m] & ENGINE_LIBRARIES}
    assert offenders == {}, f"agentlog.core reaches I/O libraries through {offenders}"
    assert not {m for m in reached if m.startswith(("agentlog.worker", "agentlog.audit", "agentlog.replay"))}


def test_importing_core_loads_no_engine_library():
    code = ("import sys, agentlog.core; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(ENGINE_LIBRARIES)!r}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_audit_package_reaches_nothing_of_the_worker():
    audit = {m for m in GRAPH if m == "agentlog.audit" or m.startswith("agentlog.audit.")}
    reached = {m for m in _reachable(GRAPH, audit) if m.startswith("agentlog.worker")}
    assert reached == set(), f"agentlog.audit reaches the worker: {reached}"


def test_one_module_imports_faust():
    """Faust is behind one seam: the app's construction; everything else gets the app handed to it."""
    importers = {m for m, ext in EXTERNAL.items() if ext & {"faust", "mode"}}
    assert importers == {"agentlog.worker.app"}, importers


def test_the_worker_reaches_faust_through_its_ports():
    """Only the app module reads the Faust app off a ``Wiring``; the runtime and agents use the ports.

    The ports (``agentlog.worker.ports``) name no engine library, so the in-memory twin
    (``agentlog.worker.memory``) runs everything typed against them.
    """
    readers = {}
    for name, path in _modules(("processors",)).items():
        if name == "agentlog.worker.app":
            continue
        found = [node.lineno for node in ast.walk(ast.parse(path.read_text("utf-8")))
                 if isinstance(node, ast.Attribute) and node.attr == "app"
                 and isinstance(node.value, (ast.Name, ast.Attribute))
                 and (node.value.id if isinstance(node.value, ast.Name) else node.value.attr) == "wiring"]
        if found:
            readers[name] = found
    assert readers == {}, f"modules reading wiring.app instead of the ports: {readers}"
    assert not EXTERNAL["agentlog.worker.ports"] & ENGINE_LIBRARIES


def _private_accesses(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text("utf-8"))
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    own |= {t.attr for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                continue
            if node.attr in own or node.attr in PUBLIC_UNDERSCORED:
                continue  # this module's own private names
            yield node.lineno, ast.unparse(node)


def test_no_module_touches_a_private_attribute_of_a_library():
    offenders = {}
    for name, path in _modules().items():
        found = list(_private_accesses(path))
        if found:
            offenders[name] = found
    assert offenders == {}, f"private attributes of other libraries: {offenders}"


def test_the_private_attribute_check_finds_one(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("class Own:\n    def __init__(self):\n        self._mine = 1\n\n"
                      "def f(consumer, other):\n    other._mine = 2\n    return consumer._fetcher._records\n")
    assert [line for line, _ in _private_accesses(sample)] == [7, 7]


def test_top_level_is_what_the_design_card_names():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    top = {p.split("/")[0] for p in tracked}
    assert top <= {"pyproject.toml", "streams", "schemas", "processors", "tests", "infra", "README.md",
                   "Makefile", ".ci", ".gitignore"}, top


def test_processors_has_a_handful_of_modules_at_its_top():
    flat = sorted(p.name for p in (REPO / "processors").glob("*.py"))
    assert len(flat) <= 5, flat


def test_nothing_reads_the_workspace_reference_copy():
    shared = '"' + 'shared"'
    needles = ("shared" + "/reference", shared + " / " + '"reference"', "parent / " + shared)
    hits = [str(path.relative_to(REPO)) for root in PACKAGES + ("tests",) for path in (REPO / root).rglob("*.py")
            if any(n in path.read_text("utf-8") for n in needles)]
    assert hits == [], hits
