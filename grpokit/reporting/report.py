"""A short `report.md` for a GRPO run: what ran, how it ended (and whether it collapsed), its curves, and
completions from early and late in the run, side by side.

    from grpokit.reporting.report import write_report, completions_from_logs
    write_report("runs/smoke", recipe_name="smoke", explain_lines=lines,
                 completions=completions_from_logs(trl_compat.last_generation_logs(trainer)))

Completions come from the caller (TRL keeps the last generation batch, `trl_compat.last_generation_logs`) or, when
the caller passes none, from the run folder: first `report_record.json`, which a run stores there as it finishes
(`store_record`), so a report drawn again later (`--plot`, `--eval`) shows what the run showed; else what TRL 1.16
writes with `log_completions=True`: `<output_dir>/completions/completions_<step:05d>.parquet`, one row per completion
with columns `step, prompt, completion, <reward name>..., <extra column>..., advantage`.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from pathlib import Path

from grpokit import files
from grpokit.reporting.failed_calls import failed_calls_section
from grpokit.reporting.memory_use import memory_section
from grpokit.reporting.messages import cell, fenced, inline_code, number as _number, one_line, plain, text
from grpokit.reporting.own_passes import own_passes_section
from grpokit.reporting.plots import flat_reasons, load_log_history, plot_run, reward_names, series
from grpokit.reporting.scoring import scoring_section
from grpokit.reporting.tool_calls import failed_at_end, tool_use_section
from grpokit.reporting.warm_start import section as warm_start_section
from grpokit.reporting.heldout_table import eval_section
from grpokit.reporting.verdict import diagnosis, heldout

REPORT_FILE = "report.md"
COMPLETIONS_DIR = "completions"  # where TRL 1.16 writes log_completions parquet files
RECORD_FILE = "report_record.json"  # what a run's report shows beyond trainer_state.json, kept with the run
TEXT_LIMIT = 400  # characters of a prompt or completion shown; the report is a glance, not a dump
# (log key, label) for the final-figures table, in reading order; reward functions are inserted after "reward".
FIGURES = (
    ("reward", "reward (total)"),
    ("reward_std", "reward std"),
    ("frac_reward_zero_std", "share of groups with zero reward std"),
    ("completions/mean_length", "mean completion length (tokens)"),
    ("completions/clipped_ratio", "truncated completions"),
    ("kl", "KL to reference"),
    ("entropy", "entropy"),
    ("clip_ratio/region_mean", "clip ratio (region)"),
    ("learning_rate", "learning rate"),
    ("loss", "loss"),
)




def completions_from_logs(logs: dict, step: int | None = None) -> list[dict]:
    """TRL's `GRPOTrainer._logs` (the last generation batch) as rows for `write_report`.

    Each row: {"prompt", "completion", "rewards": {name: value}, "advantage", "step"}.
    """
    prompts, completions = list(logs.get("prompt", [])), list(logs.get("completion", []))
    rewards = {name: list(values) for name, values in logs.get("rewards", {}).items()}
    advantages = list(logs.get("advantages", []))
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        rows.append(
            {
                "prompt": prompt,
                "completion": completion,
                "rewards": {name: values[i] for name, values in rewards.items() if i < len(values)},
                "advantage": advantages[i] if i < len(advantages) else None,
                "step": step,
            }
        )
    return rows


def keep_first_completions(trainer):
    """Keep the first logged step's generation batch (TRL keeps only the latest), so report.md can show early next
    to late completions. Returns the installed callback; its `rows` are `completions_from_logs` rows.

    >>> kept = keep_first_completions(trainer)  # doctest: +SKIP
    >>> trainer.train(); run_completions(trainer)  # doctest: +SKIP
    """
    from transformers import TrainerCallback

    from grpokit import trl_compat

    class FirstCompletions(TrainerCallback):
        def __init__(self):
            self.rows: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not self.rows and logs and "reward" in logs:  # the first training log, not the end-of-run summary
                batch = trl_compat.last_generation_logs(trainer)
                if batch:
                    self.rows = completions_from_logs(batch, step=state.global_step)

    callback = FirstCompletions()
    trainer.add_callback(callback)
    _first_completions[trainer] = callback
    return callback


# trainer -> the callback keep_first_completions gave it (weak: it goes with the trainer)
_first_completions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_completions(trainer) -> list[dict]:
    """The first logged step's completions (when `keep_first_completions` ran) and the last generation batch's."""
    from grpokit import trl_compat

    kept = _first_completions.get(trainer)
    first = kept.rows if kept is not None else []
    batch = trl_compat.last_generation_logs(trainer)
    last = completions_from_logs(batch, step=trainer.state.global_step) if batch else []
    if first and last and first[0]["step"] == last[0]["step"]:
        return last
    return first + last


def store_record(run_dir: str | Path, rows: list[dict], resumed_at: int | None = None,
                 recipe_name: str | None = None, failed_calls: list[dict] = ()) -> list[dict]:
    """Keep with the run what its report shows beyond trainer_state.json, in `<run_dir>/report_record.json`: the
    sampled completions (`rows`), the step the finishing session resumed at (None: it started at step 0) and the name of
    the recipe the run was made from (a later report reads the run's saved `recipe.yaml`, whose own name is "recipe"),
    and the failed tool calls of each logged step (`failed_calls.run_failed_calls`). Every later report of the run
    (`--plot`, `--eval`) shows them too. Returns the completions kept.

    A resumed run adds its own completions: the earlier sessions' rows from before its first step stay, so "early"
    is still the run's first logged step. Its failed calls follow the earlier sessions' up to the step it resumed at
    (what they logged past it, this session trained again).
    """
    earlier = read_record(run_dir)
    before = earlier["completions"]
    kept = [r for r in before if isinstance(r.get("step"), int)
            and all(isinstance(n.get("step"), int) and r["step"] < n["step"] for n in rows)] if rows else before
    merged = kept + [plain(dict(r)) for r in rows]
    calls = [c for c in earlier["failed_calls"] if c["step"] <= (resumed_at or 0)] + [plain(dict(c)) for c in failed_calls]
    record = {"completions": merged, "resumed_at": resumed_at, "recipe_name": recipe_name or earlier["recipe_name"],
              "failed_calls": calls}
    files.write_text(Path(run_dir) / RECORD_FILE, json.dumps(record, indent=1) + "\n", key="--plot", root=Path(run_dir))
    return merged


def read_record(run_dir: str | Path) -> dict:
    """What `store_record` kept with the run: {"completions": rows, "resumed_at": step or None, "recipe_name": name or
    None, "failed_calls": rows}; empty when the run has no record (or a file there that is not one)."""
    data, _ = files.try_json(Path(run_dir) / RECORD_FILE, dict)
    data = data or {}
    rows = data.get("completions") if isinstance(data.get("completions"), list) else []
    resumed = data.get("resumed_at")
    return {"completions": [r for r in rows if isinstance(r, dict) and "completion" in r
                            and isinstance(r.get("rewards", {}), dict)],
            "resumed_at": resumed if isinstance(resumed, int) and not isinstance(resumed, bool) and resumed > 0 else None,
            "recipe_name": data["recipe_name"] if isinstance(data.get("recipe_name"), str) and data["recipe_name"] else None,
            "failed_calls": [c for c in data.get("failed_calls") or [] if isinstance(c, dict) and isinstance(c.get("step"), int)
                             and all(isinstance(c.get(k), (str, type(None))) for k in ("call", "read", "author"))]
            if isinstance(data.get("failed_calls"), list) else []}


def completions_from_disk(run_dir: str | Path, names: list[str] | None = None) -> list[dict]:
    """Rows of the first and the latest `completions/completions_*.parquet` TRL wrote, or [] when there is none.

    `names` are the reward functions; columns not named there (dataset extras) are left out. Without
    `names`, every numeric column other than `step` and `advantage` counts as a reward.
    """
    files = sorted(Path(run_dir, COMPLETIONS_DIR).glob("completions_*.parquet"))
    if not files:
        return []
    import pandas as pd  # a dependency of datasets; only needed when TRL wrote parquet

    frame = pd.concat([pd.read_parquet(f) for f in dict.fromkeys([files[0], files[-1]])], ignore_index=True)
    fixed = {"step", "prompt", "completion", "advantage"}
    if names is None:
        names = [c for c in frame.columns if c not in fixed and pd.api.types.is_numeric_dtype(frame[c])]
    rows = []
    for record in frame.to_dict("records"):
        rows.append(
            {
                "prompt": record.get("prompt"),
                "completion": record.get("completion"),
                "rewards": {n: record[n] for n in names if n in record},
                "advantage": record.get("advantage"),
                "step": record.get("step"),
            }
        )
    return rows


def _total(row: dict) -> float:
    """Sort key: the row's `reward` if given, else the unweighted sum of its scored rewards."""
    if isinstance(row.get("reward"), (int, float)):
        return float(row["reward"])
    scored = [float(v) for v in (row.get("rewards") or {}).values() if v is not None and math.isfinite(float(v))]
    return sum(scored) if scored else -math.inf


def pick_completions(rows: list[dict], k: int = 4) -> list[dict]:
    """`k` rows spread over the reward range: the best, the worst and evenly spaced ones between."""
    ranked = sorted(rows, key=_total, reverse=True)
    if len(ranked) <= k:
        return ranked
    return [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)] if k > 1 else ranked[:1]


