"""A short `report.md` for a GRPO run: what ran, how it ended, its curves, and a few completions.

    from grpokit.reporting.report import write_report, completions_from_logs
    write_report("runs/smoke", recipe_name="smoke", explain_lines=lines,
                 completions=completions_from_logs(trainer._logs))

Completions come from the caller (TRL keeps the last generation batch in `GRPOTrainer._logs`) or, when
the caller passes none, from what TRL 1.16 writes to disk with `log_completions=True`:
`<output_dir>/completions/completions_<step:05d>.parquet`, one row per completion with columns
`step, prompt, completion, <reward name>..., <extra column>..., advantage`.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from grpokit.reporting.plots import load_log_history, plot_run, reward_names, series

REPORT_FILE = "report.md"
COMPLETIONS_DIR = "completions"  # where TRL 1.16 writes log_completions parquet files
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


def _text(value) -> str:
    """A prompt or completion as plain text: conversational messages become `role: content` lines."""
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, dict) and "content" in value:
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) and "content" in m for m in value):
        if len(value) == 1:
            return str(value[0]["content"])
        return "\n".join(f"{m.get('role', '?')}: {m['content']}" for m in value)
    return str(value)


def _clip(text: str, limit: int = TEXT_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def _fence(text: str) -> str:
    """A code block that survives any backticks inside the text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _number(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e6:
        return f"{value:g}"
    return f"{value:.4g}"


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


def completions_from_disk(run_dir: str | Path, names: list[str] | None = None) -> list[dict]:
    """Rows of the latest `completions/completions_*.parquet` TRL wrote, or [] when there is none.

    `names` are the reward functions; columns not named there (dataset extras) are left out. Without
    `names`, every numeric column other than `step` and `advantage` counts as a reward.
    """
    files = sorted(Path(run_dir, COMPLETIONS_DIR).glob("completions_*.parquet"))
    if not files:
        return []
    import pandas as pd  # a dependency of datasets; only needed when TRL wrote parquet

    frame = pd.read_parquet(files[-1])
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
    per_reward = [(f"rewards/{n}/mean", f"reward: {n}") for n in reward_names(history)]
    keys = [FIGURES[0], *per_reward, *FIGURES[1:]]
    lines = ["| metric | first logged | last logged | change |", "|---|---:|---:|---:|"]
    for key, label in keys:
        steps, values = series(history, key)
        if not values:
            continue
        change = values[-1] - values[0]
        lines.append(
            f"| {label} (`{key}`) | {_number(values[0])} (step {steps[0]}) | {_number(values[-1])} "
            f"(step {steps[-1]}) | {'+' if change >= 0 else ''}{_number(change)} |"
        )
    return lines if len(lines) > 2 else ["No training metrics were logged."]


def _summary(state: dict) -> list[str]:
    history = state["log_history"]
    done = state.get("global_step")
    planned = state.get("max_steps")
    logged = len(series(history, "loss")[0]) or len(series(history, "reward")[0])
    parts = [f"- Steps: {done if done is not None else '?'}" + (f" of {planned}" if planned else "")]
    parts.append(f"- Logged points: {logged}")
    runtime = next((e["train_runtime"] for e in reversed(history) if "train_runtime" in e), None)
    if runtime is not None:
        parts.append(f"- Training time: {runtime:.1f} s")
    epoch = state.get("epoch")
    if epoch is not None:
        parts.append(f"- Epochs: {epoch:.3g}")
    return parts


def _completion_section(rows: list[dict], k: int) -> list[str]:
    if not rows:
        return [
            "No completions recorded. Set `log_completions: true` in the recipe's `trainer:` section "
            f"to have TRL write them to `{COMPLETIONS_DIR}/`."
        ]
    picked = pick_completions(rows, k)
    out = [
        f"{len(picked)} of {len(rows)} recorded completions, spread from the best reward to the worst "
        "(by total reward where recorded, else by the unweighted sum of the reward functions)."
    ]
    for i, row in enumerate(picked, 1):
        facts = [f"step {row['step']}"] if row.get("step") is not None else []
        if row.get("reward") is not None:
            facts.append(f"reward {_number(row['reward'])}")
        facts += [f"{name} {_number(v)}" for name, v in (row.get("rewards") or {}).items()]
        head = f"### {i}. " + " · ".join(facts)
        if row.get("advantage") is not None:
            head += f" · advantage {float(row['advantage']):+.3f}"
        out += ["", head, "", "Prompt:", "", _fence(_clip(_text(row.get("prompt") or ""))), "", "Completion:", "",
                _fence(_clip(_text(row.get("completion") or "")))]
    return out


def write_report(
    run_dir: str | Path,
    *,
    recipe_name: str,
    explain_lines: list[str] | None = None,
    completions: list[dict] | None = None,
    num_completions: int = 4,
    plots: list[Path] | None = None,
) -> Path:
    """Write `<run_dir>/report.md` and return its path.

    `completions`: rows with `prompt`, `completion` and `rewards` ({name: value}) and optionally
    `reward` (total), `advantage`, `step` — see `completions_from_logs`. When None, the latest file TRL
    wrote with `log_completions=True` is used, if any. `plots`: images to link, as `plot_run` returned
    them; when None, `plot_run` draws them now, so the report never links stale or missing curves.

    >>> write_report("runs/smoke", recipe_name="smoke", explain_lines=["model: builtin:tiny-llama"])  # doctest: +SKIP
    PosixPath('runs/smoke/report.md')
    """
    run_dir = Path(run_dir)
    state_path, state = load_log_history(run_dir)
    plots = plot_run(run_dir) if plots is None else [Path(p) for p in plots]
    if completions is None:
        completions = completions_from_disk(run_dir, reward_names(state["log_history"]) or None)

    lines = [f"# GRPO run report: {recipe_name}", "", f"Run directory: `{run_dir}`", ""]
    lines += ["## Recipe", ""]
    lines += [_fence("\n".join(explain_lines))] if explain_lines else ["(no explain summary given)"]
    lines += ["", "## Final figures", ""] + _summary(state) + [""] + _figures(state)
    lines += ["", f"Source: `{Path(os.path.relpath(state_path, run_dir)).as_posix()}`"]
    lines += ["", "## Curves", ""]
    for plot in plots:  # links relative to report.md, so the run dir can be moved or shared whole
        lines.append(f"![{plot.stem}]({Path(os.path.relpath(plot, run_dir)).as_posix()})")
    if not plots:
        lines.append("(no plots)")
    lines += ["", "## Sampled completions", ""] + _completion_section(completions, num_completions)

    path = run_dir / REPORT_FILE
    path.write_text("\n".join(lines) + "\n")
    return path
