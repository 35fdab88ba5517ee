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
    "grpokit.rundir": {"grpokit.errors", "grpokit.dist", "grpokit.files", "grpokit.files.ownership"},
    "grpokit.trl_compat": set(),
    "grpokit.progress": set(),
    "grpokit.lifecycle": set(),
    "grpokit.request": set(),
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
    mod.write_text("def f():\n    from grpokit.training import train\n    import grpokit.config.loader as x\n")
    assert imports_of("grpokit.rundir", mod, {"grpokit.training", "grpokit.config.loader", "grpokit.rundir"}) == {
        "grpokit.training", "grpokit.config.loader"}


@pytest.mark.parametrize("leaf", sorted(LEAVES))
def test_leaves_import_nothing_above_them(leaf):
    assert import_graph()[leaf] <= LEAVES[leaf]


@pytest.mark.slow
def test_every_module_imports_alone_in_a_fresh_interpreter():
    # One interpreter per module, so a module that works only because another one was imported first fails here.
    names = [n for n in project_modules() if n != "launch"]
    script = ("import importlib, subprocess, sys\n"
              "bad = []\n"
              "for name in sys.argv[1:]:\n"
              "    r = subprocess.run([sys.executable, '-c', f'import {name}'], capture_output=True, text=True)\n"
              "    if r.returncode: bad.append(f'{name}: {r.stderr.strip().splitlines()[-1]}')\n"
              "print('\\n'.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.stdout.strip() == "", out.stdout


def test_reading_a_recipe_and_planning_import_no_torch_or_trl():
    # --help, loading a recipe and the memory planner stay quick: torch / transformers / trl are not imported.
    code = ("import sys\n"
            "from grpokit.config import load\n"
            "from grpokit.planning import memory\n"
            "import grpokit.cli, grpokit.rundir, grpokit.trl_compat\n"
            "load('recipes/smoke.yaml', ['trainer.max_steps=2'])\n"
            "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
