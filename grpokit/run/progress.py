"""One compact line per logging step instead of the full metrics dict transformers prints.

TRL logs ~25 metrics a step; printed raw they bury the few a person watches during a GRPO run. The
full set still goes to `trainer_state.json` (and the plots); this only changes the console.
"""

from __future__ import annotations

from transformers.trainer_callback import PrinterCallback, ProgressCallback

# (log key, label, format) in reading order; a key absent from a log is skipped.
SHOWN = (
    ("reward", "reward", "{:.3f}"),
    ("reward_std", "±", "{:.3f}"),
    ("frac_reward_zero_std", "zero-std groups", "{:.2f}"),
    ("completions/mean_length", "len", "{:.0f}"),
    ("completions/clipped_ratio", "truncated", "{:.2f}"),
    ("kl", "kl", "{:.4f}"),
    ("entropy", "entropy", "{:.2f}"),
    ("clip_ratio/region_mean", "clipped", "{:.3f}"),
    ("sampling/rounds", "rounds", "{:.1f}"),
    ("loss", "loss", "{:.4f}"),
)
# What each label of a step line means, said once under the first one (a reader new to GRPO meets them there).
LEGEND = {
    "reward": "reward: the mean score of the step's completions ± its spread",
    "frac_reward_zero_std": "zero-std groups: the share of prompts whose completions all scored alike (those teach "
                            "nothing: GRPO learns from differences within a group)",
    "completions/mean_length": "len: tokens per completion",
    "completions/clipped_ratio": "truncated: the share cut off at max_completion_length",
    "kl": "kl: how far the policy moved from the reference model",
    "entropy": "entropy: how spread the model's next-token choices are (falling: surer)",
    "clip_ratio/region_mean": "clipped: the share of tokens whose update the PPO clip capped",
    "sampling/rounds": "rounds: generation rounds to fill the batch (dynamic sampling)",
    "loss": "loss: GRPO's loss, near 0 by construction (the reward shows progress)",
}
# TRL's tool metrics (a run given tools logs both at every step): calls per completion, and failed calls over calls,
# shown only where calls were made (TRL logs 0 failures at a step without calls, which is no call that worked).
CALLS, FAILURES = "tools/call_frequency", "tools/failure_frequency"


def tools(logs: dict) -> str:
    """The step's tool calls per completion and the share of them that failed; '' for a run without tools.

    >>> tools({CALLS: 0.5, FAILURES: 1.0}), tools({CALLS: 0.0, FAILURES: 0.0}), tools({"reward": 1.0})
    ('tool calls 0.50/completion, 100% failed', 'tool calls 0.00/completion', '')
    """
    calls, failed = logs.get(CALLS), logs.get(FAILURES)
    if not isinstance(calls, (int, float)):
        return ""
    text = f"tool calls {calls:.2f}/completion"
    return text + (f", {failed:.0%} failed" if calls > 0 and isinstance(failed, (int, float)) else "")


def every_call_failed(logs: dict, step: int) -> str | None:
    """A plain sentence when every tool call of a step failed (the reward then comes without the tool); else None.

    >>> every_call_failed({CALLS: 1.0, FAILURES: 1.0}, 3)[:41]
    'every tool call at step 3 failed (1.00 pe'
    """
    calls, failed = logs.get(CALLS), logs.get(FAILURES)
    if not isinstance(calls, (int, float)) or calls <= 0 or failed != 1.0:
        return None
    return (f"every tool call at step {step} failed ({calls:.2f} per completion): the model read only error messages, "
            "so no reward came from the tool. report.md's \"Failed tool calls\" shows the failed calls of each step and "
            "the error the model read (and where your tool raised); a 'Tool X not found.' names a tool the model was "
            "shown (in the prompt or dataset.few_shot) that the recipe does not give.")


def legend(logs: dict) -> str:
    """What the labels of a step line mean, for those the line shows.

    >>> print(legend({"reward": 0.5, "kl": 0.0}))
    (reward: the mean score of the step's completions ± its spread; kl: how far the policy moved from the reference model)
    """
    said = [text for key, text in LEGEND.items() if isinstance(logs.get(key), (int, float))]
    if isinstance(logs.get(CALLS), (int, float)):
        said.append("tool calls: calls per completion, and the share that failed")
    return f"({'; '.join(said)})"


def summary(logs: dict, step: int, started_at: int = 0) -> str | None:
    """The end-of-training log as one sentence (transformers prints it as a raw dict); None for other logs. A session
    that resumed at step `started_at` trained the steps after it, not `step` of them.

    >>> summary({"train_runtime": 40.89, "train_steps_per_second": 0.734, "train_loss": 0.0007}, 30)
    'trained 30 steps in 40.9 s (0.734 steps/s); mean loss over the run 0.0007'
    >>> summary({"train_runtime": 30.0}, 30, started_at=9)
    'trained 21 steps (10-30, resumed at step 9) in 30.0 s'
    """
    if "train_runtime" not in logs:
        return None
    steps = f"{step - started_at} steps ({started_at + 1}-{step}, resumed at step {started_at})" if started_at else f"{step} steps"
    text = f"trained {steps} in {float(logs['train_runtime']):.1f} s"
    if logs.get("train_steps_per_second") is not None:
        text += f" ({float(logs['train_steps_per_second']):.3g} steps/s)"
    if logs.get("train_loss") is not None:  # GRPO's loss hovers near 0 by construction; the reward tells progress
        text += f"; mean loss over the run {float(logs['train_loss']):.4g}"
    return text


