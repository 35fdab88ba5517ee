"""The package's shape: arrows point down (no import cycle, not even through imports inside functions),
every module imports on its own, the leaves stay leaves, and reading a recipe needs no torch or TRL."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGES = ("grpokit", "rewards", "labs")
# Leaves: modules that import nothing of the project's except these (README: Layout).
LEAVES = {
    "grpokit.errors": set(),
    "grpokit.fields": {"grpokit.errors"},
    "grpokit.cpu": set(),
    "grpokit.dist": set(),
    "grpokit.files": {"grpokit.errors", "grpokit.files.ownership", "grpokit.files.reading"},
    "grpokit.files.ownership": {"grpokit.errors", "grpokit.files.reading"},
    "grpokit.files.reading": {"grpokit.errors"},
    "grpokit.checkpoints.rundir": {"grpokit.errors", "grpokit.dist", "grpokit.files", "grpokit.files.ownership"},
    "grpokit.trl_compat": set(),
    "grpokit.run.progress": set(),
    "grpokit.lifecycle": set(),
    "grpokit.run.request": set(),
    "grpokit.tools.toolfaults": set(),
    "grpokit.reporting.messages": set(),
}


def project_modules() -> dict[str, Path]:
    found = {"launch": ROOT / "launch.py"}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module `name` imports, at top level or inside a function (`from a import b` counts `a.b`
    when that is a module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@functools.cache  # the files do not change while the tests run: one walk serves every test here
def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(name, path, known) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    assert len(graph) > 30  # the walk found the package
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_the_cycle_finder_finds_a_cycle():
    # A check that cannot fail proves nothing: a graph with a circle through a function-level import is caught.
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_function_level_imports_count(tmp_path):
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from grpokit.run.training import train\n    import grpokit.config.loader as x\n")
    assert imports_of("grpokit.checkpoints.rundir", mod, {"grpokit.run.training", "grpokit.config.loader", "grpokit.checkpoints.rundir"}) == {
        "grpokit.run.training", "grpokit.config.loader"}


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaves_import_nothing_above_them(leaf):
    assert import_graph()[leaf] <= LEAVES[leaf]


# The third-party libraries the project imports, loaded once by the parent before it forks a child per module: each
# child starts with none of the project's modules loaded (what the test is about), without paying the ~10 s of
# importing torch, transformers, trl and peft again for each module (76 s of the suite when it did).
THIRD_PARTY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "yaml", "numpy")
IMPORT_EACH = """
import importlib, os, sys, traceback
libs, names = sys.argv[1].split(","), sys.argv[2:]
for lib in filter(None, libs):
    importlib.import_module(lib)
loaded = [m for m in sys.modules if m.split(".")[0] in {n.split(".")[0] for n in names}]
assert not loaded, f"the parent loaded {loaded}"
for name in names:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(w, traceback.format_exc().strip().splitlines()[-1].encode())
            os._exit(1)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        why = f.read().decode()
    if os.waitpid(pid, 0)[1]:
        print(f"{name}: {why or 'died'}")
"""


def modules_failing_alone(names: list[str], cwd: Path, libs=THIRD_PARTY) -> list[str]:
    """`name: the error's last line` for each module that fails to import in a process where nothing of its project
    was imported before it (only `libs`)."""
    out = subprocess.run([sys.executable, "-c", IMPORT_EACH, ",".join(libs), *names], capture_output=True,
                         text=True, cwd=cwd, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    # One child per module, so a module that works only because another one was imported first fails here.
    assert modules_failing_alone([n for n in project_modules() if n != "launch"], ROOT) == []


def test_a_module_that_works_only_after_another_is_found(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("X = 1\n")
    (tmp_path / "pkg" / "b.py").write_text("import pkg\nY = pkg.a.X\n")  # works only once pkg.a is loaded
    assert modules_failing_alone(["pkg.a", "pkg.b", "pkg"], tmp_path, libs=()) == [
        "pkg.b: AttributeError: module 'pkg' has no attribute 'a'"]


def test_reading_a_recipe_and_planning_import_no_torch_or_trl():
    # --help, loading a recipe and the memory planner stay quick: torch / transformers / trl are not imported.
    code = ("import sys\n"
            "from grpokit.config import load\n"
            "from grpokit.planning import memory\n"
            "import grpokit.cli, grpokit.checkpoints.rundir, grpokit.trl_compat\n"
            "load('recipes/smoke.yaml', ['trainer.max_steps=2'])\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
