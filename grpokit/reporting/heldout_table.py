"""report.md's held-out table: the figures `--eval` left for a run, one row per scored model -- the base, the warm
start a run made, each scored checkpoint, the run itself -- and each change in pass@1, put down to what made it.

    from grpokit.reporting.heldout_table import eval_section
    lines = eval_section(Path("runs/arithmetic"))   # [] when nothing was scored
"""

from __future__ import annotations

from pathlib import Path

from grpokit.reporting import warm_start
from grpokit.reporting.messages import number
from grpokit.reporting.verdict import BEFORE_RUN, cut_short, heldout
from grpokit.rundir import STATE_FILE, read_state


def eval_section(run_dir: Path) -> list[str]:
    """Held-out figures from `--eval`, one row per scored model: the base (eval-base.json), the warm start a run made
    (eval-warm-start.json), each scored checkpoint (checkpoint-N/eval.json) and the run itself (eval.json); then each
    change, attributed to what made it; [] when there are none."""
    rows, unread = heldout(run_dir)
    if not rows and not unread:
        return []
    made = warm_start.read(run_dir)
    names = {"base model": "before (base model)", "final": "after (this run)"}
    if made:
        names = {"base model": f"base model (`{made.get('from_model', '?')}`)",
                 "warm start": f"warm start ({warm_start.origin(made)})", "final": "after (this run: GRPO from the warm start)"}
    lines = ["", "## Held-out eval", ""]
    if rows:
        lines += ["| model | pass@1 (greedy) | prompts passed | mean reward | file |", "|---|---|---|---|---|"]
        for r in rows:
            passed = f"{r['passed']}/{r['prompts']}" if r["passed"] is not None else "—"
            lines.append(f"| {names.get(r['label'], r['label'])} | {r['pass@1']:.3f} | {passed} | {number(r['reward'])} "
                         f"| `{r['file']}` |")
        lines += _changes(rows, made)
        whole = read_state(run_dir / STATE_FILE)[0]  # a checkpoint scored while its run was short, since finished
        done = whole["global_step"] if whole else None
        for r in rows:
            steps = r.get("steps") if isinstance(r.get("steps"), dict) else {}
            later = (r["label"] != "final" and done is not None and isinstance(steps.get("planned"), int)
                     and done >= steps["planned"])
            short = cut_short(steps) if r["label"] not in BEFORE_RUN and not later else None
            if short:
                which = "This run is short" if r["label"] == "final" else f"{r['label']} is of a run cut short"
                since = "the warm start is what" if made else "the base model is what"
                lines.append(f"\n**{which}**: {short}. Its change from {since} {r['steps']['trained']} "
                             f"{'GRPO ' if made else ''}steps did; train the rest (`--resume`) before judging the recipe.")
        if len({(r["prompts"], r["heldout"]) for r in rows}) > 1:
            lines.append("\nNote: these were scored on different held-out prompts; compare with care.")
        lines += ["", f"Measured by `--eval`: {rows[-1].get('measured') or ''}."]
        if sum(r["label"] not in BEFORE_RUN for r in rows) < 2:
            lines += ["", "Score a checkpoint too (`python launch.py --recipe ... --eval RUN_DIR/checkpoint-N`) to see "
                      "whether the run was better before its end; each one scored gets a row here."]
    if unread:
        lines += ["", "Not read (not `--eval` output): " + ", ".join(f"`{u}`" for u in unread)]
    return lines


def _changes(rows: list[dict], made: dict | None) -> list[str]:
    """The held-out table's change rows in pass@1, each attributed to what made it: without a warm start, the run's
    from the base; with one, the warm start's (from the base) and GRPO's (from the warm start), or both together where
    the warm start was not scored."""
    by = {r["label"]: r for r in rows}
    base, warm, final = by.get("base model"), by.get("warm start"), by.get("final")
    if not made:
        return [f"| change | {final['pass@1'] - base['pass@1']:+.3f} | | | |"] if base and final else []
    steps = (final or {}).get("steps") if isinstance((final or {}).get("steps"), dict) else {}
    grpo = f"{steps['trained']} GRPO steps" if isinstance(steps.get("trained"), int) else "GRPO"
    pairs = [(base, warm, f"change made by the warm start ({made.get('steps', '?')} supervised steps)"),
             (warm, final, f"change made by {grpo}, from the warm start")]
    if warm is None:
        pairs.append((base, final, f"change from the base model: the warm start and {grpo} together"))
    return [f"| {what} | {after['pass@1'] - before['pass@1']:+.3f} | | | |" for before, after, what in pairs
            if before and after]
