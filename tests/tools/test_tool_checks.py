"""Recipe mistakes around tools and user code, found at --check before any weights load: one line each (exit 2), the
nearest valid name where one applies; and --check says what a user's tool may do and what bounds each call."""

from __future__ import annotations

import os

import pytest

from grpokit import cli
from tests.helpers import write_recipe
from tests.tools.test_tooluse import GOOD_ENV, problems_of, tool_recipe

def formatted_problems(folder, data) -> list[str]:
    """Each problem as the user reads it: file, key, message, the bad value, what is allowed, the nearest name."""
    from grpokit import config
    from grpokit.config import validate
    from grpokit.errors import RecipeError

    with pytest.raises(RecipeError) as err:
        validate(config.load(write_recipe(folder, data)))
    return [p.format() for p in err.value.problems]


CLASH = GOOD_ENV + '''

def add(a: int, b: int) -> int:
    """Add two integers, as a function.

    Args:
        a: the first number
        b: the second number
    """
    return a + b
'''


@pytest.mark.parametrize("tools, expected", [
    # a function named like one of the environment's methods: TRL keys tools by name, one would hide the other
    ({"environment": "env.py:Calculator", "functions": ["env.py:add"]},
     "tools.functions[0]: tool name 'add' is also the name of Calculator.add (a method of tools.environment): TRL keys "
     "tools by name, so the model could reach only one of them; rename one"),
    # the same function listed twice
    ({"functions": ["env.py:multiply", "env.py:multiply"]},
     "tools.functions[1]: tool name 'multiply' is also the name of tools.functions[0]"),
])
def test_the_same_tool_name_twice_is_refused(tmp_path, no_weights, tools, expected):
    lines = problems_of(tmp_path, tool_recipe(tmp_path, tools, source=CLASH))
    assert any(line.startswith(expected) for line in lines), lines


def test_a_worked_call_to_a_tool_that_does_not_exist_gets_the_nearest_name(tmp_path, no_weights):
    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator", "functions": ["env.py:multiply"]})
    data["dataset"]["few_shot"] = [{"role": "user", "content": "2 * 3?"},
                                   {"role": "assistant", "tool_calls": [{"name": "mutliply", "arguments": {"a": 2, "b": 3}}]}]
    [line] = formatted_problems(tmp_path, data)
    assert line.endswith("dataset.few_shot[1]: its tool call names 'mutliply', which is not a tool of this recipe (tools: "
                         "multiply, add); did you mean 'multiply'?"), line


@pytest.mark.parametrize("arguments, expected", [
    # a name the tool has no parameter for: the nearest, and the one it then lacks
    ({"a": 2, "bb": 3}, ["dataset.few_shot[1]: its call of multiply passes 'bb', which multiply takes no argument named "
                         "(multiply takes: a, b); did you mean 'b'?",
                         "dataset.few_shot[1]: its call of multiply leaves out 'b', which multiply needs"]),
    # a value its annotation does not take
    ({"a": 2, "b": "three"}, ["dataset.few_shot[1]: its call of multiply passes b='three', which multiply's annotation "
                              "for b does not take (got 'three'); allowed: integer"]),
])
def test_a_worked_call_passing_what_its_tool_does_not_take_is_refused(tmp_path, no_weights, arguments, expected):
    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator", "functions": ["env.py:multiply"]})
    data["dataset"]["few_shot"] = [{"role": "user", "content": "2 * 3?"},
                                   {"role": "assistant", "tool_calls": [{"name": "multiply", "arguments": arguments}]}]
    lines = formatted_problems(tmp_path, data)
    assert [line.split(": ", 1)[1] for line in lines] == expected, lines


@pytest.mark.parametrize("value", ["twelve", True, 12.5, "12"])
def test_environment_args_must_fit_the_constructors_annotations(tmp_path, no_weights, value):
    data = tool_recipe(tmp_path, {"environment": "grpokit.tools.environments:Calculator",
                                  "environment_args": {"max_digits": value}})
    [line] = formatted_problems(tmp_path, data)
    assert line.endswith(f"tools.environment_args.max_digits: does not fit Calculator's constructor's annotation for "
                         f"max_digits (got {value!r}); allowed: integer"), line