def line(logs: dict, step: int, max_steps: int, pace: "Pace | None" = None) -> str:
    """`step 13/30  reward 0.354 ± 0.166  zero-std groups 0.00  len 14 ...  tool calls 0.50/completion, 0% failed  17 s/step, ~5 min left`"""
    parts = [f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"]
    for key, label, fmt in SHOWN:
        value = logs.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {fmt.format(value)}")
    parts.append(tools(logs))
    if pace is not None:
        parts.append(pace.update(logs, step, max_steps))
    return "  ".join(p for p in parts if p)


def _duration(seconds: float) -> str:
    """`42 s`, `7 min`, `1 h 05 min`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


class Pace:
    """Seconds per step and the time left, from the trainer's own `step_time` (TRL logs it each logged step).

    The first step warms kernels and caches up and is slower: it is left out of the rate once a later step is
    known, so the time left holds from the second logged step on.

    >>> pace = Pace()
    >>> pace.update({"step_time": 40.0}, 1, 30)
    'first step 40 s (warm-up)'
    >>> pace.update({"step_time": 16.0}, 2, 30)
    '16 s/step, ~7 min left'
    """

    def __init__(self):
        self.times: list[float] = []

    def update(self, logs: dict, step: int, max_steps: int) -> str:
        value = logs.get("step_time")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            return ""
        self.times.append(float(value))
        if len(self.times) == 1:
            return f"first step {_duration(value)} (warm-up)"
        rate = sum(self.times[1:]) / len(self.times[1:])
        left = f", ~{_duration(rate * (max_steps - step))} left" if max_steps > step else ""
        return f"{rate:.0f} s/step{left}" if rate >= 1 else f"{rate:.2f} s/step{left}"


class _Resumed:
    """Remembers the step training began at (the checkpoint's, when resuming: the trainer has loaded its state by
    `on_train_begin`), so the summary counts what this session trained; says once what the labels mean, under the
    first step line, and once when every tool call of a step failed, under its step line."""

    started_at = 0
    failed_said = False
    legend_said = False

    def lines(self, logs: dict, state) -> list[str]:
        self.pace = getattr(self, "pace", None) or Pace()
        out = [line(logs, state.global_step, state.max_steps, self.pace)]
        if not self.legend_said:
            self.legend_said = True
            out.append(legend(logs))
        alarm = None if self.failed_said else every_call_failed(logs, state.global_step)
        if alarm:
            self.failed_said = True
            out.append(alarm)
        return out

    def on_train_begin(self, args, state, control, **kwargs):
        self.started_at = state.global_step
        return super().on_train_begin(args, state, control, **kwargs)


class CompactProgress(_Resumed, ProgressCallback):
    """The progress bar, with a compact line per log; the end-of-training summary is printed whole."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        end = summary(logs, state.global_step, self.started_at)
        if end is not None:
            self.training_bar.write(end)
            return
        if "reward" not in logs:  # eval logs: keep transformers' form
            return super().on_log(args, state, control, logs=logs, **kwargs)
        for text in self.lines(logs, state):
            self.training_bar.write(text)


class CompactPrinter(_Resumed, PrinterCallback):
    """The same line when the bar is off (`disable_tqdm: true`) or the console is not a terminal."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        end = summary(logs, state.global_step, self.started_at)
        if end is not None:
            print(end, flush=True)
            return
        if "reward" not in logs:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        for text in self.lines(logs, state):
            print(text, flush=True)


def events(args) -> list[str]:
    """Where the run's metrics go besides the console (`trainer.report_to`), one line each, to print at the start.

    Sets TensorBoard's directory to `output_dir/tensorboard` unless TENSORBOARD_LOGGING_DIR is set: transformers 5
    otherwise writes to `./runs/<date>_<host>`, among grpokit's own run folders. Call before the trainer is built.

    >>> from types import SimpleNamespace
    >>> events(SimpleNamespace(report_to=["trackio"], project="smoke", output_dir="runs/smoke"))
    ["metrics: Trackio, project 'smoke' (view: trackio show --project smoke)"]
    """
    import os
    from pathlib import Path

    lines = []
    for target in args.report_to or []:
        if target == "tensorboard":
            where = os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(Path(args.output_dir) / "tensorboard"))
            lines.append(f"metrics: TensorBoard, {where} (view: tensorboard --logdir {where})")
        elif target == "trackio":
            lines.append(f"metrics: Trackio, project '{args.project}' (view: trackio show --project {args.project})")
        else:
            lines.append(f"metrics: {target} (its own settings decide where)")
    return lines


def install(trainer, interactive: bool | None = None) -> None:
    """Swap transformers' console callback for the compact one of the same kind; where the console is not a
    terminal (a log file, a pipe), the line printer instead of the bar, whose redraws would share each line of
    the saved log with a step line."""
    import sys

    if interactive is None:
        interactive = sys.stderr.isatty()
    bar = CompactProgress if interactive else CompactPrinter
    for old, new in ((ProgressCallback, bar), (PrinterCallback, CompactPrinter)):
        if any(type(cb) is old for cb in trainer.callback_handler.callbacks):
            trainer.remove_callback(old)
            trainer.add_callback(new)
