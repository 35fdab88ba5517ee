"""What a run's curves and held-out figures say, in sentences: whether the learning signal held (and from which
rewards: one that never varied is named), whether unanimous groups mean a task solved or a collapse, how much of the
run had no gradient, whether a reward fell from its best, and whether held-out pass@1 fell after a checkpoint.

    from grpokit.reporting.verdict import diagnosis, heldout
    lines = diagnosis(state["log_history"], heldout(Path("runs/arithmetic")))

Every judgement is made over a window of logged steps, never one step: with few prompts per step the share of
groups without spread (TRL's `frac_reward_zero_std`) and the mean reward swing from one step to the next, so the
last logged step alone can say "every group unanimous" of a run that still learns, or "no group unanimous" of one
where half the steps gave no gradient. A group whose rewards are all equal has advantage 0 for every completion
(GRPO's advantage is the reward minus its group's mean), so it contributes no policy gradient.

Held-out figures are the `eval.json` files `--eval` writes: `eval-base.json` (the base model) and `eval.json` in the
run directory, and `eval.json` in any `checkpoint-N/` that `--eval RUN/checkpoint-N` scored.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from grpokit import files
from grpokit.reporting.messages import inline_code
from grpokit.reporting.plots import never_varied, reward_names, series
from grpokit.checkpoints.rundir import BASE_EVAL_FILE, EVAL_FILE, WARM_EVAL_FILE

# A group "has no spread" when all its rewards are equal; a logged step "had no gradient" when (nearly) every group had
# none. The run "collapsed" when, from some step to the end, every group had none at MOSTLY_COLLAPSED of the logged
# steps (a lone step with some spread does not end it), the last one included, over at least COLLAPSE_MIN_STEPS steps
# and a tenth of the run.
ALL_GROUPS = 0.99
MOSTLY_COLLAPSED = 0.8
COLLAPSE_MIN_STEPS = 3
# The signal is "thin" when, over the closing window, half the groups or more had no spread on average: half the
# prompts (or more) taught nothing.
THIN = 0.5
# A reward "fell from its best" when its windowed mean ended at least this share of the run's reward range below its
# best windowed mean, and NOISE standard errors of a window mean below it: the best of many windows of a flat but noisy
# reward sits a couple of standard errors above the rest by chance alone. Measured on 80-step runs of 200 seeds each: a
# flat reward of 0, 0.5 or 1 per step is called fallen 4% of the time at 4 (18% at 3); a 0/1 reward whose rate rises
# to 0.8 at step 40 and sinks to 0.3 at step 80 is caught 37% of the time (72% at 3). A false "fell" is the worse error.
FELL = 0.2
NOISE = 4
# Held-out pass@1 "fell" when the last evaluated point is at least this far below the best one, and by 2 prompts or
# more: one prompt either way is noise on a held-out set of a few dozen.
HELDOUT_FELL = 0.05
CHECKPOINT = re.compile(r"checkpoint-(\d+)$")


def window(logged: int) -> int:
    """Logged steps one judgement averages: an eighth of the run, at least COLLAPSE_MIN_STEPS (and at most all).

    >>> window(80), window(10), window(2)
    (10, 3, 2)
    """
    return min(logged, max(COLLAPSE_MIN_STEPS, math.ceil(logged / 8)))


def _mean(values) -> float:
    return sum(values) / len(values)


def _span(first, last) -> str:
    return f"step {first}" if first == last else f"steps {first}–{last}"


def collapse(history: list[dict]) -> dict | None:
    """When the run ended with (nearly) every group's rewards equal for many logged steps: from which step, over how
    many, the mean reward there, and entropy first -> last (None when not logged). None when it did not collapse.

    >>> h = [{"step": s, "frac_reward_zero_std": 1.0 if s > 5 and s != 8 else 0.5, "reward": 1.0} for s in range(1, 11)]
    >>> c = collapse(h); c["from_step"], c["steps"], c["unanimous"]
    (6, 5, 4)
    """
    steps, zero = series(history, "frac_reward_zero_std")
    if not zero or zero[-1] < ALL_GROUPS:
        return None
    start = next(i for i, z in enumerate(zero) if z >= ALL_GROUPS
                 and sum(t >= ALL_GROUPS for t in zero[i:]) >= MOSTLY_COLLAPSED * (len(zero) - i))
    tail = len(zero) - start
    if tail < max(COLLAPSE_MIN_STEPS, math.ceil(0.1 * len(zero))):
        return None
    r_steps, rewards = series(history, "reward")
    late = [r for s, r in zip(r_steps, rewards) if s >= steps[start]]
    _, entropy = series(history, "entropy")
    return {"from_step": steps[start], "steps": tail, "unanimous": sum(z >= ALL_GROUPS for z in zero[start:]),
            "reward": _mean(late) if late else None,
            "near_best": bool(late) and _mean(late) >= max(rewards) - 0.05 * (max(rewards) - min(rewards)),
            "entropy": (entropy[0], entropy[-1]) if entropy else None}


def dead_end(history: list[dict], c: dict) -> dict:
    """The closing stretch of a run that `collapse` found, in the run's steps rather than logged points: a logged point
    stands for the steps since the one before it (TRL averages a logging interval's metrics), so with
    `logging_steps: 5` a collapse first logged at step 20 starts at step 16. `share`: its steps over the run's
    (the last logged step), the part of the training time that taught nothing.

    >>> h = [{"step": s, "frac_reward_zero_std": 1.0 if s >= 20 else 0.25} for s in range(5, 31, 5)]
    >>> dead_end(h, collapse(h))
    {'from_step': 16, 'steps': 15, 'of': 30, 'share': 0.5, 'logged': 3, 'unanimous': 3, 'mean': 1.0}
    """
    steps, zero = series(history, "frac_reward_zero_std")
    start = steps.index(c["from_step"])
    first = steps[start - 1] + 1 if start > 0 else 1
    return {"from_step": first, "steps": steps[-1] - first + 1, "of": steps[-1], "share": (steps[-1] - first + 1) / steps[-1],
            "logged": c["steps"], "unanimous": c["unanimous"], "mean": _mean(zero[start:])}


def _every(d: dict) -> str:
    """'at every one of 15 logged steps', or 'at 13 of 15 logged steps, 0.97 on average' (`dead_end`)."""
    if d["unanimous"] == d["logged"]:
        return f"at every one of {d['logged']} logged steps"
    return f"at {d['unanimous']} of {d['logged']} logged steps, {d['mean']:.2f} on average"


def _dead_end(d: dict, alike: str = "scored alike") -> str:
    """'from step 16 of 30 on, every group's completions scored alike (`frac_reward_zero_std`, the console's zero-std
    groups, 1.00 at every one of 15 logged steps): the last 15 steps (50% of the run) gave no gradient' (`dead_end`)."""
    few = "" if d["unanimous"] == d["logged"] else " (almost)"
    return (f"from step {d['from_step']} of {d['of']} on, every group's completions {alike} (`frac_reward_zero_std`, "
            f"the console's zero-std groups, 1.00 {_every(d)}): the last {d['steps']} steps ({d['share']:.0%} of the run) "
            f"gave{few} no gradient")


def no_gradient_end(history: list[dict]) -> str | None:
    """One line for the console at the end of a run whose closing stretch gave no gradient (`collapse`), pointing at
    report.md for why and what to change; None otherwise.

    >>> print(no_gradient_end([{"step": s, "frac_reward_zero_std": 1.0 if s > 20 else 0.5} for s in range(1, 31)]))
    no gradient from step 21 of 30 on: every group's completions scored alike (zero-std groups 1.00 at every one of 10 logged steps), so the last 10 steps (33% of the run) trained nothing; report.md ('What the curves say') says why and what to change
    """
    c = collapse(history)
    if c is None:
        return None
    d = dead_end(history, c)
    return (f"no gradient from step {d['from_step']} of {d['of']} on: every group's completions scored alike (zero-std "
            f"groups 1.00 {_every(d)}), so the last {d['steps']} steps ({d['share']:.0%} of the run) trained "
            f"{'nothing' if d['unanimous'] == d['logged'] else 'almost nothing'}; report.md ('What the curves say') "
            "says why and what to change")


def solved(history: list[dict], c: dict | None) -> bool:
    """A collapse that is the task learnt: from the collapse step on, the mean reward and every logged reward function
    stayed at their best (within 5% of the run's range), after rising to it. Unanimous groups there are all right,
    not all wrong; a reward that never varied proves nothing, so a run with one is never called solved."""
    if c is None or not c["near_best"] or never_varied(history):
        return False
    for key in ["reward"] + [f"rewards/{n}/mean" for n in reward_names(history)]:
        steps, values = series(history, key)
        tail = [v for s, v in zip(steps, values) if s >= c["from_step"]]
        low, top = min(values, default=0.0), max(values, default=0.0)
        if key == "reward" and (not tail or top - low <= 0 or values[0] >= top - 0.05 * (top - low)):
            return False  # nothing rose: a run that started at its best learnt nothing
        if tail and min(tail) < top - 0.05 * (top - low):
            return False
    return True


def zero_spread(history: list[dict]) -> dict | None:
    """How much of the run had no gradient, from `frac_reward_zero_std`; None when it was not logged.

    `share`: the mean share of groups without spread over the whole run; `dead`: logged steps where every group had
    none; `tail_*`: the same over the closing `window`; `last`: (step, share) of the last logged step.

    >>> z = zero_spread([{"step": s, "frac_reward_zero_std": (0.0, 1.0)[s % 2]} for s in range(1, 9)])
    >>> z["dead"], z["logged"], z["share"], z["tail"], z["tail_dead"]
    (4, 8, 0.5, (6, 8), 1)
    """
    steps, zero = series(history, "frac_reward_zero_std")
    if not zero:
        return None
    w = window(len(zero))
    return {"logged": len(zero), "dead": sum(z >= ALL_GROUPS for z in zero), "share": _mean(zero),
            "tail": (steps[-w], steps[-1]), "tail_steps": w, "tail_share": _mean(zero[-w:]),
            "tail_dead": sum(z >= ALL_GROUPS for z in zero[-w:]), "last": (steps[-1], zero[-1])}


def windows(history: list[dict], key: str = "reward") -> list[tuple]:
    """Means of a logged metric over each run of `window` consecutive logged steps: (first step, last step, mean).

    >>> windows([{"step": s, "reward": s % 2} for s in range(1, 5)])
    [(1, 3, 0.667), (2, 4, 0.333)]
    """
    steps, values = series(history, key)
    w = window(len(values))
    return [(steps[i - w + 1], steps[i], round(_mean(values[i - w + 1 : i + 1]), 3)) for i in range(w - 1, len(values))]


def fall_from_best(history: list[dict], key: str = "reward") -> dict | None:
    """When a logged reward's windowed mean ended well below its best windowed mean (by FELL of the run's range):
    {"best": (first step, last step, mean), "end": (...), "window": logged steps per mean}. None otherwise.

    >>> h = [{"step": s, "reward": min(s, 20 - s) / 10} for s in range(1, 20)]
    >>> f = fall_from_best(h); f["best"], f["end"]
    ((9, 11, 0.933), (17, 19, 0.2))
    """
    _, values = series(history, key)
    if len(values) < 2 * COLLAPSE_MIN_STEPS:
        return None
    means, w = windows(history, key), window(len(values))
    best, end = max(means, key=lambda m: m[2]), means[-1]
    # step-to-step noise from successive differences (var(x[i+1] - x[i]) = 2 sigma^2 for independent noise), so a
    # trend does not count as noise
    sigma = math.sqrt(_mean([(b - a) ** 2 for a, b in zip(values, values[1:])]) / 2)
    if best[2] - end[2] <= 0 or best[2] - end[2] < max(FELL * (max(values) - min(values)), NOISE * sigma / math.sqrt(w)):
        return None
    return {"best": best, "end": end, "window": w}


BEFORE_RUN = ("base model", "warm start")  # held-out rows of models GRPO started from, not points of the run


def heldout(run_dir: str | Path) -> tuple[list[dict], list[str]]:
    """The held-out figures `--eval` left for a run, in order: the base model, its warm start (when it made one), each
    scored checkpoint by step, the run itself ("final"); the first two are models before the run (`BEFORE_RUN`). Each row: {"label", "step", "file", "pass@1", "passed", "prompts", "heldout", "reward"}.
    Also the files found but not readable as `--eval` output, so the report can say it skipped them.
    """
    run_dir = Path(run_dir)
    found = [("base model", None, run_dir / BASE_EVAL_FILE), ("warm start", None, run_dir / WARM_EVAL_FILE)]
    checkpoints = [(int(m.group(1)), p) for p in run_dir.glob("checkpoint-*") if (m := CHECKPOINT.search(p.name))]
    found += [(p.name, step, p / EVAL_FILE) for step, p in sorted(checkpoints)]
    found.append(("final", None, run_dir / EVAL_FILE))
    rows, unread = [], []
    for label, step, path in found:
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(run_dir).as_posix()
        try:
            data, _ = files.try_json(path, dict)
            greedy = data["greedy"]
            rows.append({"label": label, "step": step, "file": rel, "pass@1": float(greedy["pass@1"]),
                         "passed": greedy.get("passed"), "prompts": data.get("prompts"), "heldout": data.get("heldout"),
                         "reward": (greedy.get("rewards") or {}).get("reward"), "measured": data.get("measured"),
                         "steps": data.get("steps")})
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            unread.append(rel)
    return rows, unread


def cut_short(steps) -> str | None:
    """The warning for figures of a model whose run trained fewer steps than it was to (`evaluate.run_steps`); None for
    a finished run and for a checkpoint of one (a point of the run, named by its step).

    >>> cut_short({"trained": 5, "planned": 30, "run_finished": False})
    'the run trained 5 of its 30 steps: these are the figures of a run cut short, not of the recipe'
    >>> cut_short({"trained": 10, "planned": 30, "run_finished": True}) is None
    True
    >>> cut_short({"trained": 3, "planned": 30, "set": 3})[:41]
    'the run trained all 3 steps it was set to'
    """
    if not isinstance(steps, dict) or steps.get("run_finished"):
        return None
    trained, planned = steps.get("trained"), steps.get("planned")
    if not isinstance(trained, int) or not isinstance(planned, int) or trained >= planned:
        return None
    own = steps.get("set")
    if isinstance(own, int) and trained >= own:  # it finished what it was set to: fewer steps than the recipe's, on purpose
        return (f"the run trained all {trained} steps it was set to (trainer.max_steps: {own}), where the recipe asks for "
                f"{planned}: these are the figures of a shortened run, not of the recipe")
    return f"the run trained {trained} of its {planned} steps: these are the figures of a run cut short, not of the recipe"


def heldout_fall(rows: list[dict]) -> dict | None:
    """When held-out pass@1 of the last evaluated point of the run is well below the best one before it:
    {"best": row, "last": row}. The base model and the warm start are not points of the run.

    >>> rows = [{"label": "checkpoint-40", "step": 40, "pass@1": 0.458, "prompts": 48},
    ...         {"label": "final", "step": None, "pass@1": 0.125, "prompts": 48}]
    >>> heldout_fall(rows)["best"]["label"]
    'checkpoint-40'
    """
    trained = [r for r in rows if r["label"] not in BEFORE_RUN]
    if len(trained) < 2:
        return None
    best, last = max(trained, key=lambda r: r["pass@1"]), trained[-1]
    drop = best["pass@1"] - last["pass@1"]
    prompts = last.get("prompts") if isinstance(last.get("prompts"), int) else 0
    if best is last or drop < HELDOUT_FELL or (prompts and drop * prompts < 2 - 1e-9):
        return None
    return {"best": best, "last": last}


def heldout_lines(rows: list[dict], run_dir: str | Path | None = None) -> list[str]:
    """The sentence a user must read first when held-out pass@1 fell after a checkpoint, and what to use instead."""
    fell = heldout_fall(rows)
    if fell is None:
        return []
    best, last = fell["best"], fell["last"]
    after = f"step {best['step']}" if best["step"] is not None else best["label"]
    where = f" ({inline_code(Path(run_dir, best['label']).as_posix())})" if run_dir is not None and best["step"] is not None else ""
    text = (f"**Held-out pass@1 fell from {best['pass@1']:.3f} ({best['label']}) to {last['pass@1']:.3f} "
            f"({last['label']})**: the run overfit or collapsed after {after}; use {best['label']}{where}"
            + (", not the final model." if last["label"] == "final" else f", not {last['label']}."))
    base = next((r for r in rows if r["label"] == "base model"), None)
    if base is not None and best["pass@1"] <= base["pass@1"]:
        text += f" No evaluated point beat the base model ({base['pass@1']:.3f}), though."
    if best.get("heldout") != last.get("heldout") or best.get("prompts") != last.get("prompts"):
        text += " (The two were scored on different held-out prompts; compare with care.)"
    return [text]


def _entropy_fall(c: dict) -> str:
    """' Entropy fell from 1.83 to 0.05 nats per token: ...' for a collapse or a solved task (`collapse`), or ''."""
    if not c["entropy"]:
        return ""
    first, last = c["entropy"]
    text = f" Entropy fell from {first:.2f} to {last:.2f} nats per token"
    return text + (": the policy writes (nearly) the same completion every time." if last < 0.1 * first else ".")


def _no_gradient(z: dict) -> str:
    if z["dead"] == 0:
        return (f"No logged step had every group without spread; over the whole run {z['share']:.0%} of the groups "
                "had none on average.")
    return (f"At {z['dead']} of {z['logged']} logged steps ({z['dead'] / z['logged']:.0%} of the run) every group's "
            "completions got the same reward (`frac_reward_zero_std` = 1): those steps gave no gradient at all. Over "
            f"the whole run {z['share']:.0%} of the groups had no spread.")


def _names(names) -> str:
    names = [inline_code(n) for n in names]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _constant(history: list[dict]) -> list[str]:
    """A paragraph naming each reward that never varied, and where the run's signal came from instead."""
    flat = never_varied(history)
    if not flat:
        return []
    moving = [n for n in reward_names(history) if n not in flat]
    logged = len(series(history, f"rewards/{next(iter(flat))}/mean")[1])
    values = "; ".join(f"{inline_code(n)} {_number(v)}" for n, v in flat.items())
    text = (f"**{'Reward' if len(flat) == 1 else 'Rewards'} {_names(flat)} never varied**: "
            f"{'it was' if len(flat) == 1 else 'they were'} the same at every one of {logged} logged steps ({values}), "
            "for every completion, so no completion scored better than another on "
            f"{'it' if len(flat) == 1 else 'them'} and {'it' if len(flat) == 1 else 'they'} gave no gradient.")
    text += (f" All of the learning signal came from {_names(moving)}." if moving else
             " No reward told completions apart: the run had no learning signal from its first step. It did not "
             "collapse; it never started.")
    return [text]


def fix_constant(history: list[dict]) -> str | None:
    """What to do about rewards that never varied, naming them; None when every reward varied."""
    flat = never_varied(history)
    if not flat:
        return None
    return (f"What to change: a reward that scores every completion alike teaches nothing. Read the sampled completions "
            f"below against what {_names(flat)} pays for. If no completion comes close, the task is out of the model's "
            "reach as set up: give partial credit (a shaped reward), easier prompts, more room to answer "
            "(`trainer.max_completion_length`, when completions are truncated), a stronger model, or check the reward's "
            "`args` and the data's gold column (`dataset.answer_column`). If every completion earns it already, it adds "
            "nothing to learn from and can go.")


def _signal(history: list[dict], z: dict) -> list[str]:
    """The solved, collapse, thin-signal or held verdict, with how much of the run had no gradient: one paragraph
    each. A run whose rewards never varied is said by `_constant` instead."""
    flat = never_varied(history)
    if flat and len(flat) == len(reward_names(history)):
        return [_no_gradient(z)]
    c = collapse(history)
    tail = (f"over the last {z['tail_steps']} logged steps ({_span(*z['tail'])}) {z['tail_share']:.0%} of the groups "
            "on average had rewards without spread")
    if solved(history, c):
        first = windows(history)[0] if len(series(history, "reward")[1]) >= 2 * COLLAPSE_MIN_STEPS else None
        rose = f" from {_number(first[2])} ({_span(first[0], first[1])})" if first else ""
        d = dead_end(history, c)
        text = (f"**The task is solved from step {d['from_step']} on**: the mean reward rose{rose} to "
                f"{_number(c['reward'])}, the best of the run, and held there; {_dead_end(d, 'earned the same reward')}. That is a task learnt, not a collapse "
                "(a collapse leaves the groups unanimous below the run's best): with no spread left there is nothing "
                "to learn from, so those steps trained nothing.")
        return [text + _entropy_fall(c), _no_gradient(z)]
    if c is not None:
        d = dead_end(history, c)
        text = (f"**The run collapsed at step {d['from_step']}: {_dead_end(d)}.** In a group that scores alike "
                "every advantage is 0 (a reward minus its group's mean), and the policy gradient with it.")
        lines = [text + _entropy_fall(c)]
        if c["near_best"]:  # within 5% of the run's reward range from its best
            lines.append(f"The mean reward there was {_number(c['reward'])}, at the top of the run's range: the reward "
                         "cannot tell the completions apart any more, so there is nothing left to learn from it.")
        elif c["reward"] is not None:
            lines.append(f"The mean reward there was {_number(c['reward'])}: the groups are unanimous, right or wrong.")
        return lines + [_no_gradient(z)]
    if z["tail_share"] >= THIN:
        lines = [f"**The learning signal was thin**: {tail} (those give no gradient), and at {z['tail_dead']} of "
                 f"those {z['tail_steps']} steps every group had none. " + _no_gradient(z)]
    elif flat:  # the spread came from the other rewards alone: not the signal a reader means by "held"
        moving = [n for n in reward_names(history) if n not in flat]
        lines = [f"**The learning signal came only from {_names(moving)}**: {tail} (those give no gradient; the others "
                 "do). " + _no_gradient(z)]
    else:
        lines = [f"The learning signal held: {tail} (those give no gradient; the others do). " + _no_gradient(z)]
    step, share = z["last"]
    if share >= ALL_GROUPS:
        lines += [f"The last logged step (step {step}) had no spread in any group; one step among "
                  f"{z['logged']} is not a collapse, and the window above is the verdict."]
    return lines


def _falls(history: list[dict]) -> list[str]:
    """A paragraph per logged reward that fell from its best; a reward function's is left out when it says exactly
    what the total's says (a recipe with one reward)."""
    lines, total = [], fall_from_best(history, "reward")
    for key, name in [("reward", "The mean reward")] + [(f"rewards/{n}/mean", f"Reward {inline_code(n)}") for n in reward_names(history)]:
        f = fall_from_best(history, key)
        if f is None or (key != "reward" and total is not None and (f["best"], f["end"]) == (total["best"], total["end"])):
            continue
        (b0, b1, best), (e0, e1, end) = f["best"], f["end"]
        lines += [f"**{name} fell from its best**: averaged over {f['window']} logged steps it peaked at "
                  f"{_number(best)} ({_span(b0, b1)}) and ended at {_number(end)} ({_span(e0, e1)}), "
                  f"{_number(best - end)} lower."]
    return lines


def _course(history: list[dict]) -> list[str]:
    """The mean reward's first and closing window means: single logged steps can swing from 0 to 1 and back."""
    means = windows(history) if len(series(history, "reward")[1]) >= 2 * COLLAPSE_MIN_STEPS else []
    if not means:
        return []
    (f0, f1, first), (e0, e1, end) = means[0], means[-1]
    return [f"Averaged over {window(len(series(history, 'reward')[1]))} logged steps, the mean reward went from "
            f"{_number(first)} ({_span(f0, f1)}) to {_number(end)} ({_span(e0, e1)})."]


def _number(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    return f"{value:.3g}" if abs(value) < 1e6 else f"{value:.4g}"


# "Most calls failed": more than half of them, so the reward was earned (or not) mostly without the tool's answers.
MOSTLY_FAILED = 0.5
FIX_COLLAPSE = ("What to change, to keep a group's completions apart for longer: a higher `trainer.temperature` "
                "(sampling spread); a larger `trainer.num_generations` (more completions per prompt, so one that differs "
                "is likelier; keep the generation batch, `trainer.per_device_train_batch_size` x "
                "`trainer.gradient_accumulation_steps`, divisible by it); a smaller `trainer.learning_rate`, so the "
                "policy sharpens more slowly (entropy falling towards 0 is that sharpening); DAPO's dynamic sampling "
                "(`sampling.dynamic: true`), which replaces groups without spread by fresh prompts. Or, when the goal "
                "was reached, fewer steps (`trainer.max_steps`, about the step above); or a harder task or "
                "finer-grained reward.")
FIX_THIN = ("What to change: more prompts per step, so fewer steps go without any gradient (each prompt's group is one "
            "chance of spread: a larger `trainer.per_device_train_batch_size` or `trainer.gradient_accumulation_steps` "
            "at the same `trainer.num_generations`); DAPO's dynamic sampling (`sampling.dynamic: true`), which replaces "
            "groups without spread by fresh prompts; a higher `trainer.temperature`.")
FIX_SOLVED = ("What to change: nothing is wrong. The steps after step {step} trained nothing: `trainer.max_steps: {step}` "
              "saves that time; for more to learn, a harder task (harder prompts, a stricter reward).")
FIX_FALL = ("To keep the best model: save checkpoints often enough to hold it (`trainer.save_steps`), score them with "
            "`python launch.py --recipe ... --eval RUN_DIR/checkpoint-N`, and stop near it (`trainer.max_steps`); a "
            "lower `trainer.learning_rate` makes a fall less likely.")


FIX_TOOL = ("What to change: the tool, first. {failed:.0%} of the model's tool calls failed (those of the run's end, "
            "or every call where the end made none), so its reward "
            "came without the tool's answers, and more prompts per step or dynamic sampling cannot change that. Read "
            "the failed calls of each step and the error the model read in \"Failed tool calls\" below: 'Tool X not "
            "found.' names a tool the model was shown (its prompt, `dataset.few_shot`) that the recipe does not give; "
            "an error of the tool's own is its code (the exception's type and line follow it) or its arguments' types; "
            "an error naming a `tools.` limit is that limit.")


def diagnosis(history: list[dict], evals: list[dict] | None = None, run_dir: str | Path | None = None,
              tools_failed: float | None = None) -> list[str]:
    """What the curves (and held-out figures, when `--eval` scored the run) mean, in sentences: a held-out drop first,
    then the learning signal judged over a window, how much of the run had no gradient, a reward that fell from its
    best, and what to change. `tools_failed`: failed tool calls over calls at the end of a run given tools
    (`tool_calls.failed_at_end`); past `MOSTLY_FAILED` the tool is what to change, whatever the signal did. [] when
    nothing was logged to judge."""
    z = zero_spread(history)
    falls = _falls(history)
    flat = never_varied(history)
    silent = bool(flat) and len(flat) == len(reward_names(history))  # no reward ever told completions apart
    paragraphs = heldout_lines(evals or [], run_dir) + _constant(history) + (_signal(history, z) if z is not None else [])
    paragraphs += ([] if fall_from_best(history) else _course(history)) + falls
    broken_tool = tools_failed is not None and tools_failed > MOSTLY_FAILED
    if broken_tool:  # the reward's and the signal's own fixes cannot help a reward the tool never answered
        paragraphs.append(FIX_TOOL.format(failed=tools_failed))
    elif flat:
        paragraphs.append(fix_constant(history))
    if broken_tool:
        pass
    elif silent:
        pass  # not a collapse nor a thin signal: nothing ever varied, and fix_constant said what to do
    elif z is not None and solved(history, collapse(history)):
        paragraphs.append(FIX_SOLVED.format(step=collapse(history)["from_step"]))
    elif z is not None and collapse(history) is not None:
        paragraphs.append(FIX_COLLAPSE)
    elif z is not None and z["tail_share"] >= THIN:
        paragraphs.append(FIX_THIN)
    if falls or heldout_fall(evals or []):
        paragraphs.append(FIX_FALL)
    return [line for p in paragraphs for line in ("", p)][1:]
