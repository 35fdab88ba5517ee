"""Training curves from a finished (or running) GRPO run's `trainer_state.json`.

    from grpokit.reporting.plots import plot_run
    plot_run("runs/smoke")        # -> [Path("runs/smoke/plots/training.png")]

TRL's `GRPOTrainer` logs one dict per logging step into `trainer_state.json["log_history"]` (keys such as
`reward`, `rewards/<name>/mean`, `kl`, `entropy`); `Trainer.save_state()` writes it into the output dir
and every checkpoint writes it into `checkpoint-N/`. We draw one panel per metric group that the run
actually logged, so a run with beta = 0 gets no KL panel rather than an empty one, and only a run given tools
(`tools/call_frequency`, `tools/failure_frequency`) gets tool panels, beside the reward. A panel that is flat
by construction (clip ratios of an on-policy run, a constant learning rate) says why on the panel itself
(`flat_reasons`), instead of leaving a reader to wonder about an empty-looking line.

Only matplotlib's object API is used (a bare `Figure` renders through Agg), so calling this from a
training process never changes or needs pyplot's global backend.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from grpokit import files
from grpokit.reporting.messages import inline_code
from grpokit.checkpoints.rundir import STATE_FILE, latest_checkpoint


@dataclass(frozen=True)
class Panel:
    title: str
    ylabel: str
    series: tuple[tuple[str, str], ...]  # (log key, legend label); a key of "rewards/*/mean" expands per reward


# Order is reading order in the grid: what the run optimised first, then its health signals.
PANELS = (
    Panel("Reward", "mean reward", (("reward", "total (weighted)"), ("rewards/*/mean", "{name}"))),
    # Beside the reward: whether the reward came with the tool (TRL logs these only for a run given tools).
    Panel("Tool calls", "calls per completion", (("tools/call_frequency", "calls per completion"),)),
    Panel("Tool call failures", "failed calls / calls", (("tools/failure_frequency", "failed share"),)),
    Panel("Reward std within batch", "std of reward", (("reward_std", "reward std"),)),
    Panel(
        "Groups with zero reward std",
        "fraction of groups (no gradient)",
        (("frac_reward_zero_std", "frac_reward_zero_std"),),
    ),
    Panel(
        "Completion length",
        "tokens",
        (
            ("completions/mean_length", "mean"),
            ("completions/min_length", "min"),
            ("completions/max_length", "max"),
        ),
    ),
    Panel("Truncated completions", "fraction at max length", (("completions/clipped_ratio", "clipped"),)),
    Panel("KL to reference (k3)", "KL per token", (("kl", "kl"),)),
    Panel(
        "PPO clip ratios",
        "fraction of tokens",
        (
            ("clip_ratio/region_mean", "region"),
            ("clip_ratio/low_mean", "low"),
            ("clip_ratio/high_mean", "high"),
        ),
    ),
    Panel("Entropy", "nats per token", (("entropy", "entropy"),)),
    Panel("Learning rate", "learning rate", (("learning_rate", "lr"),)),
    Panel("Loss", "loss", (("loss", "loss"),)),
)


def find_trainer_state(run_dir: str | Path) -> Path:
    """The `trainer_state.json` for a run dir or a checkpoint dir.

    The run dir's own file wins (written by `save_state()` at the end); otherwise the one in the
    highest-numbered `checkpoint-N/`, which holds the longest history.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {str(run_dir)!r} does not exist or is not a directory")
    direct = run_dir / STATE_FILE
    if direct.is_file():
        return direct
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint:
        return Path(checkpoint) / STATE_FILE
    raise ValueError(
        f"no {STATE_FILE} in {str(run_dir)!r} or its checkpoint-N/ folders; pass the output_dir of a run "
        f"that has saved a checkpoint or finished (the trainer writes {STATE_FILE} then)"
    )


def load_log_history(run_dir: str | Path) -> tuple[Path, dict]:
    """(path of trainer_state.json, its parsed content); ValueError when it is missing or unreadable."""
    path = find_trainer_state(run_dir)
    state, why = files.try_json(path, dict)
    if state is None:
        raise ValueError(f"cannot read {path}: it {why}; is the run still writing it?")
    history = state.get("log_history")
    if not isinstance(history, list):
        raise ValueError(f"{path} has no 'log_history' list; is it a transformers trainer_state.json?")
    others = sum(not isinstance(entry, dict) for entry in history)
    if others:
        raise ValueError(f"{path}: its log_history holds {others} entr{'y' if others == 1 else 'ies'} that "
                         f"{'is' if others == 1 else 'are'} not JSON objects; is it a transformers trainer_state.json?")
    return path, state


