"""Whether a run that gave the model tools (TRL's `GRPOTrainer(tools=...)` or `environment_factory=...`) taught it to
use them: tool calls per completion and failed calls per call at the start and the end of the run, beside the reward.

    from grpokit.reporting.tool_calls import tool_use_section
    lines = tool_use_section(state["log_history"])   # [] for a run without tools

TRL 1.16 logs, at every step of a run with tools, `tools/call_frequency` (the step's tool calls over its completions)
and `tools/failure_frequency` (failed calls over calls, 0 at a step without calls). A run without tools logs neither,
and its report has no tool part. Start and end are the windows of logged steps the report judges the reward by
(`verdict.windows`), so the tool figures and the reward's are read over the same steps.
"""

from __future__ import annotations

import math

from grpokit.reporting.plots import series
from grpokit.reporting.verdict import COLLAPSE_MIN_STEPS, MOSTLY_FAILED, window, windows

CALLS, FAILURES = "tools/call_frequency", "tools/failure_frequency"
# grpokit's own, logged per call (grpokit.tools.toolguard): the share of calls each of the recipe's tool limits cut. Each such
# call is also one of TRL's failed calls.
LIMITS = {"tools.timeout_seconds": ("calls past tools.timeout_seconds, per call", "tools/timeout_frequency"),
          "tools.max_result_chars": ("results over tools.max_result_chars, per call", "tools/oversize_frequency")}
# also grpokit's, per call: calls whose arguments the tool does not take (each a failed call of TRL's too)
BAD_ARGUMENTS = ("calls with arguments the tool does not take, per call", "tools/bad_arguments_frequency")
# The end's calls per completion count as more (or fewer) than the start's when they differ by more than this share
# of the larger, and by more than 2 standard errors of the difference of two window means: single steps swing.
CHANGE = 0.1
# Within the noise, the two are "about as often" only when they differ by at most this share of the larger (1.08 and
# 0.92 are; 0.312 and 0.125 are not, and are said as they are).
ABOUT_THE_SAME = 1 / 3


def logged(history: list[dict]) -> bool:
    """Whether the run logged tool use (it was given tools).

    >>> logged([{"step": 1, "reward": 0.5}]), logged([{"step": 1, "tools/call_frequency": 0.0}])
    (False, True)
    """
    return bool(series(history, CALLS)[1])


def ends(history: list[dict]) -> tuple[tuple, tuple]:
    """(first, last) spans of logged steps compared: the reward's first and closing windows when the run logged enough
    steps for them (as `verdict._course` judges the reward), else its first and last logged step.

    >>> ends([{"step": s, "tools/call_frequency": s / 10} for s in range(1, 9)])
    ((1, 3), (6, 8))
    """
    steps, values = series(history, CALLS)
    if len(values) >= 2 * COLLAPSE_MIN_STEPS:
        means = windows(history, CALLS)
        return means[0][:2], means[-1][:2]
    return (steps[0], steps[0]), (steps[-1], steps[-1])


def over(history: list[dict], key: str, span: tuple) -> float | None:
    """The mean of a logged metric over the logged steps of a span (first, last); None when none falls in it."""
    inside = [v for s, v in zip(*series(history, key)) if span[0] <= s <= span[1]]
    return sum(inside) / len(inside) if inside else None


def failures_per_call(history: list[dict], span: tuple) -> float | None:
    """Failed calls over calls in a span of logged steps: each step's failure share weighted by its calls (every step
    of a run samples as many completions, so calls per completion weigh as calls), None when the span made no call.

    >>> failures_per_call([{"step": 1, CALLS: 3.0, FAILURES: 1.0}, {"step": 2, CALLS: 1.0, FAILURES: 0.0}], (1, 2))
    0.75
    """
    fails = dict(zip(*series(history, FAILURES)))
    pairs = [(c, fails[s]) for s, c in zip(*series(history, CALLS)) if span[0] <= s <= span[1] and s in fails]
    calls = sum(c for c, _ in pairs)
    return sum(c * f for c, f in pairs) / calls if calls > 0 else None


def failed_at_end(history: list[dict]) -> float | None:
    """Failed calls over the model's latest calls in a run given tools (what `verdict.diagnosis` weighs): those of the
    end window, or -- where the end made no call, as when a model gives up a tool that failed it -- every call of the
    run; None for a run without tools or one that never called.

    >>> failed_at_end([{"step": 1, CALLS: 2.0, FAILURES: 1.0}]), failed_at_end([{"step": 1, "reward": 0.5}])
    (1.0, None)
    >>> failed_at_end([{"step": 1, CALLS: 2.0, FAILURES: 1.0}, {"step": 2, CALLS: 0.0, FAILURES: 0.0}])
    1.0
    """
    if not logged(history):
        return None
    at_end = failures_per_call(history, ends(history)[1])
    steps = series(history, CALLS)[0]
    return at_end if at_end is not None else failures_per_call(history, (steps[0], steps[-1]))


