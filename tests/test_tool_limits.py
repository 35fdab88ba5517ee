"""Every tool call is bounded (tools.timeout_seconds, tools.max_result_chars): past either the call fails with an error
naming the limit, the run goes on and counts it; a stop signal cuts a stuck call; an environment's own faults end the
run in one line. Real GRPOTrainer steps on the tiny model, a scripted first turn calling the tool (tests/test_tooluse)."""

from __future__ import annotations

import json
import signal
import textwrap
import threading

import pytest

from grpokit import config
from grpokit.config import validate
from tests.helpers import SMOKE_DATA, write_recipe
from tests.test_tooluse import scripted_calls, tool_recipe  # noqa: F401 - the fixture is used by name

pytestmark = pytest.mark.slow

TOOLS = '''
import math, os, signal, threading

FETCHES = []


def _note(what):
    with open(os.environ["TOOL_LOG"], "a") as f:
        f.write(what + "\\n")


class Slow:
    """Its one tool hangs on every other call and returns 10 MB on the others."""

    def reset(self, **row):
        pass

    def fetch(self) -> str:
        """Fetch the page."""
        FETCHES.append(1)
        if len(FETCHES) % 2:
            _note("fetch entered")
            threading.Event().wait(20)  # bounded only so that an unbounded grpokit fails this test, not hangs it
            _note("fetch returned")
            return "late"
        return "x" * 10_000_000


def stuck() -> str:
    """Wait for the server."""
    _note("stuck entered")
    try:
        os.kill(os.getpid(), getattr(signal, os.environ["STOP_WITH"]))  # its handler runs on the next line, in the try
        threading.Event().wait(20)
    except BaseException as err:
        _note(f"stuck cut: {type(err).__name__}")
        raise
    _note("stuck returned")
    return "late"


class Waits:
    """Async all through: its tool waits for ever, its reward is NaN."""

    def reset(self, **row):
        pass

    async def wait(self) -> str:
        """Wait."""
        import asyncio

        await asyncio.Event().wait()

    async def get_reward(self) -> float:
        return math.nan


class Adds:
    """A tool with two parameters, for calls that name others."""

    def reset(self, **row):
        pass

    def add(self, a: int, b: int) -> int:
        """Add two numbers.

        Args:
            a: the first
            b: the second
        """
        return a + b


class Box:
    """`fault` picks what the environment itself does wrong."""

    def __init__(self, fault: str = "none"):
        if fault == "init":
            raise RuntimeError("no licence for the box")
        self.fault = fault

    def reset(self, **row):
        if self.fault == "reset":
            raise KeyError("question")
        if self.fault == "stuck":
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                threading.Event().wait(20)
            except BaseException as err:
                _note(f"reset cut: {type(err).__name__}")
                raise

    def quit(self) -> str:
        """Leave."""
        raise SystemExit(3)

    def get_reward(self) -> float:
        return {"string": "1.0", "nan": math.nan, "inf": math.inf}.get(self.fault, 0.0)
'''


def call(name: str) -> str:
    return '<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>' % name


READER = '''
import json, os

def record(completions, **kwargs):
    with open(os.environ["SEEN_COMPLETIONS"], "a") as f:
        for c in completions:
            f.write(json.dumps([m.get("content")[:300] if isinstance(m.get("content"), str) else None
                                for m in c if m.get("role") == "tool"]) + "\\n")
    return [0.0 for _ in completions]
'''


def limits_recipe(tmp_path, monkeypatch, tools: dict, dataset: dict | None = None, **trainer) -> str:
    (tmp_path / "reader.py").write_text(textwrap.dedent(READER))
    monkeypatch.setenv("SEEN_COMPLETIONS", str(tmp_path / "seen.jsonl"))
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / "tool.log"))
    data = tool_recipe(tmp_path, tools, source=TOOLS,
                       rewards=[{"name": "reader.py:record", "weight": 0.0}])
    data["trainer"].update({"per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 1,
                            "max_completion_length": 320, **trainer})
    data["dataset"].update(dataset or {})
    return str(write_recipe(tmp_path, data))


def tokenizer_for(path):
    from grpokit.models import load_tokenizer
    from grpokit.tiny import ensure_tiny_model

    return load_tokenizer(str(ensure_tiny_model()), validate(config.load(path)))


