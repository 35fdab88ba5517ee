"""Every third-party internal grpokit touches is listed in grpokit.trl_compat, checked there, and reached only
through it: a library upgrade that moves one fails in one named place, not as a wrong number mid-run."""

from __future__ import annotations

import ast
import re

from helpers import ROOT

from grpokit import trl_compat

# Private names of other libraries: a `_module` in an import path, or a `._name` read off their objects.
_PRIVATE_IMPORT = re.compile(r"^(torch|transformers|trl|datasets|accelerate|peft)(\.\w+)*\._[a-z]")


def test_every_listed_internal_holds_on_the_pinned_versions():
    assert trl_compat.library_internals_problems() == []


def test_every_listed_internal_has_its_accessor_and_a_check():
    for where, (accessor, why) in trl_compat.LIBRARY_INTERNALS.items():
        assert callable(getattr(trl_compat, accessor, None)), where
        assert why.startswith("grpokit."), f"{where}: say which module relies on it"
        assert trl_compat.library_internals_problems((where,)) == []


def test_a_changed_internal_is_reported_by_name(monkeypatch):
    monkeypatch.setattr(trl_compat, "nanstd", lambda: (lambda tensor, dim=None, keepdim=False: tensor.std() * 0))
    problems = trl_compat.library_internals_problems(("trl.trainer.utils:nanstd",))
    assert len(problems) == 1 and problems[0].startswith("trl.trainer.utils:nanstd (grpokit.trainer.dynamic_sampling")


def test_no_module_outside_trl_compat_imports_a_private_module_of_another_library():
    found = []
    for package in ("grpokit", "rewards"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "trl_compat.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{path.relative_to(ROOT)}: {n}" for n in names if _PRIVATE_IMPORT.match(n)]
    assert found == []
