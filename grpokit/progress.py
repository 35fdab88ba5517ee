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


def line(logs: dict, step: int, max_steps: int) -> str:
    """`step 13/30  reward 0.354 ± 0.166  zero-std groups 0.00  len 14 ...`"""
    parts = [f"step {step}/{max_steps}" if max_steps > 0 else f"step {step}"]
    for key, label, fmt in SHOWN:
        value = logs.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {fmt.format(value)}")
    return "  ".join(parts)


class CompactProgress(ProgressCallback):
    """The progress bar, with a compact line per log; the end-of-training summary is printed whole."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        if "reward" not in logs:  # the train summary at the end, eval logs: keep transformers' form
            return super().on_log(args, state, control, logs=logs, **kwargs)
        self.training_bar.write(line(logs, state.global_step, state.max_steps))


class CompactPrinter(PrinterCallback):
    """The same line when the bar is off (`disable_tqdm: true`)."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        if "reward" not in logs:
            return super().on_log(args, state, control, logs=logs, **kwargs)
        print(line(logs, state.global_step, state.max_steps), flush=True)


def install(trainer) -> None:
    """Swap transformers' console callback for the compact one of the same kind."""
    for old, new in ((ProgressCallback, CompactProgress), (PrinterCallback, CompactPrinter)):
        if any(type(cb) is old for cb in trainer.callback_handler.callbacks):
            trainer.remove_callback(old)
            trainer.add_callback(new)
