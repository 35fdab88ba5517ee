"""report.md's held-out table: the figures `--eval` left for a run, one column per scored model -- the base, the warm
start a run made, each scored checkpoint, the run itself -- and each change in pass@1, put down to what made it.

    from grpokit.reporting.heldout_table import eval_section
    lines = eval_section(Path("runs/arithmetic"))   # [] when nothing was scored
"""

from __future__ import annotations

from pathlib import Path

from grpokit.reporting import warm_start
from grpokit.reporting.messages import cell, inline_code, number, one_line
from grpokit.reporting.verdict import BEFORE_RUN, cut_short, heldout
from grpokit.checkpoints.rundir import STATE_FILE, read_state


def eval_section(run_dir: Path) -> list[str]:
    """Held-out figures from `--eval`, one column per scored model: the base (eval-base.json), the warm start a run
    made (eval-warm-start.json), each scored checkpoint (checkpoint-N/eval.json) and the run itself (eval.json); a
    row of each change in pass@1, put down to what made it; [] when there are none."""
    rows, unread = heldout(run_dir)
    if not rows and not unread:
        return []
    made = warm_start.read(run_dir)
    names = {"base model": "before (base model)", "final": "after (this run)"}
    if made:
        names = {"base model": f"base model ({cell(made.get('from_model', '?'))})",
                 "warm start": f"warm start ({warm_start.origin(made)})", "final": "after (this run: GRPO from the warm start)"}
    lines = ["", "## Held-out eval", ""]
    if rows:
        cells = {"pass@1 (greedy)": [f"{r['pass@1']:.3f}" for r in rows],
                 "prompts passed": [f"{r['passed']}/{r['prompts']}" if r["passed"] is not None else "—" for r in rows],
                 "mean reward": [number(r["reward"]) for r in rows],
                 "change in pass@1": [_change(r, rows, made) for r in rows],
                 "file": [cell(r["file"]) for r in rows]}
        lines += ["| | " + " | ".join(names.get(r["label"], one_line(r["label"]).replace("|", "\\|")) for r in rows) + " |",
                  "|---" * (len(rows) + 1) + "|"]
        lines += [f"| {what} | " + " | ".join(row) + " |" for what, row in cells.items()]
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
        lines += ["", f"Measured by `--eval`: {one_line(rows[-1].get('measured') or '')}."]
        if sum(r["label"] not in BEFORE_RUN for r in rows) < 2:
            lines += ["", "Score a checkpoint too (`python launch.py --recipe ... --eval RUN_DIR/checkpoint-N`) to see "
                      "whether the run was better before its end; each one scored gets a column here."]
    if unread:
        lines += ["", "Not read (not `--eval` output): " + ", ".join(inline_code(u) for u in unread)]
    return lines


def _change(r: dict, rows: list[dict], made: dict | None) -> str:
    """A model's change in pass@1 from the model it was made from, and what made it: the warm start's from the base
    (its supervised steps); a point of the run's from the model GRPO started from -- the warm start where it was
    scored, else the base (with a warm start, the two together); a dash for the base, or where that model was not scored."""
    by = {row["label"]: row for row in rows}
    if r["label"] == "base model":
        return "—"
    if r["label"] == "warm start":
        before, why = by.get("base model"), f"the warm start's {made.get('steps', '?') if made else '?'} supervised steps"
    else:
        steps = r.get("steps") if isinstance(r.get("steps"), dict) else {}
        trained = steps.get("trained") if isinstance(steps.get("trained"), int) else r.get("step")
        grpo = f"{trained} GRPO steps" if isinstance(trained, int) else "GRPO"
        before = by.get("warm start") or by.get("base model")
        why = (grpo if not made else f"{grpo}, from the warm start" if before is by.get("warm start") else
               f"the warm start and {grpo} together")
    return f"{r['pass@1'] - before['pass@1']:+.3f} ({why})" if before else "—"