def tool_log(tmp_path) -> list[str]:
    log = tmp_path / "tool.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_stuck_call_and_a_10_mb_result_fail_with_the_limit_named_and_the_run_goes_on(tmp_path, monkeypatch, capsys,
                                                                                         scripted_calls):
    from grpokit import cli

    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Slow", "timeout_seconds": 0.5,
                                                 "max_result_chars": 2000})
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [call("fetch")]
    assert cli.main(["--recipe", path]) == 0, capsys.readouterr().err
    results = [r for line in (tmp_path / "seen.jsonl").read_text().splitlines() for r in json.loads(line)]
    # what the model read as each tool's result: TRL's error wording, with the limit that cut the call
    assert any(r.startswith("{'error': ") and "tools.timeout_seconds (0.5 s)" in r for r in results), results
    assert any(r.startswith("{'error': ") and "10000000 characters" in r and "tools.max_result_chars (2000)" in r
               for r in results), results
    assert tool_log(tmp_path) == ["fetch entered"]  # cut inside the wait: it never returned
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    assert history[0]["tools/failure_frequency"] == 1.0  # both calls counted as failed ...
    assert (history[0]["tools/timeout_frequency"], history[0]["tools/oversize_frequency"]) == (0.5, 0.5)  # ... and why
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| failed calls per call (`tools/failure_frequency`) | 100% |" in report
    assert "| calls past tools.timeout_seconds, per call (`tools/timeout_frequency`) | 50% |" in report
    assert "| results over tools.max_result_chars, per call (`tools/oversize_frequency`) | 50% |" in report


def test_calls_with_arguments_the_tool_does_not_take_are_counted_and_named_in_the_report(tmp_path, monkeypatch, capsys,
                                                                                         scripted_calls):
    from grpokit import cli

    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Adds"})
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    bad = '<tool_call>\n{"name": "add", "arguments": {"x": 2}}\n</tool_call>'
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [good, bad]
    assert cli.main(["--recipe", path]) == 0, capsys.readouterr().err
    results = [r for line in (tmp_path / "seen.jsonl").read_text().splitlines() for r in json.loads(line)]
    assert "5" in results
    # the model reads which arguments the tool takes
    assert any(r.startswith("{'error': ") and "add(a, b)" in r and "'x'" in r for r in results), results
    history = json.loads((tmp_path / "run" / "trainer_state.json").read_text())["log_history"]
    assert history[0]["tools/failure_frequency"] == 0.5
    assert history[0]["tools/bad_arguments_frequency"] == 0.5
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| calls with arguments the tool does not take, per call (`tools/bad_arguments_frequency`) | 50% |" in report


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_cuts_a_stuck_call_and_the_run_stops_at_the_step_end(tmp_path, monkeypatch, capsys, scripted_calls,
                                                                          signum):
    from grpokit import cli

    monkeypatch.setenv("STOP_WITH", signal.Signals(signum).name)
    path = limits_recipe(tmp_path, monkeypatch, {"functions": ["env.py:stuck"], "timeout_seconds": 60}, max_steps=2)
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [call("stuck")]
    assert cli.main(["--recipe", path]) == 128 + signum
    err = capsys.readouterr().err
    assert f"run stopped: {signal.Signals(signum).name} at step 1, after saving a checkpoint" in err
    # the first call is cut by the stop; the second is refused without running, so the step ends at once
    assert tool_log(tmp_path) == ["stuck entered", "stuck cut: ToolCut"]
    results = [r for line in (tmp_path / "seen.jsonl").read_text().splitlines() for r in json.loads(line)]
    assert len(results) == 2 and all("the run is stopping" in r for r in results), results


