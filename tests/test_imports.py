"""The import graph of the library and its applications has no circles, function-level imports
included, and the library (cudt/) imports none of its applications (experiments/, benchmarks/)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
LIBRARY = "cudt"
APPLICATIONS = ("experiments", "benchmarks")
PACKAGES = (LIBRARY, *APPLICATIONS)


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    mods = {}
    for path in (p for package in PACKAGES for p in (root / package).rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        mods[".".join(parts)] = path
    return mods


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """Module → the modules of ``PACKAGES`` it imports anywhere in its body (edges to its own
    parent packages left out: a package's __init__ re-exporting its modules is not a circle)."""
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        parents = {".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)}
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: package.count(".") + 2 - node.level]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = resolve(target) if target.split(".")[0] in PACKAGES else None
                if found and found != mod and found not in parents:
                    edges.add(found)
        graph[mod] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_checker_sees_a_circle_hidden_in_a_function(tmp_path):
    pkg = tmp_path / "cudt" / "runner"
    pkg.mkdir(parents=True)
    (tmp_path / "cudt" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from cudt.runner.config import A\n")
    (pkg / "config.py").write_text("def f():\n    from cudt.runner import sweep\n")
    (pkg / "sweep.py").write_text("from .config import f\n")
    assert cycles(import_graph(tmp_path)) == [["cudt.runner.config", "cudt.runner.sweep"]]


def test_cudt_has_no_import_circles():
    graph = import_graph()
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100
    assert cycles(graph) == []


def applications_imported(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Library module → the application modules it imports (none, in a sound tree)."""
    found = {}
    for mod, targets in graph.items():
        up = sorted(t for t in targets if t.split(".")[0] in APPLICATIONS)
        if mod.split(".")[0] == LIBRARY and up:
            found[mod] = up
    return found


def test_the_checker_sees_the_library_import_an_application(tmp_path):
    for folder in ("cudt/runner", "experiments/paper"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "cudt" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "__init__.py").write_text("")
    (tmp_path / "experiments" / "paper" / "job.py").write_text("from cudt.runner import run\n")
    (tmp_path / "cudt" / "runner" / "run.py").write_text(
        "def f():\n    from experiments.paper.job import g\n"
    )
    assert applications_imported(import_graph(tmp_path)) == {
        "cudt.runner.run": ["experiments.paper.job"]
    }


def test_the_library_imports_no_application():
    """cudt/ is the library; experiments/ (the entry points and the paper's jobs) and
    benchmarks/ are applications of it: they import cudt, never the other way round."""
    graph = import_graph()
    assert {m.split(".")[0] for m in graph} == set(PACKAGES)
    assert any(t.startswith("experiments.paper") for t in graph["experiments.video_table"])
    assert applications_imported(graph) == {}


def test_no_test_module_starts_jax_at_import():
    """pytest imports every test module before running any test. A module that computes with
    JAX at import starts the backend, and then ``jax.distributed.initialize`` (``--distributed``)
    says something else than in a fresh process, which docs/errors.md records: keep module-level
    data in numpy. Checked in a fresh interpreter, in pytest's collection order."""
    import subprocess
    import sys

    code = (
        "import importlib, pathlib, sys\n"
        "sys.path.insert(0, 'tests')\n"
        "from jax._src import xla_bridge\n"
        "for f in sorted(pathlib.Path('tests').rglob('test_*.py')):\n"
        "    sys.path.insert(0, str(f.parent))\n"
        "    importlib.import_module(f.stem)\n"
        "    if xla_bridge.backends_are_initialized():\n"
        "        sys.exit(f.name)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stderr.strip().splitlines()[-1:]} starts JAX at import"
