"""A name a recipe may write that points into grpokit (`grpokit.environments:PythonTool`) keeps meaning one thing
after grpokit's modules moved into packages: the new path works, the old one is refused in one line that names the
new place (exit 2, before any weights), never a "module not found" or a traceback; a user's tool or reward file that
imports an old path is told the new one the same way."""

from __future__ import annotations

import importlib
import importlib.util

import pytest
from helpers import ROOT, launch

from grpokit import MOVED


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_every_moved_module_stands_at_its_new_path_and_not_at_its_old(old, new):
    assert importlib.util.find_spec(new) is not None, f"{new} is where MOVED says {old} went"
    assert importlib.util.find_spec(old) is None, f"{old} still exists: it did not move"


@pytest.mark.slow
@pytest.mark.parametrize("recipe, old, new", [
    ("recipes/smollm2-135m/calculator.yaml", "grpokit.environments:Calculator", "grpokit.tools.environments:Calculator"),
    ("recipes/smollm2-135m/python_tool.yaml", "grpokit.environments:PythonTool", "grpokit.tools.environments:PythonTool"),
])
def test_a_recipe_naming_an_environment_by_its_old_path_gets_one_line_naming_the_new(recipe, old, new):
    assert new in (ROOT / recipe).read_text()  # the shipped recipe names the new path, and it checks
    out = launch("--recipe", recipe, "--check", f"tools.environment={old}")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if old in line]
    assert len(lines) == 1 and f"has moved to '{new.partition(':')[0]}'; write '{new}'" in lines[0], out.stderr


def test_a_reward_named_by_a_moved_module_is_told_the_new_place(tmp_path):
    from helpers import recipe_dict, write_recipe

    from grpokit import config
    from grpokit.errors import RecipeError

    data = recipe_dict()
    data["rewards"] = [{"name": "grpokit.tasks:produce"}]
    with pytest.raises(RecipeError) as err:
        config.validate(config.load(write_recipe(tmp_path, data)))
    [problem] = err.value.problems
    assert problem.path == "rewards[0].name"
    assert "module 'grpokit.tasks' has moved to 'grpokit.prompts.tasks'; write 'grpokit.prompts.tasks:produce'" in (
        problem.message)
    assert importlib.import_module("grpokit.prompts.tasks").produce  # the new place holds the name


@pytest.mark.parametrize("line", ["from grpokit.environments import Calculator",
                                  "import grpokit.environments as shipped\nCalculator = shipped.Calculator"])
def test_a_tool_file_importing_a_moved_module_is_told_the_new_place(tmp_path, line):
    # A user's environment built on a shipped one, written before the move: the fault is named in the file's terms.
    from tests.tools.test_tooluse import problems_of, tool_recipe

    source = f"{line}\n\n\nclass Env(Calculator):\n    pass\n"
    [problem] = problems_of(tmp_path, tool_recipe(tmp_path, {"environment": "env.py:Env"}, source=source))
    assert problem.startswith("tools.environment: ")
    assert ("imports 'grpokit.environments', which has moved to 'grpokit.tools.environments': import it from there"
            in problem), problem


def test_a_reward_module_importing_a_moved_module_is_told_the_new_place(tmp_path, monkeypatch):
    from helpers import recipe_dict, write_recipe

    from grpokit import config
    from grpokit.errors import RecipeError

    (tmp_path / "old_layout_rewards.py").write_text("from grpokit.tasks import produce\n\n\n"
                                                    "def f(completions, **kwargs):\n    return [0.0] * len(completions)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = recipe_dict()
    data["rewards"] = [{"name": "old_layout_rewards:f"}]
    with pytest.raises(RecipeError) as err:
        config.validate(config.load(write_recipe(tmp_path, data)))
    [problem] = err.value.problems
    assert "importing 'old_layout_rewards' failed: it imports 'grpokit.tasks', which has moved to 'grpokit.prompts.tasks'" in (
        problem.message)
