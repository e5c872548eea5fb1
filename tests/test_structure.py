"""The project's rooms, read from the source with ``ast`` (nothing is imported):

* no module uses another module's private name (a leading underscore, not a dunder) -- neither
  ``from m import _x`` nor ``m._x`` on an imported project module;
* no two modules import each other, directly or round a circle, counting imports inside functions;
* ``harness/core`` knows nothing of the command line or the cell runner (harness.cli, harness.entry,
  harness.running); the config check (``harness/configs``) imports neither the command line, the cell
  runner, the benchmarks (harness.perf) nor the reports, and the runner nothing of the config check (both
  get a cell's spec from harness.spec); the results model (``harness/results``) reads no config; the
  claims build no model (no harness.perf);
* the library (``comera``) imports nothing of the harness or the baselines;
* the methods (``baselines``) import nothing of the harness but the plug-in finder (harness.plugins,
  standard library only, shared with the workload registry; baselines/__init__.py says why) and the
  parameter declarations (harness.params, standard library and pydantic only: it imports no project module).

Every module of comera, harness, baselines and benchmarks is read.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("comera", "harness", "baselines", "benchmarks")

# Leaks that other branches remove; each entry is (importing module, private name as used). Empty it as
# they merge: the test fails on an entry that no longer occurs, so the list cannot go stale.
ALLOWED_PRIVATE: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    tree: ast.Module


def _modules() -> list[Module]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found.append(Module(name, path, ast.parse(path.read_text(), filename=str(path))))
    return found


MODULES = _modules()
NAMES = {m.name for m in MODULES}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module name of a ``from ... import`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".") if module.path.name == "__init__.py" else module.name.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(module: Module) -> list[tuple[int, str]]:
    """(line, full name) of every name a module imports (``import a.b`` -> a.b; ``from a import b`` ->
    a.b), at any depth (imports inside functions too)."""
    out = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            out += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return out


def _bound_modules(module: Module) -> dict[str, str]:
    """local name -> project module it stands for (``import a.b as c``, ``from a import b``, ``import a``)."""
    bound = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                if full in NAMES:
                    bound[alias.asname or alias.name] = full
    return {local: full for local, full in bound.items() if full.split(".")[0] in PACKAGES}


def _dotted(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def private_uses(module: Module) -> set[tuple[int, str]]:
    """(line, full name) of every private name of another project module this module uses."""
    found = set()
    for line, full in imports(module):
        owner, _, name = full.rpartition(".")
        if full.split(".")[0] in PACKAGES and _private(name) and owner != module.name:
            found.add((line, full))
    bound = _bound_modules(module)
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Attribute):
            continue
        parts = _dotted(node)
        if not parts or parts[0] not in bound:
            continue
        full = [*bound[parts[0]].split("."), *parts[1:]]
        # the longest prefix that names a project module; the name after it is the one used
        for cut in range(len(full) - 1, 0, -1):
            owner = ".".join(full[:cut])
            if owner in NAMES:
                name = full[cut]
                if _private(name) and owner != module.name:
                    found.add((node.lineno, f"{owner}.{name}"))
                break
    return found


def _where(module: Module, line: int) -> str:
    return f"{module.path.relative_to(ROOT)}:{line}"


def test_the_modules_are_read():
    assert {"comera", "harness.cli", "harness.core.timing", "baselines", "benchmarks.test_layers"} <= NAMES


def test_no_module_uses_another_modules_private_names():
    seen, leaks = set(), []
    for module in MODULES:
        for line, name in sorted(private_uses(module)):
            if (module.name, name) in ALLOWED_PRIVATE:
                seen.add((module.name, name))
            else:
                leaks.append(f"{_where(module, line)}: {name}")
    assert not leaks, ("private names used across modules (make them public or keep them home):\n"
                       + "\n".join(leaks))
    assert not ALLOWED_PRIVATE - seen, \
        f"allowed leaks that no longer occur (remove them): {ALLOWED_PRIVATE - seen}"


@pytest.mark.parametrize("package, forbidden, allowed", [
    ("harness.core", ("harness.cli", "harness.entry", "harness.running"), ()),
    ("harness.configs", ("harness.cli", "harness.running", "harness.perf", "harness.reports"), ()),
    ("harness.running", ("harness.configs",), ()),
    ("harness.results", ("harness.configs", "harness.running", "harness.perf", "harness.reports"), ()),
    ("harness.reports.claims", ("harness.perf",), ()),
    ("comera", ("harness", "baselines", "benchmarks"), ()),
    ("baselines", ("harness", "benchmarks"), ("harness.plugins", "harness.params")),
    ("harness.params", ("harness", "baselines", "comera", "benchmarks"), ()),
])
def test_layers(package, forbidden, allowed):
    bad = []
    for module in MODULES:
        if module.name != package and not module.name.startswith(package + "."):
            continue
        for line, full in imports(module):
            if any(full == f or full.startswith(f + ".") for f in forbidden) and \
                    not any(full == a or full.startswith(a + ".") for a in allowed):
                bad.append(f"{_where(module, line)}: {full}")
    assert not bad, f"{package} imports what it must not:\n" + "\n".join(bad)


def test_the_checker_sees_both_forms(tmp_path):
    """``from m import _x`` and ``m._x`` are both found; dunders and a module's own names are not."""
    source = ("from harness.core import measure\nfrom harness.core.timing import _quartiles\n"
              "import harness.core.stops as st\nx = measure._private + st._other + measure.__name__\n"
              "def _mine(): pass\n_mine()\n")
    module = Module("harness.toy", tmp_path / "toy.py", ast.parse(source))
    assert {name for _, name in private_uses(module)} == {
        "harness.core.timing._quartiles", "harness.core.measure._private", "harness.core.stops._other"}


