"""report.md's "Scoring" part: how often `task_score`'s scorers ran out of time or raised, with the limit they had.

    from grpokit.reporting.scoring import scoring_section
    lines = scoring_section(state["log_history"])   # [] for a run without task_score

`task_score` logs, at every step it scores, `task_score/limit_s` (its time limit per completion),
`task_score/timeouts` (completions past it, scored 0.0) and `task_score/scorer_errors` (completions whose answer made
the task's scorer raise, scored 0.0); a logged value is the mean over the scoring calls of the logging window
(one call a step at TRL's defaults).
"""

from __future__ import annotations

from grpokit.reporting.plots import series

LIMIT, TIMEOUTS, ERRORS = "task_score/limit_s", "task_score/timeouts", "task_score/scorer_errors"


def scoring_section(history: list[dict]) -> list[str]:
    """The part, or [] when the run logged no task scoring.

    >>> scoring_section([{"step": 1, LIMIT: 2.0, TIMEOUTS: 0.0, ERRORS: 0.0}])[3]
    '`task_score` scored each completion within 2 s (the problem built apart): none ran out of time; none made the scorer raise (1 logged step).'
    >>> scoring_section([{"step": 1, LIMIT: 2.0, TIMEOUTS: 3.0, ERRORS: 0.0}, {"step": 2, LIMIT: 2.0, TIMEOUTS: 0.0}])[3]
    '`task_score` scored each completion within 2 s (the problem built apart): 3 completions ran out of time, at 1 of 2 logged steps (at most 3 in a step); none made the scorer raise (2 logged steps).'
    """
    steps, limits = series(history, LIMIT)
    if not steps:
        return []
    said = [_said(history, TIMEOUTS, "ran out of time"), _said(history, ERRORS, "made the scorer raise")]
    line = (f"`task_score` scored each completion within {limits[-1]:g} s (the problem built apart): {said[0]}; "
            f"{said[1]} ({len(steps)} logged step{'s' * (len(steps) != 1)}).")
    lines = ["", "## Scoring", "", line]
    if any(series(history, key)[1] and max(series(history, key)[1]) > 0 for key in (TIMEOUTS, ERRORS)):
        lines += ["", "Each such completion scored 0.0. A scorer that runs out of time on right answers teaches nothing: "
                  "raise the reward's `timeout` argument (docs/troubleshooting.md, 'What runs caged')."]
    return lines


def _said(history: list[dict], key: str, what: str) -> str:
    steps, values = series(history, key)
    hit = [v for v in values if v > 0]
    if not hit:
        return f"none {what}"
    total = sum(hit)
    return (f"{total:g} completion{'s' * (total != 1)} {what}, at {len(hit)} of {len(steps)} logged steps "
            f"(at most {max(hit):g} in a step)")
