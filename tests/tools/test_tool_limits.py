"""Every tool call is bounded (tools.timeout_seconds, tools.max_result_chars): past either the call fails with an error
naming the limit, the run goes on and counts it; a stop signal lets a step's calls run on to their limits (a second one
stops at once); an environment's own faults end the run in one line. Real GRPOTrainer steps on the tiny model, a scripted first turn calling the tool (tests/tools/test_tooluse.py)."""

from __future__ import annotations

import json
import textwrap
import threading

import pytest

from grpokit import config
from grpokit.config import validate
from tests.helpers import SMOKE_DATA, write_recipe
from tests.tools.test_tooluse import scripted_calls, tool_recipe  # noqa: F401 - the fixture is used by name

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
    calls = sum(line == "stuck entered" for line in open(os.environ["TOOL_LOG"]).read().splitlines())
    try:
        if str(calls) == os.environ.get("STOP_AT_CALL"):  # the stop comes during this call, as a Ctrl-C would
            for _ in range(int(os.environ["STOP_TIMES"])):
                os.kill(os.getpid(), getattr(signal, os.environ["STOP_WITH"]))  # its handler runs here, in the try
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


def limits_recipe(tmp_path, monkeypatch, tools: dict, dataset: dict | None = None, rewards=(), name: str = "recipe.yaml",
                  **trainer) -> str:
    (tmp_path / "reader.py").write_text(textwrap.dedent(READER))
    monkeypatch.setenv("SEEN_COMPLETIONS", str(tmp_path / "seen.jsonl"))
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / "tool.log"))
    data = tool_recipe(tmp_path, tools, source=TOOLS,
                       rewards=[{"name": "reader.py:record", "weight": 0.0}, *rewards])
    data["trainer"].update({"per_device_train_batch_size": 4, "num_generations": 4, "max_steps": 1,
                            "max_completion_length": 320, **trainer})
    data["dataset"].update(dataset or {})
    return str(write_recipe(tmp_path, data, name))


def tokenizer_for(path):
    from grpokit.trainer.models import load_tokenizer
    from grpokit.checkpoints.tiny import ensure_tiny_model

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


SCORES_RESULTS = '''
def timed_out(completions, **kwargs):
    return [float(any("timeout_seconds" in str(m.get("content")) for m in c if m.get("role") == "tool"))
            for c in completions]
'''


def stuck_run(tmp_path, monkeypatch, name: str, **trainer) -> str:
    """A run whose tool calls each wait until tools.timeout_seconds cuts them; its reward is 1.0 for a completion that
    read that cut, 0.0 otherwise (no call, or one that did not run): what a step learns depends on every call's result."""
    (tmp_path / "scores.py").write_text(textwrap.dedent(SCORES_RESULTS))
    path = limits_recipe(tmp_path, monkeypatch, {"functions": ["env.py:stuck"], "timeout_seconds": 0.5},
                         rewards=[{"name": "scores.py:timed_out"}], name=f"{name}.yaml",
                         output_dir=str(tmp_path / name), seed=3, optim="adamw_torch", **trainer)
    monkeypatch.setenv("TOOL_LOG", str(tmp_path / f"{name}.log"))
    return path


def weights(folder) -> dict:
    from safetensors.torch import load_file

    found = {}
    for file in sorted(folder.glob("*.safetensors")):
        found.update({f"{file.name}:{k}": v for k, v in load_file(file).items()})
    return found


def test_a_stop_during_a_tool_call_lets_the_step_finish_whole_and_trains_it_as_a_whole_step(tmp_path, monkeypatch,
                                                                                              capsys, scripted_calls):
    import torch

    from grpokit import cli
    from grpokit.checkpoints import rundir

    # two calls a step (every other completion of 4 calls the tool): the third call is step 2's first
    stopped = stuck_run(tmp_path, monkeypatch, "stopped", max_steps=3, save_strategy="no")
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(stopped), [call("stuck")]
    monkeypatch.setenv("STOP_WITH", "SIGINT")
    monkeypatch.setenv("STOP_AT_CALL", "3")
    monkeypatch.setenv("STOP_TIMES", "1")
    assert cli.main(["--recipe", stopped]) == 130
    assert "run stopped: SIGINT at step 2, after saving a checkpoint" in capsys.readouterr().err
    # the call the stop came in, and the step's later call, ran on to their limit as any call does: none refused
    assert (tmp_path / "stopped.log").read_text().splitlines() == ["stuck entered", "stuck cut: ToolCut"] * 4
    results = [r for line in (tmp_path / "seen.jsonl").read_text().splitlines() for r in json.loads(line) if r]
    assert len(results) == 4 and all("no result within tools.timeout_seconds" in r for r in results), results
    checkpoint = tmp_path / "stopped" / "checkpoint-2"
    history = rundir.read_state(checkpoint / rundir.STATE_FILE)[0]["log_history"]
    assert [row["tools/timeout_frequency"] for row in history if "tools/timeout_frequency" in row] == [1.0, 1.0]
    assert not (tmp_path / "stopped" / "README.md").exists()  # no draft card of TRL's ("fine-tuned version of [None]")

    # the same two steps, never stopped: the stopped step was trained exactly as a whole one
    monkeypatch.delenv("STOP_AT_CALL")
    whole = stuck_run(tmp_path, monkeypatch, "whole", max_steps=2)
    assert cli.main(["--recipe", whole]) == 0, capsys.readouterr().err
    trained, reference = weights(checkpoint), weights(tmp_path / "whole")
    assert trained and trained.keys() == reference.keys()
    assert all(torch.equal(trained[k], reference[k]) for k in trained)


def test_a_second_stop_during_a_tool_call_stops_at_once_and_the_cut_step_is_not_taken(tmp_path, monkeypatch, capsys,
                                                                                        scripted_calls):
    from grpokit import cli
    from grpokit.checkpoints import rundir

    path = stuck_run(tmp_path, monkeypatch, "run", max_steps=3, save_strategy="steps", save_steps=1)
    scripted_calls.tokenizer, scripted_calls.calls = tokenizer_for(path), [call("stuck")]
    monkeypatch.setenv("STOP_WITH", "SIGTERM")
    monkeypatch.setenv("STOP_AT_CALL", "3")
    monkeypatch.setenv("STOP_TIMES", "2")
    assert cli.main(["--recipe", path]) == 143
    err = capsys.readouterr().err
    assert "run stopped: SIGTERM, at once" in err and f"last checkpoint: {tmp_path / 'run' / 'checkpoint-1'}" in err
    # step 2 is not taken: no checkpoint, no log, no report of it; the checkpoint is step 1, whole
    assert [p.name for p in (tmp_path / "run").glob("checkpoint-*")] == ["checkpoint-1"]
    assert [row.get("step") for row in rundir.read_state(tmp_path / "run" / "checkpoint-1" / rundir.STATE_FILE)[0][
        "log_history"]] == [1]
    assert not (tmp_path / "run" / "report.md").exists()


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
    from grpokit.tools.toolguard import Limits, ToolLimitError, bounded_function

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
