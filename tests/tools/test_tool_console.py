"""A tool run as a new user meets it, on real GRPOTrainer steps of the tiny model: the console's step lines show the
calls and failed calls, a tool that fails every call is said there plainly, report.md shows each call with its result
and points its advice at the tool, and TRL's experimental-feature warning does not name a grpokit file."""

from __future__ import annotations

import pytest

from tests.helpers import docs_block, normal, write_recipe
from tests.tools.test_tool_limits import tokenizer_for
from tests.tools.test_tooluse import scripted_calls, tool_recipe  # noqa: F401 - the fixture is used by name

# the model calls `div`, which the recipe's environment does not give: TRL answers each call with an error
DIV = '<tool_call>\n{"name": "div", "arguments": {"a": 9}}\n</tool_call>'
# one short tool: the tiny model's context (1024 tokens) holds the schema, the call and the error after it
ENV = '''
class Env:
    def reset(self, **row):
        pass

    def add(self, a: int, b: int) -> int:
        """Add.

        Args:
            a: a
            b: b
        """
        return a + b

    def half(self, a: int) -> int:
        """Half.

        Args:
            a: a
        """
        return a // (a - a)
'''
# ... and calls `half`, which raises: the model reads the error, the tool's author is told where it came from
HALF = '<tool_call>\n{"name": "half", "arguments": {"a": 9}}\n</tool_call>'


@pytest.mark.slow
def test_a_tool_that_fails_every_call_is_said_on_the_console_and_in_the_report(tmp_path, capsys, recwarn,
                                                                              scripted_calls):
    from grpokit import cli

    # a reward that pays the (failed) calls: report.md shows each step's best completions, so the calls are among them
    data = tool_recipe(tmp_path, {"environment": "env.py:Env"}, source=ENV,
                       rewards=[{"name": "tool_use", "args": {"count_failed": True}}])
    # room for the call and the error after it: a longer result would be rolled back by TRL, unread
    data["trainer"].update(per_device_train_batch_size=4, num_generations=4, max_steps=2, max_completion_length=320)
    path = str(write_recipe(tmp_path, data))
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [DIV, HALF]
    assert cli.main(["--recipe", path]) == 0
    out = capsys.readouterr().out.splitlines()
    steps = [line for line in out if line.startswith("step ")]
    assert len(steps) == 2 and all("tool calls 0.50/completion, 100% failed" in line for line in steps), steps
    said = [line for line in out if line.startswith("every tool call")]
    assert len(said) == 1 and out.index(said[0]) == out.index(steps[0]) + 2  # once, under the first such step ...
    assert out[out.index(steps[0]) + 1].startswith("(reward: ")  # ... after the legend the first step line comes with
    assert not [w for w in recwarn if "experimental feature" in str(w.message)]
    report = (tmp_path / "run" / "report.md").read_text()
    assert 'assistant: → calls div({"a": 9})' in report
    assert "tool div: {'error': 'Tool div not found.'}" in report
    assert "What to change: the tool, first." in report and "sampling.dynamic" not in report
    # every step's failed calls, whatever the sampled completions hold: the call, what the model read, and where a
    # tool's own code raised for its author (once on the console too)
    failed = report.split("## Failed tool calls", 1)[1].split("\n## ", 1)[0]
    assert """- steps 1–2: `div({"a": 9})` → the model read `{'error': 'Tool div not found.'}`\n""" in failed
    line = next(line for line in failed.splitlines() if "half(" in line)
    assert line.startswith("""- steps 1–2: `half({"a": 9})` → the model read `{'error': 'integer division or modulo by zero'}`""")
    assert "; your tool raised `ZeroDivisionError: integer division or modulo by zero (" in line
    assert f"{tmp_path / 'env.py'}:{ENV.splitlines().index('        return a // (a - a)') + 1} in half)`" in line
    raised = [text for text in out if text.startswith("[grpokit] tool half raised ZeroDivisionError")]
    assert len(raised) == 1 and "report.md" in raised[0]
    # docs/troubleshooting.md shows these lines as printed (its paths are an example's)
    shown = {str(tmp_path): "/home/me/project"}
    assert docs_block("every-call-failed") == said
    assert docs_block("failed-calls") == [normal(text, shown) for text in failed.splitlines() if text.startswith("- ")] \
        + [normal(raised[0], shown)]
