"""Failed tool calls findable: a tool's own exception gives its author the type, message and the tool file's line
(a library frame below it does not hide that line; a tool grpokit ships gives none: its errors answer the model),
each way calls failed is one line of report.md with its steps, and a resumed run keeps the earlier session's."""

from __future__ import annotations

import json

from grpokit.tools.environments import Calculator
from grpokit.reporting.failed_calls import failed_calls, failed_calls_section
from grpokit.reporting.report import read_record, store_record
from grpokit.tools.toolfaults import fault_of
from grpokit.tools.toolguard import Limits, Tally, bounded_function

TOOL = '''
import json


def parse(text: str) -> dict:
    """Parse.

    Args:
        text: JSON
    """
    return json.loads(text)
'''


def test_a_tools_exception_names_the_line_of_the_tools_own_file(tmp_path):
    (tmp_path / "tool.py").write_text(TOOL)
    namespace: dict = {}
    exec(compile(TOOL, str(tmp_path / "tool.py"), "exec"), namespace)
    said = []
    tally = Tally(say=said.append)
    parse = bounded_function(namespace["parse"], Limits(5.0, 1000, tally))
    for _ in range(2):
        try:
            parse(text="{")
        except Exception:  # noqa: BLE001 - TRL's: any Exception is the call's result
            pass
    fault = tally.faults.get("parse", "{'error': 'Expecting property name enclosed in double quotes: line 1 column 2 (char 1)'}")
    assert fault.kind == "JSONDecodeError"  # json's own frames are below the tool's: the tool's line is named
    assert fault.where == f"{tmp_path / 'tool.py'}:{TOOL.splitlines().index('    return json.loads(text)') + 1} in parse"
    assert len(said) == 1 and said[0].startswith("[grpokit] tool parse raised JSONDecodeError: ")


def test_a_shipped_tool_raises_the_models_error_not_an_authors():
    try:
        Calculator(max_digits=2).add(123, 1)
    except ValueError as err:
        assert fault_of(err, Calculator.add, str(err)) is None


def test_each_way_calls_failed_is_one_line_with_its_steps(tmp_path):
    call = {"type": "function", "function": {"name": "div", "arguments": {"a": 9}}}
    batch = [[{"role": "assistant", "content": "", "tool_calls": [call, call]},
              {"role": "tool", "name": "div", "content": "3"},
              {"role": "tool", "name": "div", "content": "{'error': 'Tool div not found.'}"}]]
    found = failed_calls(batch)
    assert found == [{"tool": "div", "call": 'div({"a": 9})', "read": "{'error': 'Tool div not found.'}"}]
    rows = [{"step": s, "author": None, **found[0]} for s in (1, 2, 3, 5)]
    rows.append({"step": 2, "tool": "half", "call": "half({})", "read": "{'error': '`x`'}",
                 "author": "ZeroDivisionError: x (env.py:3 in half)"})
    lines = failed_calls_section(rows)
    assert """- steps 1–3, 5: `div({"a": 9})` → the model read `{'error': 'Tool div not found.'}`""" in lines
    assert "- step 2: `half({})` → the model read `` {'error': '`x`'} ``; your tool raised " \
           "`ZeroDivisionError: x (env.py:3 in half)`" in lines
    assert failed_calls_section([]) == []
    # kept with the run; a session resumed at step 2 keeps the earlier calls up to it, and trained step 3 again
    store_record(tmp_path, [], failed_calls=rows[:3])
    store_record(tmp_path, [], resumed_at=2, failed_calls=[{**rows[0], "step": 4}])
    assert [r["step"] for r in read_record(tmp_path)["failed_calls"]] == [1, 2, 4]
    (tmp_path / "report_record.json").write_text(json.dumps({"failed_calls": [{"step": "x"}, 3]}))
    assert read_record(tmp_path)["failed_calls"] == []  # what is not a failed call is not read as one


# Rule: a way calls failed is shown once it happened, though a step keeps only PER_STEP ways: a step keeps the ways no
# earlier step kept first, so a kind the tool table counts (calls with arguments the tool does not take) is not hidden
# behind the same first ways at every step.
def test_every_way_calls_failed_is_kept_though_each_step_keeps_few():
    from types import SimpleNamespace

    from grpokit.reporting import failed_calls as fc

    def turn(name, arguments, read):
        return [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
                                                                      {"name": name, "arguments": arguments}}]},
                {"role": "tool", "name": name, "content": read}]

    batch = [turn("divide", {"a": 1}, "{'error': 'Tool divide not found.'}"),
             turn("sqrt", {"x": 4}, "{'error': 'Tool sqrt not found.'}"),
             turn("add", {"a": 1, "c": 2}, "{'error': \"add(a, b): takes no argument 'c'; missing 'b'\"}")]
    class Trainer:  # what the callback reads: TRL's kept batch; and where it is added
        _logs = {"completion": batch}

        def add_callback(self, callback):
            pass

    trainer = Trainer()
    kept = fc.keep_failed_calls(trainer)
    for step in (1, 2):
        kept.on_log(None, SimpleNamespace(global_step=step), None, logs={fc.FAILURES: 1.0})
    assert {row["tool"] for row in kept.rows} == {"divide", "sqrt", "add"}
    assert "takes no argument 'c'" in "\n".join(fc.failed_calls_section(kept.rows))