def _moved(history: list[dict], start: float, end: float) -> bool:
    """Whether calls per completion differ between the two windows by more than `CHANGE` and more than noise."""
    _, values = series(history, CALLS)
    w = window(len(values)) if len(values) >= 2 * COLLAPSE_MIN_STEPS else 1  # logged steps per compared mean (`ends`)
    # step-to-step noise from successive differences, so a trend does not count as noise (as `verdict.fall_from_best`)
    diffs = [(b - a) ** 2 for a, b in zip(values, values[1:])]
    sigma = math.sqrt(sum(diffs) / len(diffs) / 2) if diffs else 0.0
    return abs(end - start) > max(CHANGE * max(start, end), 2 * sigma * math.sqrt(2 / w))


def _calls(n: float) -> str:
    return f"{n:.3g} call" + ("" if f"{n:.3g}" == "1" else "s")


def reading(history: list[dict]) -> str:
    """One plain sentence: did the model use the tool, more or less by the end, and did its calls work.

    >>> reading([{"step": s, CALLS: 0.0, FAILURES: 0.0, "reward": 0.5} for s in range(1, 4)])[:34]
    'The model never called the tool at'
    """
    steps, calls = series(history, CALLS)
    if max(calls) == 0:
        return (f"The model never called the tool at any of {len(calls)} logged steps: whatever reward it earned came "
                "without it.")
    start, end = ends(history)
    c0, c1, failed = over(history, CALLS, start), over(history, CALLS, end), failures_per_call(history, end)
    if failed is not None and failed > MOSTLY_FAILED:
        return (f"Most of the model's tool calls at the end failed ({failed:.0%}): look at the tool's errors before "
                "reading the reward, which came mostly without the tool's answers.")
    if start == end:
        return f"The model made {_calls(c1)} per completion at its only logged step; too few steps to see a trend."
    if c0 == 0:
        return f"The model learned to call the tool: never at the start, {_calls(c1)} per completion at the end."
    if c1 == 0:
        return f"The model stopped calling the tool: {_calls(c0)} per completion at the start, none at the end."
    if not _moved(history, c0, c1):
        if abs(c1 - c0) > ABOUT_THE_SAME * max(c0, c1):  # apart, but within the steps' swing: neither same nor trend
            return (f"The model's tool calls per completion went from {c0:.3g} at the start to {c1:.3g} at the end, a "
                    "change within this run's swing from step to step: no trend to read from it.")
        return f"The model calls the tool about as often at the end as at the start ({c0:.3g} and {c1:.3g} per completion)."
    word = "more" if c1 > c0 else "less"
    return f"The model calls the tool {word} at the end than at the start ({c0:.3g} → {c1:.3g} calls per completion)."


def _span(span: tuple) -> str:
    return f"step {span[0]}" if span[0] == span[1] else f"steps {span[0]}–{span[1]}"


def _cell(value: float | None, share: bool = False) -> str:
    if value is None:
        return "no calls" if share else "—"
    return f"{value:.0%}" if share else f"{value:.3g}"


def tool_use_section(history: list[dict]) -> list[str]:
    """report.md's "Tool use" part: calls per completion, failed calls per call and the mean reward at the start and the
    end of the run, then `reading`. [] for a run without tools, so its report is unchanged."""
    if not logged(history):
        return []
    start, end = ends(history)
    rows = [("tool calls per completion", CALLS, lambda span: over(history, CALLS, span), False)]
    if series(history, FAILURES)[1]:
        rows.append(("failed calls per call", FAILURES, lambda span: failures_per_call(history, span), True))
    cut = {limit: row for limit, row in LIMITS.items() if any(series(history, row[1])[1])}  # once a limit cut a call
    rows += [(label, key, lambda span, key=key: over(history, key, span), True) for label, key in cut.values()]
    misnamed = any(series(history, BAD_ARGUMENTS[1])[1])
    if misnamed:
        rows.append((*BAD_ARGUMENTS, lambda span: over(history, BAD_ARGUMENTS[1], span), True))
    if series(history, "reward")[1]:
        rows.append(("mean reward", "reward", lambda span: over(history, "reward", span), False))
    lines = ["", "## Tool use", "", f"| | start ({_span(start)}) | end ({_span(end)}) |", "|---|---:|---:|"]
    lines += [f"| {label} (`{key}`) | {_cell(get(start), share)} | {_cell(get(end), share)} |"
              for label, key, get, share in rows]
    said = ["", reading(history)]
    if misnamed:
        said.append("Some calls named arguments the tool does not take (or left one out): each failed before it ran, "
                    "and the model read the tool's parameters in the error.")
    if cut:
        said.append(f"Some calls ran into a limit of the recipe's tools section ({', '.join(cut)}): each "
                    "failed with an error naming the limit, which the model read as the result.")
    return lines + said + ["",
                    "Each figure is the mean over the logged steps named above (the windows the reward is judged by); "
                    "failed calls are weighted by the calls made at each step, and a step without calls had none to fail."]