def test_environment_args_that_fit_pass(tmp_path, no_weights):
    from grpokit import config
    from grpokit.config import validate

    # an int where the annotation is float or Optional[int] fits, as Python's own rules say
    source = GOOD_ENV + '''

class Loose(Calculator):
    def __init__(self, scale: float = 1.0, cap: "int | None" = None, name: str = "x", extra=None):
        super().__init__()
'''
    data = tool_recipe(tmp_path, {"environment": "env.py:Loose",
                                  "environment_args": {"scale": 2, "cap": None, "name": "y", "extra": [1]}}, source=source)
    validate(config.load(write_recipe(tmp_path, data)))


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_tools_file_that_is_not_a_regular_file_is_said_as_such(tmp_path, no_weights, kind):
    target = tmp_path / "odd.py"
    os.mkfifo(target) if kind == "fifo" else target.mkdir()
    lines = problems_of(tmp_path, tool_recipe(tmp_path, {"functions": ["odd.py:f"]}))
    said = "is a FIFO (named pipe), not a regular file" if kind == "fifo" else "is a folder, not a file"
    assert any(line.startswith("tools.functions[0]: tool") and said in line for line in lines), lines
    assert not any("does not exist" in line for line in lines), lines


EXITS = '''
import sys

def f(a: int) -> int:
    """Echo.

    Args:
        a: a number
    """
    return a

def reward(completions, **kwargs):
    return [0.0 for _ in completions]

sys.exit(0)
'''


@pytest.mark.parametrize("where", ["tools", "rewards"])
def test_a_user_file_that_exits_when_imported_is_a_problem_not_a_passing_check(tmp_path, capsys, no_weights, where):
    (tmp_path / "exits.py").write_text(EXITS)
    if where == "tools":
        data = tool_recipe(tmp_path, {"functions": ["exits.py:f"]})
    else:
        data = tool_recipe(tmp_path, {"environment": "env.py:Calculator"}, rewards=[{"name": "exits.py:reward"}])
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "exits.py exited (sys.exit(0)) at its top level" in err and "Traceback" not in err


def test_check_says_what_a_users_tool_may_do_and_what_bounds_each_call(tmp_path, capsys, no_weights):
    data = tool_recipe(tmp_path, {"environment": "env.py:Calculator", "timeout_seconds": 3, "max_result_chars": 500})
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    assert ("  limits        each call: tools.timeout_seconds 3 s, tools.max_result_chars 500 characters; past either the "
            "call fails") in out
    assert "  runs as       you, not in a sandbox: your environment and tools run inside the training process" in out


@pytest.mark.parametrize("key, value", [("timeout_seconds", 0), ("max_result_chars", 0),
                                        ("max_result_chars", 10_000_000)])
def test_limits_out_of_range_are_refused(tmp_path, no_weights, key, value):
    [line] = formatted_problems(tmp_path, tool_recipe(tmp_path, {"environment": "env.py:Calculator", key: value}))
    assert f"tools.{key}: is out of range" in line, line


def test_the_checks_docstring_examples_run():
    import doctest

    from grpokit.tools import toolchecks

    result = doctest.testmod(toolchecks)
    assert result.attempted and not result.failed


RETURNS = '''
class Env:
    def reset(self, **row):
        pass

    def lookup(self, key: str) -> dict:
        """Look a key up.

        Args:
            key: the key
        """
        return {"key": key}

    def note(self, text: str) -> None:
        """Take a note.

        Args:
            text: the note
        """

    def count(self, text: str) -> int:
        """Count characters.

        Args:
            text: the text
        """
        return len(text)
'''


def test_check_says_what_the_model_reads_for_each_kind_of_return(tmp_path, capsys, no_weights):
    from grpokit import cli
    from tests.helpers import write_recipe
    from tests.tools.test_tooluse import tool_recipe

    data = tool_recipe(tmp_path, {"environment": "env.py:Env"}, source=RETURNS)
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    # TRL writes str(result) as the tool message, but for a list, which it passes on as content blocks
    assert ("Env.lookup(key: str) -> dict (environment method); returns a dict: the model reads its Python repr, "
            "not JSON (return json.dumps(...))") in out
    assert ("Env.note(text: str) -> None (environment method); returns None: the model reads the text 'None' after "
            "every call; return what the call did") in out
    assert "Env.count(text: str) -> int (environment method); returns an int: the model reads str(value), e.g. 42" in out


def test_every_key_of_environment_args_is_checked_even_when_another_is_wrong(tmp_path, no_weights):
    # An unknown key hid a wrong type, and a wrong type hid another key's value out of range.
    data = tool_recipe(tmp_path, {"environment": "grpokit.tools.environments:PythonTool",
                                  "environment_args": {"max_output_charz": 5, "timeout_seconds": "soon",
                                                       "memory_mb": 99999}})
    lines = [line.split(": ", 1)[1] for line in formatted_problems(tmp_path, data)]
    assert [line.split(":")[0] for line in lines] == ["tools.environment_args.max_output_charz",
                                                      "tools.environment_args.timeout_seconds",
                                                      "tools.environment_args.memory_mb"], lines
    assert lines[0].endswith("did you mean 'max_output_chars'?") and "got 'soon'" in lines[1] and "got 99999" in lines[2]