def _figures(state: dict) -> list[str]:
    history = state["log_history"]
    per_reward = [(f"rewards/{n}/mean", f"reward {cell(n)}") for n in reward_names(history)]
    keys = [FIGURES[0], *per_reward, *FIGURES[1:]]
    lines = ["| metric | first logged | last logged | change |", "|---|---:|---:|---:|"]
    for key, label in keys:
        steps, values = series(history, key)
        if not values:
            continue
        change = values[-1] - values[0]
        lines.append(
            f"| {label} ({cell(key)}) | {_number(values[0])} (step {steps[0]}) | {_number(values[-1])} "
            f"(step {steps[-1]}) | {'+' if change >= 0 else ''}{_number(change)} |"
        )
    return lines if len(lines) > 2 else ["No training metrics were logged."]


def _summary(state: dict, resumed_at: int | None = None) -> list[str]:
    """Steps done (of planned), logged points, time, epochs. `resumed_at`: the step the last session resumed at; the
    trainer's runtime is that session's alone, and the steps it trained are said apart."""
    history = state["log_history"]
    done = state.get("global_step")
    planned = state.get("max_steps")
    logged = len(series(history, "loss")[0]) or len(series(history, "reward")[0])
    parts = [f"- Steps: {done if done is not None else '?'}" + (f" of {planned}" if planned else "")]
    session = ""
    if resumed_at is not None and isinstance(done, int) and done > resumed_at:
        session = f"steps {resumed_at + 1}–{done}" if done - resumed_at > 1 else f"step {done}"
        parts[0] += (f" (resumed at step {resumed_at}: the last session trained {done - resumed_at} of them, {session}; "
                     f"the {resumed_at} before it ran in an earlier session)")
    parts.append(f"- Logged points: {logged}")
    runtime = next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)
    if runtime is not None:
        parts.append(f"- Training time: {runtime:.1f} s" + (f" (the last session's, {session})" if session else ""))
    epoch = state.get("epoch")
    if epoch is not None:
        parts.append(f"- Epochs: {epoch:.3g}")
    return parts


