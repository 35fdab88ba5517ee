"""The console's last line on a finished run: report.md's verdict in one sentence, decided by the same rules
(grpokit.reporting.verdict), so the console and the report never disagree -- a task learnt early reads as learnt,
not as steps that "trained nothing".

    from grpokit.reporting.last_word import last_word
    say(last_word(trainer.state.log_history, tools_failed=failed_at_end(history)))
"""

from __future__ import annotations

from grpokit.reporting.plots import reward_names, series
from grpokit.reporting.verdict import (COLLAPSE_MIN_STEPS, MOSTLY_FAILED, THIN, collapse, dead_end, fall_from_best, never_varied,
                                       no_gradient_end, solved, windows, zero_spread)

WHERE = "report.md ('What the curves say')"


def last_word(history: list[dict], tools_failed: float | None = None) -> str | None:
    """`verdict: ...`, in the order report.md's advice takes (the tool, a reward that never varied, a task learnt, a
    collapse, a thin signal, else the reward's course); None when no reward was logged.

    >>> h = [{"step": s, "reward": min(s, 4) / 4, "frac_reward_zero_std": 1.0 if s >= 4 else 0.0} for s in range(1, 11)]
    >>> print(last_word(h))
    verdict: learnt. The mean reward rose from 0.5 (steps 1–3) to 1, the best of the run, and held there from step 4 of 10: the steps after it had nothing left to learn (every completion of a group scored alike), which is no fault; trainer.max_steps: 4 saves that time. More in report.md ('What the curves say')
    """
    if not series(history, "reward")[1]:
        return None
    if tools_failed is not None and tools_failed > MOSTLY_FAILED:
        return (f"verdict: {tools_failed:.0%} of the model's latest tool calls failed, so its reward came without "
                "the tool's answers: fix the tool first (report.md, 'Failed tool calls': each call and its error)")
    flat = never_varied(history)
    if flat and len(flat) == len(reward_names(history)):
        return (f"verdict: no reward ever told the completions apart, so nothing was learnt; {WHERE} says what to "
                "change")
    z, c = zero_spread(history), collapse(history)
    if z is not None and solved(history, c):
        first = _first(history)
        return (f"verdict: learnt. The mean reward rose{first} to {c['reward']:.3g}, the best of the run, and held "
                f"there from step {c['from_step']} of {dead_end(history, c)['of']}: the steps after it had nothing left "
                "to learn (every completion of a group scored alike), which is no fault; trainer.max_steps: "
                f"{c['from_step']} saves that time. More in {WHERE}")
    if z is not None and c is not None:
        return f"verdict: {no_gradient_end(history)}"
    if z is not None and z["tail_share"] >= THIN:
        return (f"verdict: a thin learning signal: {z['tail_share']:.0%} of the closing steps' groups scored alike "
                f"(no gradient from those); {WHERE} says what to change")
    course = _course(history)
    fell = fall_from_best(history)
    if fell is not None:
        course += (f"; it fell from its best ({fell['best'][2]:.3g}): keep the best checkpoint (report.md says how)")
    return f"verdict: {course}. More in {WHERE}"


def _means(history: list[dict]) -> list[tuple]:
    """The reward's window means, where the run logged enough steps for report.md to judge by them."""
    return windows(history) if len(series(history, "reward")[1]) >= 2 * COLLAPSE_MIN_STEPS else []


def _first(history: list[dict]) -> str:
    means = _means(history)
    return f" from {means[0][2]:.3g} ({_span(means[0])})" if len(means) > 1 else ""


def _span(mean: tuple) -> str:
    return f"step {mean[0]}" if mean[0] == mean[1] else f"steps {mean[0]}–{mean[1]}"


def _course(history: list[dict]) -> str:
    """The mean reward from its first window to its last (single logged steps swing)."""
    means = _means(history)
    if len(means) < 2:
        steps, values = series(history, "reward")
        return f"the mean reward went from {values[0]:.3g} (step {steps[0]}) to {values[-1]:.3g} (step {steps[-1]})"
    return (f"the mean reward went from {means[0][2]:.3g} ({_span(means[0])}) to {means[-1][2]:.3g} "
            f"({_span(means[-1])})")