def import_graph(modules: list[Module]) -> dict[str, set[str]]:
    """module -> the project modules it imports (at any depth; ``from a import b`` of a module b is b)."""
    names = {m.name for m in modules}
    graph: dict[str, set[str]] = {m.name: set() for m in modules}
    for module in modules:
        for _, full in imports(module):
            parts = full.split(".")
            target = next((".".join(parts[:cut]) for cut in range(len(parts), 0, -1)
                           if ".".join(parts[:cut]) in names), None)
            if target is not None and target != module.name:
                graph[module.name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The modules that import each other round a circle: each strongly connected group of two or more
    (Tarjan's algorithm, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return sorted(found)


def test_no_import_circles():
    found = circles(import_graph(MODULES))
    assert not found, "modules that import each other (imports inside functions count):\n" + "\n".join(
        " <-> ".join(group) for group in found)


def test_the_circle_finder_sees_a_lazy_import(tmp_path):
    """A circle closed by an import inside a function is found; a chain is not a circle."""
    sources = {"harness.a": "from harness import b\n", "harness.b": "def f():\n    import harness.c\n",
               "harness.c": "from harness.a import x\n", "harness.d": "import harness.a\n"}
    modules = [Module(name, tmp_path / f"{name}.py", ast.parse(text)) for name, text in sources.items()]
    assert circles(import_graph(modules)) == [["harness.a", "harness.b", "harness.c"]]


MAX_LINES = 600


def test_no_module_is_longer_than_the_limit():
    """Every module of the packages stays within MAX_LINES lines: a longer one is split by concept."""
    long = sorted(f"{m.name} ({n} lines)" for m in MODULES
                  if (n := len(m.path.read_text().splitlines())) > MAX_LINES)
    assert not long, f"modules over {MAX_LINES} lines: {long}"


PIPELINE_TESTS = "tests/workflow"
"""End-to-end tests: each module runs the Snakefile (or its entry point) on a tiny config."""
NON_PACKAGE_TESTS = {"tests/docs", "tests/packaging", "tests/scripts", PIPELINE_TESTS}


def test_test_folders_mirror_the_packages():
    """Every folder of unit tests is named after the package folder it tests (tests/harness/reports tests
    harness/reports), and the pipeline folder holds only tests that run the pipeline."""
    root = Path(__file__).resolve().parent.parent
    strays = [str(d.relative_to(root)) for d in sorted((root / "tests").rglob("*"))
              if d.is_dir() and d.name != "__pycache__" and not d.name.startswith(".")
              and (d / "__init__.py").exists()
              and str(d.relative_to(root)) not in NON_PACKAGE_TESTS
              and not (root / d.relative_to(root / "tests")).is_dir()]
    assert not strays, f"test folders with no package folder of the same path: {strays}"
    not_pipeline = [p.name for p in sorted((root / PIPELINE_TESTS).glob("test_*.py"))
                    if not any(word in p.read_text() for word in ("snakemake", "Snakefile"))]
    assert not not_pipeline, f"{PIPELINE_TESTS} modules that never run the pipeline: {not_pipeline}"
