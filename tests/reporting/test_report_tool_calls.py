"""A run given tools (TRL's `tools=` or `environment_factory=`) shows in report.md, the training plot and `--compare`
whether the model learned to use them: calls per completion and failed calls per call beside the reward. A run without
tools gets the report and plot it always had. Fast: fabricated trainer states with the keys TRL 1.16 logs."""

import doctest
import json

import pytest

from grpokit.cli import main
from grpokit.reporting import tool_calls
from grpokit.reporting.compare import figure as compare_figure
from grpokit.reporting.compare import load_runs, table
from grpokit.reporting.plots import PANELS, collect_panels, figure, flat_reasons, plot_run
from grpokit.reporting.report import write_report

CALLS, FAILS = "tools/call_frequency", "tools/failure_frequency"


def history(calls, fails=None, steps=40):
    """A TRL-shaped log history: reward climbing 0.2 -> 0.8, a fifth of the groups unanimous, and (when `calls` is a
    function of the step) the tool metrics; TRL's end-of-run summary entry last."""
    out = []
    for s in range(1, steps + 1):
        entry = {"step": s, "epoch": s / steps, "reward": 0.2 + 0.6 * s / steps, "reward_std": 0.3,
                 "frac_reward_zero_std": 0.2, "completions/mean_length": 50.0, "entropy": 1.0, "loss": 0.01}
        if calls is not None:
            entry[CALLS] = calls(s)
            entry[FAILS] = fails(s) if fails else 0.0
        out.append(entry)
    return out + [{"step": steps, "train_runtime": 12.5, "train_loss": 0.01}]


def write_state(folder, log):
    folder.mkdir(parents=True, exist_ok=True)
    steps = log[-1]["step"]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": log, "global_step": steps, "max_steps": steps}))
    return folder


def report(folder, log) -> str:
    return write_report(write_state(folder, log), recipe_name="t", completions=[], plots=[]).read_text()


def section(text: str) -> str:
    return text.split("## Tool use", 1)[1].split("\n## ", 1)[0]


# --- report.md -------------------------------------------------------------------------------------------------------


def test_tool_use_is_read_over_the_windows_the_reward_is_judged_by(tmp_path):
    # calls rise 0.1 -> 2.1 per completion, failures fall 50% -> 10%; 40 logged steps: windows of 5
    text = report(tmp_path, history(lambda s: 0.1 + 2.0 * (s - 1) / 39, lambda s: 0.5 - 0.4 * (s - 1) / 39))
    # the reward's own windows and figures, as "What the curves say" states them
    assert "the mean reward went from 0.245 (steps 1–5) to 0.77 (steps 36–40)." in text
    part = section(text)
    assert "| | start (steps 1–5) | end (steps 36–40) |" in part
    assert "| tool calls per completion (`tools/call_frequency`) | 0.203 | 2 |" in part
    assert "| mean reward (`reward`) | 0.245 | 0.77 |" in part  # the reward over the same steps, beside the tool
    # weighted by calls, the later, busier steps of the first window weigh more: 47%, where a plain mean says 48%
    assert "| failed calls per call (`tools/failure_frequency`) | 47% | 12% |" in part
    assert "The model calls the tool more at the end than at the start (0.203 → 2 calls per completion)." in part
    assert text.index("## Tool use") < text.index("## Curves")


READINGS = {
    # never a call: the reward came without the tool
    "never": (lambda s: 0.0, None, "The model never called the tool at any of 40 logged steps: whatever reward it "
                                   "earned came without it."),
    # calls, but 80% of those at the end failed
    "mostly-failed": (lambda s: 1.0, lambda s: 0.8, "Most of the model's tool calls at the end failed (80%): look at "
                                                    "the tool's errors"),
    # none at the start, some at the end
    "learned": (lambda s: 0.0 if s <= 10 else 1.0, None, "The model learned to call the tool: never at the start, 1 "
                                                         "call per completion at the end."),
    # some at the start, none at the end
    "stopped": (lambda s: 1.0 if s <= 10 else 0.0, None, "The model stopped calling the tool: 1 call per completion at "
                                                         "the start, none at the end."),
    # fewer calls at the end
    "less": (lambda s: 2.0 - s / 40, None, "The model calls the tool less at the end than at the start"),
    # one call per completion, give or take a swing from step to step: no trend
    "steady": (lambda s: (0.6, 1.4)[s % 2], None, "The model calls the tool about as often at the end as at the start"),
    # 0.312 calls at the start and 0.125 at the end of a run whose steps swing between 0 and 0.5: not "about as often",
    # and not a trend either -- the two figures and the swing are said
    "swinging": (lambda s: [0.5, 0.0, 0.5625, 0.0, 0.5][s - 1] if s <= 5 else [0.25, 0.0, 0.125, 0.25, 0.0][s - 36]
                 if s >= 36 else 0.5 * (s % 2), None,
                 "The model's tool calls per completion went from 0.312 at the start to 0.125 at the end, a change "
                 "within this run's swing from step to step: no trend to read from it."),
}


