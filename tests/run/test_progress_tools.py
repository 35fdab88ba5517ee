"""The console's step line of a run given tools shows the step's tool calls and failed calls, and a step where every
call failed is said plainly once, under its line. Fast: the callbacks fed TRL-shaped logs; a real tool run's console is
held in tests/tools/test_tool_console.py."""

import doctest
from types import SimpleNamespace

from grpokit.run import progress

STEP = {"reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0}


def test_the_step_line_shows_calls_and_failed_calls():
    shown = progress.line({**STEP, "tools/call_frequency": 0.5, "tools/failure_frequency": 1.0}, 3, 30)
    assert "tool calls 0.50/completion, 100% failed" in shown
    # TRL logs a failure share of 0 at a step without calls: no call failed, none worked either
    quiet = progress.line({**STEP, "tools/call_frequency": 0.0, "tools/failure_frequency": 0.0}, 3, 30)
    assert "tool calls 0.00/completion" in quiet and "failed" not in quiet
    assert "tool" not in progress.line(STEP, 3, 30)  # a run without tools: the line it always had


def test_a_step_where_every_call_failed_is_said_once(capsys):
    printer = progress.CompactPrinter()
    for step, failed in ((1, 0.5), (2, 1.0), (3, 1.0)):
        state = SimpleNamespace(is_world_process_zero=True, global_step=step, max_steps=3)
        printer.on_log(None, state, None, logs={**STEP, "tools/call_frequency": 1.0, "tools/failure_frequency": failed})
    out = capsys.readouterr().out.splitlines()
    said = [line for line in out if line.startswith("every tool call")]
    assert said == [out[3]] and said[0].startswith("every tool call at step 2 failed (1.00 per completion)")
    # the first step line comes with what its labels mean, once
    legends = [line for line in out if line.startswith("(reward: ")]
    assert legends == [out[1]] and "zero-std groups: " in legends[0] and "tool calls: " in legends[0]


def test_docstring_examples_run():
    result = doctest.testmod(progress)
    assert result.attempted and not result.failed


def test_a_long_batch_of_tool_calls_shows_progress_between_step_lines():
    from grpokit.tools.toolguard import Tally

    said, now = [], [0.0]
    tally = Tally(say=said.append, clock=lambda: now[0])
    for _ in range(10):  # quick calls: nothing to say
        now[0] += 0.1
        tally.spent(0.05)
    assert said == []
    for _ in range(40):  # calls that hold the step up
        now[0] += 1.0
        tally.spent(0.9)
    assert len(said) == 1, said
    assert said[0] == "[grpokit] tools: 40 calls in the last 31 s, 27 s of it in the tools; the step goes on", said
    assert "in the tools" in said[0] and "the step goes on" in said[0]