def series(history: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one logged metric, skipping entries without it and NaN/None values."""
    steps, values = [], []
    for i, entry in enumerate(history):
        value = entry.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(entry.get("step", i))
            values.append(float(value))
    return steps, values


def reward_names(history: list[dict]) -> list[str]:
    """Reward functions as TRL logs them (`rewards/<name>/mean`), in first-seen order."""
    names: dict[str, None] = {}
    for entry in history:
        for key in entry:
            if key.startswith("rewards/") and key.endswith("/mean"):
                names.setdefault(key[len("rewards/") : -len("/mean")], None)
    return list(names)


# Logged steps a reward must hold one value for to count as never varying (verdict judges windows of at least as many).
FLAT_MIN_STEPS = 3


def never_varied(history: list[dict]) -> dict[str, float]:
    """{reward function: its value} for each reward whose logged mean held one value at every one of at least
    FLAT_MIN_STEPS logged steps, and whose logged std (where TRL logged it) was 0 at every one: it gave every
    completion the same score, so it told none from another and added nothing to any advantage.

    >>> never_varied([{"step": s, "rewards/exact/mean": 0.0, "rewards/length/mean": s / 10} for s in range(1, 5)])
    {'exact': 0.0}
    """
    found = {}
    for name in reward_names(history):
        _, means = series(history, f"rewards/{name}/mean")
        _, stds = series(history, f"rewards/{name}/std")
        if len(means) < FLAT_MIN_STEPS or max(means) - min(means) > 1e-9 * max(1.0, abs(means[0])):
            continue
        if stds and max(stds) > 1e-9:
            continue
        found[name] = means[0]
    return found


# key -> the key that must be > 0 at a step for it to mean anything there: TRL logs a failure share of 0 at a step
# without tool calls, where nothing could fail, and drawing it would read as "no call failed".
ONLY_WHERE = {"tools/failure_frequency": "tools/call_frequency"}


def defined_series(history: list[dict], key: str) -> tuple[list[float], list[float]]:
    """`series`, less the steps where the metric is undefined (`ONLY_WHERE`)."""
    steps, values = series(history, key)
    name = key.removeprefix("eval_")
    if name not in ONLY_WHERE:
        return steps, values
    given = dict(zip(*series(history, key[: len(key) - len(name)] + ONLY_WHERE[name])))
    kept = [(s, v) for s, v in zip(steps, values) if given.get(s, 0) > 0]
    return [s for s, _ in kept], [v for _, v in kept]


def _expand(panel: Panel, history: list[dict]) -> list[tuple[str, str]]:
    out = []
    for key, label in panel.series:
        if key == "rewards/*/mean":
            out += [(f"rewards/{n}/mean", label.format(name=n)) for n in reward_names(history)]
        else:
            out.append((key, label))
    return out


def collect_panels(history: list[dict]) -> list[tuple[Panel, list[tuple[str, list, list, bool]]]]:
    """The panels this history can fill, each with its lines (label, steps, values, is_eval).

    A panel appears only when at least one of its metrics was logged: `kl` only exists when beta > 0.
    `eval_<key>` metrics, when an eval set was configured, join their train twin as a dashed line.
    """
    drawn = []
    for panel in PANELS:
        lines = []
        for key, label in _expand(panel, history):
            for prefix, suffix in (("", ""), ("eval_", " (eval)")):
                steps, values = defined_series(history, prefix + key)
                if steps:
                    lines.append((label + suffix, steps, values, bool(prefix)))
        if lines:
            drawn.append((panel, lines))
    return drawn


def on_policy(args) -> bool:
    """One optimizer step per generation batch, so π_old = π_θ and the PPO ratio is exactly 1 (TRL's own test in
    `_generate_and_score_completions`, the same one grpokit.reporting.explain states)."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0


def _flat(lines) -> float | None:
    """The one value every line of a panel holds at every step, or None when anything moves."""
    values = [v for _, _, vals, _ in lines for v in vals]
    if not values or max(values) - min(values) > 1e-12 * max(1.0, abs(max(values))):
        return None
    return values[0]


def flat_reasons(history: list[dict], args=None) -> dict[str, str]:
    """{panel title: why it is flat} for the panels whose every line holds one value at every logged step.

    `args` (the run's GRPOConfig, when known) lets a flat line be explained by construction rather than
    only described.

    >>> flat_reasons([{"step": 1, "learning_rate": 0.01}, {"step": 2, "learning_rate": 0.01}])
    {'Learning rate': 'constant, 0.01 at every logged step'}
    """
    reasons = {}
    for panel, lines in collect_panels(history):
        value = _flat(lines)
        if value is None:
            continue
        if panel.title == "PPO clip ratios" and value == 0:
            why = ("one optimizer step per generation batch (on-policy), so π_old = π_θ, the ratio is exactly 1 "
                   "and nothing is clipped")
            if args is None:
                reasons[panel.title] = f"0 at every step, as expected when {why}"
            elif on_policy(args):
                reasons[panel.title] = f"0 at every step by construction: {why}"
            else:
                reasons[panel.title] = "0 at every step: the ratio never left the clip range"
        elif panel.title == "Learning rate":
            scheduler = str(getattr(getattr(args, "lr_scheduler_type", None), "value", getattr(args, "lr_scheduler_type", "")))
            reasons[panel.title] = (f"constant by the recipe (lr_scheduler_type: constant), {value:g}"
                                    if scheduler == "constant" else f"constant, {value:g} at every logged step")
        elif panel.title == "Tool calls" and value == 0:
            reasons[panel.title] = "0 at every logged step: the model never called the tool"
        elif panel.title == "Tool call failures" and value in (0, 1):
            reasons[panel.title] = (f"{value:g} at every logged step with a call: "
                                    + ("no call failed" if value == 0 else "every call failed; look at the tool's errors"))
        else:
            reasons[panel.title] = f"flat, {value:g} at every logged step"
    for name, value in never_varied(history).items():  # one line of a panel whose other lines move
        reasons[f"Reward {inline_code(name)}"] = (f"flat, {value:g} at every logged step: it scored every completion alike, so it "
                                       "gave no gradient (see \"What the curves say\")")
    return reasons




PLOTS_DIR, PLOT_FILE = "plots", "training.png"  # <run_dir>/plots/training.png


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None, args=None) -> list[Path]:
    """Draw the run's curves into `<run_dir>/plots/training.png` (or `out_dir`) and return the paths.
    `args`: the run's GRPOConfig when known, so flat panels can say why they are flat.

    >>> plot_run("runs/smoke")  # doctest: +SKIP
    [PosixPath('runs/smoke/plots/training.png')]
    """
    run_dir = Path(run_dir)
    state_path, state = load_log_history(run_dir)
    history = state["log_history"]
    if not collect_panels(history):
        raise ValueError(
            f"{state_path} has no training metrics to plot (log_history has {len(history)} entries); "
            "did the run reach its first logging step (logging_steps)?"
        )
    step = state.get("global_step")
    fig = figure(history, f"GRPO run {run_dir.resolve().name}" + (f" — {step} steps" if step else ""), args)
    out = Path(out_dir) if out_dir is not None else run_dir / PLOTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    path = out / PLOT_FILE
    files.save_figure(fig, path, key="--plot", root=Path(run_dir))
    return [path]



def figure(history: list[dict], title: str, args=None):
    """The grid of panels for a log history, as a matplotlib `Figure` (not saved)."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    drawn = collect_panels(history)
    flat = flat_reasons(history, args)
    cols = math.ceil(math.sqrt(len(drawn)))  # near-square grid: 10 panels -> 4 x 3
    rows = math.ceil(len(drawn) / cols)
    fig = Figure(figsize=(4.6 * cols, 3.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (panel, lines) in zip(axes, drawn):
        for label, steps, values, is_eval in lines:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3,
                    linestyle="--" if is_eval else "-", label=label)
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize="small")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 4))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no "2.5" ticks
        note = flat.get(panel.title)
        if panel.title == "Reward" and note is None:  # a reward function flat among moving lines is named on the panel
            note = "; ".join(f"{title.removeprefix('Reward ')} {why.split(':')[0]}" for title, why in flat.items()
                             if title.startswith("Reward `")) or None
        if note:
            ax.text(0.5, 0.5, textwrap.fill(note, 44), transform=ax.transAxes, ha="center",
                    va="center", fontsize="small", bbox=dict(facecolor="white", alpha=0.85, edgecolor="0.7"))
    for ax in axes[len(drawn) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    return fig