@pytest.mark.parametrize("case", READINGS)
def test_the_reading_says_plainly_what_the_model_did_with_the_tool(tmp_path, case):
    calls, fails, says = READINGS[case]
    assert says in section(report(tmp_path, history(calls, fails)))


def test_steps_without_calls_do_not_count_as_calls_that_worked(tmp_path):
    # TRL logs a failure share of 0 at a step without calls: the end (no calls) has nothing to fail, not 0% failed
    log = history(lambda s: 1.0 if s <= 10 else 0.0, lambda s: 1.0 if s <= 10 else 0.0)
    part = section(report(tmp_path, log))
    assert "| failed calls per call (`tools/failure_frequency`) | 100% | no calls |" in part
    failures = next(lines for panel, lines in collect_panels(log) if panel.title == "Tool call failures")
    (_, steps, values, _), = failures  # the plot, too, draws the share only where calls were made
    assert steps == list(range(1, 11)) and set(values) == {1.0}


def test_eval_tool_failures_are_drawn_only_where_eval_calls_were_made():
    log = history(lambda s: 1.0, lambda s: 0.5)
    log += [{"step": 10, "eval_tools/call_frequency": 0.0, "eval_tools/failure_frequency": 0.0},
            {"step": 20, "eval_tools/call_frequency": 2.0, "eval_tools/failure_frequency": 0.25}]
    failures = next(lines for panel, lines in collect_panels(log) if panel.title == "Tool call failures")
    assert [(label, steps, values) for label, steps, values, _ in failures][1] == ("failed share (eval)", [20], [0.25])


def test_a_short_run_compares_its_first_and_last_logged_step(tmp_path):
    part = section(report(tmp_path, history(lambda s: s / 4, steps=4)))
    assert "| | start (step 1) | end (step 4) |" in part and "| 0.25 | 1 |" in part


def test_a_run_without_tools_gets_the_report_it_always_had(tmp_path):
    text = report(tmp_path, history(None))
    heads = [line for line in text.splitlines() if line.startswith("#")]
    assert heads == ["# GRPO run report: t", "## Recipe", "## Final figures", "## What the curves say", "## Curves",
                     "## Sampled completions"]
    assert "tools/" not in text and "calls per completion" not in text and "Tool" not in text
    assert tool_calls.tool_use_section(history(None)) == []


def test_docstring_examples_run():
    result = doctest.testmod(tool_calls)
    assert result.attempted and not result.failed


# --- plots -------------------------------------------------------------------------------------------------------------


def titles(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_visible()]