def _stage(rows: list[dict], per: int, number: int) -> tuple[list[str], int]:
    """Up to `per` distinct completions of one step, best reward first, numbered from `number`."""
    distinct: dict[str, dict] = {}
    for row in rows:
        distinct.setdefault(text(row.get("completion") or ""), row)
    out = []
    if len(distinct) == 1 and len(rows) > 1:
        out += [f"All {len(rows)} completions at this step are the same text.", ""]
    for row in pick_completions(list(distinct.values()), per):
        facts = [f"reward {_number(row['reward'])}"] if row.get("reward") is not None else []
        facts += [f"{name} {_number(v)}" for name, v in (row.get("rewards") or {}).items()]
        if row.get("advantage") is not None:
            facts.append(f"advantage {float(row['advantage']):+.3f}")
        out += [f"#### {number}. " + " · ".join(facts), "", "Prompt:", "", fenced(text(row.get("prompt") or ""), TEXT_LIMIT),
                "", "Completion:", "", fenced(text(row.get("completion") or ""), TEXT_LIMIT), ""]
        number += 1
    return out, number


def _completion_section(rows: list[dict], k: int) -> list[str]:
    if not rows:
        return [
            "No completions recorded. Set `log_completions: true` in the recipe's `trainer:` section "
            f"to have TRL write them to `{COMPLETIONS_DIR}/`."
        ]
    by_step: dict = {}
    for row in rows:
        by_step.setdefault(row.get("step"), []).append(row)
    known = sorted(s for s in by_step if s is not None)
    if len(known) >= 2:
        stages = [("Early", known[0]), ("Late", known[-1])]
        per = max(1, k // 2)
        out = [f"What the policy wrote at its first logged step and at its last: up to {per} distinct completions of "
               "each, best reward first (by total reward where recorded, else the unweighted sum of the reward "
               "functions). The difference is what training did."]
    else:
        stages = [("Sampled", known[0] if known else None)]
        per = k
        out = [f"Up to {per} distinct completions of the last recorded batch, spread from the best reward to the worst "
               "(by total reward where recorded, else the unweighted sum of the reward functions)."]
    number = 1
    for label, step in stages:
        group = by_step[step]
        distinct = len({text(r.get("completion") or "") for r in group})
        out += ["", f"### {label}" + (f": step {step}" if step is not None else "")
                + f" ({len(group)} completions, {distinct} distinct)", ""]
        lines, number = _stage(group, per, number)
        out += lines
    return out


def write_report(
    run_dir: str | Path,
    *,
    recipe_name: str,
    explain_lines: list[str] | None = None,
    completions: list[dict] | None = None,
    num_completions: int = 4,
    plots: list[Path] | None = None,
    args=None,
    compare: list | None = None,
    stopped: str | None = None,
) -> Path:
    """Write `<run_dir>/report.md` and return its path.

    `completions`: rows with `prompt`, `completion` and `rewards` ({name: value}) and optionally
    `reward` (total), `advantage`, `step` — see `completions_from_logs`. When None, those the run stored
    (`store_record`), else the first and latest files TRL wrote with `log_completions=True`, if any. `plots`:
    images to link, as `plot_run` returned them; when None, `plot_run` draws them now, so the report never links
    stale or missing curves. `args`: the run's GRPOConfig, when known, so a flat curve is explained by construction.
    `compare`: other runs (`compare.load_runs`, this one first) drawn with this one into `plots/compare.png` and
    tabled. `stopped`: a sentence saying the run stopped before its end, shown first.

    >>> write_report("runs/smoke", recipe_name="smoke", explain_lines=["model: builtin:tiny-llama"])  # doctest: +SKIP
    PosixPath('runs/smoke/report.md')
    """
    run_dir = Path(run_dir)
    state_path, state = load_log_history(run_dir)
    record = read_record(run_dir)
    plots = plot_run(run_dir, args=args) if plots is None else [Path(p) for p in plots]
    if completions is None:
        completions = record["completions"] or completions_from_disk(run_dir, reward_names(state["log_history"]) or None)

    lines = [f"# GRPO run report: {one_line(recipe_name)}", "", f"Run directory: {inline_code(str(run_dir))}", ""]
    lines += [stopped, ""] if stopped else []
    lines += ["## Recipe", ""]
    lines += [fenced("\n".join(explain_lines))] if explain_lines else ["(no explain summary given)"]
    lines += warm_start_section(run_dir)  # nothing for a run without a warm start
    lines += ["", "## Final figures", ""] + _summary(state, record["resumed_at"]) + [""] + _figures(state)
    lines += ["", f"Source: `{Path(os.path.relpath(state_path, run_dir)).as_posix()}`"]
    found = diagnosis(state["log_history"], heldout(run_dir)[0], run_dir, tools_failed=failed_at_end(state["log_history"]))
    if found:
        lines += ["", "## What the curves say", ""] + found
    lines += tool_use_section(state["log_history"])  # nothing for a run without tools
    lines += failed_calls_section(record["failed_calls"])  # nothing for a run whose tool calls never failed
    lines += scoring_section(state["log_history"])  # nothing for a run without task_score
    lines += own_passes_section(state["log_history"])  # nothing where TRL's method ran throughout
    lines += memory_section(state["log_history"])  # nothing for a run that measured no memory
    lines += _curves_section(run_dir, plots, flat_reasons(state["log_history"], args))
    if compare:
        from grpokit.reporting.compare import compare_section

        lines += compare_section(run_dir, compare)
    lines += ["", "## Sampled completions", ""] + _completion_section(completions, num_completions)
    lines += eval_section(run_dir)

    path = run_dir / REPORT_FILE
    files.write_text(path, "\n".join(lines) + "\n", key="--plot", root=run_dir)
    return path


def _curves_section(run_dir: Path, plots: list[Path], flat: dict) -> list[str]:
    """The plots, linked relative to report.md (so the run folder can be moved or shared whole), and why any curve
    is flat by construction."""
    lines = ["", "## Curves", ""]
    lines += [f"![{plot.stem}]({Path(os.path.relpath(plot, run_dir)).as_posix()})" for plot in plots] or ["(no plots)"]
    if flat:
        lines += ["", "Flat curves:"] + [f"- {title}: {why}" for title, why in flat.items()]
    return lines