@pytest.mark.parametrize("fault, calls, said", [
    # the environment's own code raising, or returning what no reward may: one line, the method and the sample named
    # (the sample's prompt is whichever row the shuffled batch put first)
    ("init", None, ["run stopped: environment Box.__init__ raised RuntimeError: no licence for the box, building the "
                    "instance for sample 0"]),
    ("reset", None, ["run stopped: environment Box.reset raised KeyError: 'question' on sample 0 (prompt: '"]),
    ("string", None, ["run stopped: environment Box.get_reward returned '1.0' (a str) for sample 0 (prompt: '",
                      "); expected a float or None"]),
    ("nan", None, ["run stopped: environment Box.get_reward returned NaN for sample 0 (prompt: '",
                   "); rewards must be finite, return None to abstain"]),
    ("inf", None, ["run stopped: environment Box.get_reward returned inf for sample 0 (prompt: '",
                   "); rewards must be finite, return None to abstain"]),
    # an exit is not a failed call the model can read: it is the tool's own fault
    ("none", "quit", ["run stopped: tool Box.quit raised SystemExit: 3 on sample 0 (prompt: '"]),
])
def test_an_environment_fault_stops_the_run_in_one_line(tmp_path, monkeypatch, capsys, scripted_calls, fault, calls, said):
    from grpokit import cli

    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Box", "environment_args": {"fault": fault}})
    scripted_calls.tokenizer = tokenizer_for(path)
    if calls:
        scripted_calls.calls = [call(calls)]
    assert cli.main(["--recipe", path]) == 1
    err = capsys.readouterr().err
    assert all(part in err for part in said), err
    assert "Traceback" not in err and err.count("run stopped:") == 1


def test_a_stop_signal_while_reset_is_stuck_stops_the_run_at_once(tmp_path, monkeypatch, capsys):
    """No step end can come around a stuck reset, so waiting for one would wait for ever."""
    from grpokit import cli

    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Box", "environment_args": {"fault": "stuck"}})
    assert cli.main(["--recipe", path]) == 143
    err = capsys.readouterr().err
    assert "[grpokit] SIGTERM came while Box.reset ran, which no step end can come around: stopping at once" in err
    assert "run stopped: SIGTERM, at once" in err and "Traceback" not in err
    assert tool_log(tmp_path) == ["reset cut: ToolCut"]


def test_a_tool_that_swallows_its_cut_is_cut_again_and_the_console_says_why(capsys):
    """A retry loop with a bare `except:` catches the cut too: it is raised again every second, and after three the
    console names the cause; the call fails on the time limit even though the tool returned in the end."""
    from grpokit.toolguard import Limits, ToolLimitError, bounded_function

    caught = []

    def retry() -> str:
        """Retry until it works."""
        while len(caught) < 4:
            try:
                threading.Event().wait(20)
            except:  # noqa: E722 - the point of the test
                caught.append(1)
        return "gave up"

    with pytest.raises(ToolLimitError, match=r"^retry: no result within tools.timeout_seconds \(0.2 s\); the call was "):
        bounded_function(retry, Limits(0.2, 100))()
    assert len(caught) == 4
    assert "past tools.timeout_seconds (0.2 s): the tool catches the exception that ends it" in capsys.readouterr().err


def test_an_environment_fault_under_eval_is_one_line(tmp_path, monkeypatch, capsys):
    from grpokit import cli

    # the training prompts are held out too: enough rows to roll out
    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Box", "environment_args": {"fault": "reset"}},
                         dataset={"eval_path": str(SMOKE_DATA), "eval_limit": 2})
    assert cli.main(["--recipe", path, "--eval"]) == 1
    err = capsys.readouterr().err
    assert "eval stopped: environment Box.reset raised KeyError: 'question' on sample 0 (prompt: '" in err, err
    assert "Traceback" not in err


def test_async_tools_and_rewards_are_bounded_and_checked_too(tmp_path, monkeypatch, capsys, scripted_calls):
    """TRL runs an async tool and an async get_reward on its event loop thread: the limit and the reward's rule hold."""
    from grpokit import cli

    path = limits_recipe(tmp_path, monkeypatch, {"environment": "env.py:Waits", "timeout_seconds": 0.5})
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [call("wait")]
    assert cli.main(["--recipe", path]) == 1
    err = capsys.readouterr().err
    assert "run stopped: environment Waits.get_reward returned NaN for sample 0 (prompt: '" in err, err
    results = [r for line in (tmp_path / "seen.jsonl").read_text().splitlines() for r in json.loads(line)]
    assert results and all("wait: no result within tools.timeout_seconds (0.5 s)" in r for r in results), results
