"""Runs side by side: `--plot RUN --compare RUN2 [RUN3 ...]` gives RUN's report.md one PNG with every run's curves
on shared axes and a table of what each run reached.

    runs = load_runs(Path("runs/a"), [Path("runs/b")])   # RecipeError naming every run without trainer_state.json
    lines = compare_section(Path("runs/a"), runs)        # draws runs/a/plots/compare.png, returns the report's lines

Only RUN is written to: the compared runs are read (their trainer_state.json and eval.json files), never changed.
Each run's line is drawn twice: faint for every logged step and solid for the mean over the window of logged steps
`verdict` judges by, because with few prompts per step single steps swing too much to compare runs by.
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

from grpokit import files
from grpokit.errors import Problem, RecipeError
from grpokit.reporting.messages import cell, inline_code
from grpokit.reporting.plots import PLOTS_DIR, load_log_history, reward_names, series
from grpokit.reporting.tool_calls import CALLS, ends, over
from grpokit.reporting.verdict import BEFORE_RUN, heldout, heldout_fall, window, windows, zero_spread

COMPARE_FILE = "compare.png"  # <RUN>/plots/compare.png
# (log key, panel title, y label), in reading order: what the runs optimised, then their health signals.
COMPARED = (
    ("reward", "Reward", "mean reward"),
    ("tools/call_frequency", "Tool calls", "calls per completion"),  # only runs given tools log it
    ("completions/mean_length", "Completion length", "mean tokens"),
    ("entropy", "Entropy", "nats per token"),
    ("clip_ratio/region_mean", "PPO clip ratio (region)", "fraction of tokens"),
    ("kl", "KL to reference (k3)", "KL per token"),
    ("frac_reward_zero_std", "Groups with zero reward std", "fraction of groups (no gradient)"),
)


@dataclass(frozen=True)
class Run:
    label: str  # the folder as the user named it on the command line
    path: Path
    state: dict

    @property
    def history(self) -> list[dict]:
        return self.state["log_history"]


def load_runs(run_dir: Path, others: list[Path]) -> list[Run]:
    """RUN and the runs compared with it, each with its trainer state. RecipeError (every problem at once) for a run
    without a readable trainer_state.json, or a folder named twice."""
    problems, runs, seen = [], [], {}
    for i, path in enumerate([Path(run_dir), *map(Path, others)]):
        key = "--plot" if i == 0 else "--compare"
        where = os.path.realpath(path)
        if where in seen:
            problems.append(Problem(key, f"{str(path)!r} is the same folder as {seen[where]!r}; compare different runs"))
            continue
        seen[where] = str(path)
        try:
            runs.append(Run(str(path), path, load_log_history(path)[1]))
        except ValueError as err:
            problems.append(Problem(key, str(err)))
    if problems:
        raise RecipeError(problems)
    return runs


def figure(runs: list[Run]):
    """The compared metrics, one panel each (only those some run logged), one colour per run; a matplotlib Figure."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    panels = [p for p in COMPARED if any(series(r.history, p[0])[1] for r in runs)]
    cols = min(3, max(1, len(panels)))
    rows = max(1, -(-len(panels) // cols))
    fig = Figure(figsize=(5.0 * cols, 3.4 * rows + 0.4 * len(runs)), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (key, title, ylabel) in zip(axes, panels):
        missing = []
        for i, run in enumerate(runs):
            steps, values = series(run.history, key)
            if not values:
                missing.append(run.label)
                continue
            means = windows(run.history, key) if window(len(values)) < len(values) else []
            ax.plot(steps, values, color=f"C{i}", alpha=0.3 if means else 1.0, linewidth=1)
            if means:
                ax.plot([(m[0] + m[1]) / 2 for m in means], [m[2] for m in means], color=f"C{i}", linewidth=2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if missing:  # an absent line is a metric the run did not log (KL at beta = 0), not a value of 0
            note = textwrap.fill("not logged by " + ", ".join(missing), 50, break_long_words=False, break_on_hyphens=False)
            ax.text(0.02, 0.98, note, transform=ax.transAxes, ha="left", va="top", fontsize="small", color="0.35",
                    in_layout=False)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    handles = [Line2D([], [], color=f"C{i}", linewidth=2) for i in range(len(runs))]
    labels = [f"{r.label} (this report)" if i == 0 else r.label for i, r in enumerate(runs)]
    fig.legend(handles, labels, loc="outside upper center", ncols=1, title="run folder")
    fig.supxlabel("faint: each logged step; solid: mean over a window of logged steps (an eighth of the run, at least 3), "
                  "drawn at the window's middle",
                  fontsize="small")
    return fig


def plot_compare(run_dir: Path, runs: list[Run]) -> Path:
    """Draw `<run_dir>/plots/compare.png` and return its path; nothing is written into the compared runs."""
    out = Path(run_dir) / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / COMPARE_FILE
    files.save_figure(figure(runs), path, key="--compare", root=run_dir)
    return path


def _cell(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}g}"


def _span(m: tuple) -> str:
    return f"{_cell(m[2])} (step {m[0]})" if m[0] == m[1] else f"{_cell(m[2])} (steps {m[0]}–{m[1]})"


def _heldout(run: Run) -> str:
    rows = [r for r in heldout(run.path)[0] if r["label"] not in BEFORE_RUN]
    if not rows:
        return "—"
    last, best = rows[-1], max(rows, key=lambda r: r["pass@1"])
    text = f"{last['pass@1']:.3f} ({last['label']})"
    if best is not last:
        text += f"; best {best['pass@1']:.3f} ({best['label']})" + (" ⚠ fell" if heldout_fall(rows) else "")
    return text


def _tool_calls(run: Run) -> str:
    """Tool calls per completion over the run's closing window (the report's "end"); "—" for a run without tools."""
    if not series(run.history, CALLS)[1]:
        return "—"
    return _cell(over(run.history, CALLS, ends(run.history)[1]))


def table(runs: list[Run]) -> list[str]:
    """One row per run: steps, reward (last logged, best and closing window means), mean length at the end, steps
    without gradient, held-out pass@1 where `--eval` scored it; and tool calls per completion over the closing window
    when any run was given tools (a column of "—" alone would only widen the table)."""
    tools = any(series(run.history, CALLS)[1] for run in runs)
    lines = ["| run | steps | reward, last logged | reward, best window mean | reward, closing window mean | "
             "mean length at end (tokens) | steps without gradient | held-out pass@1 |"
             + (" tool calls per completion, closing window |" if tools else ""),
             "|---|---:|---:|---:|---:|---:|---:|---|" + ("---:|" if tools else "")]
    for run in runs:
        _, rewards = series(run.history, "reward")
        means = windows(run.history, "reward") if rewards else []
        _, lengths = series(run.history, "completions/mean_length")
        z = zero_spread(run.history)
        dead = f"{z['dead']} of {z['logged']}" if z else "—"
        lines.append(f"| {cell(run.label)} | {run.state.get('global_step', '—')} | {_cell(rewards[-1] if rewards else None)} "
                     f"| {_span(max(means, key=lambda m: m[2])) if means else '—'} | {_span(means[-1]) if means else '—'} "
                     f"| {_cell(lengths[-1] if lengths else None, 4)} | {dead} | {_heldout(run)} |"
                     + (f" {_tool_calls(run)} |" if tools else ""))
    return lines


def different_rewards(runs: list[Run]) -> list[str]:
    """A warning when the runs were paid by different reward functions (as TRL logged them): their `reward` curves
    share an axis but not a meaning. [] when every run logged the same ones.

    >>> runs = [Run("a", Path("a"), {"log_history": [{"rewards/accuracy/mean": 1}]}),
    ...         Run("b", Path("b"), {"log_history": [{"rewards/char_fraction/mean": 1}]})]
    >>> different_rewards(runs)[0][:23]
    '**Different rewards**: '
    """
    paid = [(run.label, reward_names(run.history)) for run in runs]
    if len({tuple(sorted(names)) for _, names in paid}) < 2:
        return []
    each = "; ".join(f"{inline_code(label)}: " + (", ".join(inline_code(n) for n in names) or "none logged") for label, names in paid)
    return [f"**Different rewards**: {each}. Their mean rewards share the axis but not a scale or a meaning: compare "
            "the curves' shapes, not their heights, and the runs by held-out pass@1 on the same prompts (`--eval`)."]


def compare_section(run_dir: Path, runs: list[Run]) -> list[str]:
    """The report's comparison: compare.png (drawn now, into RUN only), a word when the runs were paid by different
    rewards, and the table."""
    png = plot_compare(run_dir, runs)
    warning = different_rewards(runs)
    return ["", "## Compared with other runs", "",
            f"This run and {', '.join(inline_code(r.label) for r in runs[1:])}, on shared axes (one colour per run folder):",
            *(["", *warning] if warning else []),
            "", f"![compare]({Path(os.path.relpath(png, run_dir)).as_posix()})", "", *table(runs), "",
            "Window means average the logged steps of each run's window (an eighth of the run, at least 3); "
            "\"steps without gradient\" counts logged steps where every group's rewards were equal."]