def test_the_plot_draws_tool_panels_beside_the_reward(tmp_path):
    with_tools = history(lambda s: s / 20, lambda s: 0.1)
    without = titles(figure(history(None), "t"))
    drawn = titles(figure(with_tools, "t"))
    assert drawn[:3] == ["Reward", "Tool calls", "Tool call failures"]  # the first row of the grid
    assert len(drawn) == len(without) + 2 and [t for t in drawn if not t.startswith("Tool")] == without
    paths = plot_run(write_state(tmp_path, with_tools))
    assert paths == [tmp_path / "plots" / "training.png"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_tools_gets_the_plot_it_always_had():
    drawn = titles(figure(history(None), "t"))
    assert drawn == [p.title for p in PANELS if p.title in drawn] and not any(t.startswith("Tool") for t in drawn)


def test_a_tool_never_called_is_said_on_its_panel(tmp_path):
    log = history(lambda s: 0.0)
    reasons = flat_reasons(log)
    assert reasons["Tool calls"] == "0 at every logged step: the model never called the tool"
    assert "Tool call failures" not in reasons  # no call, so no failure share to draw
    notes = {ax.get_title(): [t.get_text().replace("\n", " ") for t in ax.texts] for ax in figure(log, "t").axes}
    assert notes["Tool calls"] == [reasons["Tool calls"]] and "Tool call failures" not in notes
    assert "- Tool calls: 0 at every logged step: the model never called the tool" in report(tmp_path, log)


# --- --compare -------------------------------------------------------------------------------------------------------


def test_compare_lists_tool_calls_when_a_run_was_given_tools(tmp_path, capsys):
    tools = write_state(tmp_path / "tools", history(lambda s: 0.1 + 2.0 * (s - 1) / 39))
    plain = write_state(tmp_path / "plain", history(None))
    runs = load_runs(tools, [plain])
    lines = table(runs)
    assert lines[0].endswith("| tool calls per completion, closing window |") and lines[1].endswith("|---:|")
    assert lines[2].endswith("| 2 |") and lines[3].endswith("| — |")  # the closing window, as report.md's "end"
    notes = {ax.get_title(): [t.get_text().replace("\n", " ") for t in ax.texts] for ax in compare_figure(runs).axes}
    assert notes["Tool calls"] == [f"not logged by {plain}"]
    assert main(["--plot", str(tools), "--compare", str(plain)]) == 0
    assert "tool calls per completion, closing window" in (tools / "report.md").read_text()


def test_compare_without_tools_keeps_its_columns_and_panels(tmp_path):
    runs = load_runs(write_state(tmp_path / "a", history(None)), [write_state(tmp_path / "b", history(None))])
    assert [line.count("|") for line in table(runs)] == [9] * 4 and "tool calls" not in table(runs)[0]
    assert "Tool calls" not in titles(compare_figure(runs))


# --- sampled completions ------------------------------------------------------------------------------------------------


def test_sampled_completions_show_each_tool_call_its_result_and_the_worked_call(tmp_path):
    # a row as a tool run stores it in report_record.json: TRL's messages, the call on a turn with no text
    prompt = [{"role": "system", "content": "Use the tools."},
              {"role": "user", "content": "2718 * 43?", "name": None, "tool_calls": None},
              {"role": "assistant", "content": "",
               "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 2718, "b": 43}}}]},
              {"role": "user", "content": "98517 / 3?"}]
    completion = [{"role": "assistant", "content": "",
                   "tool_calls": [{"type": "function", "function": {"name": "divide", "arguments": {"a": 98517, "b": 3}}}]},
                  {"role": "tool", "name": "divide", "content": "{'error': 'Tool divide not found.'}"},
                  {"role": "assistant", "content": "The final answer is 32839."}]
    folder = write_state(tmp_path, history(lambda s: 1.0, lambda s: 1.0, steps=2))
    (folder / "report_record.json").write_text(json.dumps({"completions": [
        {"prompt": prompt, "completion": completion, "rewards": {"task_score": 1.0}, "step": 2}], "resumed_at": None}))
    text = write_report(folder, recipe_name="t", plots=[]).read_text()
    sampled = text.split("## Sampled completions", 1)[1]
    assert 'assistant: → calls multiply({"a": 2718, "b": 43})' in sampled  # the few-shot worked call
    assert 'assistant: → calls divide({"a": 98517, "b": 3})' in sampled  # the model's own call, its turn otherwise blank
    assert "tool divide: {'error': 'Tool divide not found.'}" in sampled  # what the tool gave back, and which tool
    assert "assistant: The final answer is 32839." in sampled
    assert "assistant: \n" not in sampled and not sampled.rstrip().endswith("assistant:")


def test_when_most_calls_fail_the_advice_points_at_the_tool_not_the_batch(tmp_path):
    # every call failed; the reward barely moved and most groups had no spread: the thin-signal verdict's fixes
    # (more prompts per step, dynamic sampling) would be the advice without the tool's failures
    log = history(lambda s: 1.0, lambda s: 1.0)
    for entry in log[:-1]:
        entry.update(reward=0.1 * (entry["step"] % 2), frac_reward_zero_std=0.9)
    said = report(tmp_path, log).split("## What the curves say", 1)[1].split("\n## ", 1)[0]
    assert "What to change: the tool, first. 100% of the model's tool calls failed" in said
    assert "'Tool X not found.' names a tool the model was shown" in said
    assert "per_device_train_batch_size" not in said and "sampling.dynamic" not in said
    # the same curves without tools get the thin-signal advice
    plain = report(tmp_path / "plain", [{k: v for k, v in e.items() if not k.startswith("tools/")} for e in log])
    assert "sampling.dynamic" in plain.split("## What the curves say", 1)[1]


def test_a_tool_that_failed_every_call_it_got_is_in_the_verdict_even_once_the_model_stopped_calling(tmp_path):
    # every call failed, and the model gave the tool up: the end made no call (TRL logs 0 failures at a step without
    # calls), so the end alone says nothing of the tool -- the verdict and the advice still name it
    from grpokit.reporting.last_word import last_word

    log = history(lambda s: 1.0 if s <= 20 else 0.0, lambda s: 1.0 if s <= 20 else 0.0)
    assert "tool" in last_word(log, tools_failed=tool_calls.failed_at_end(log)).split(".")[0]
    said = report(tmp_path, log).split("## What the curves say", 1)[1].split("\n## ", 1)[0]
    assert "What to change: the tool, first. 100% of the model's tool calls failed" in said
