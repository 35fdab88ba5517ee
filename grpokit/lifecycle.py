"""Stopping a run well: a signal (Ctrl-C, or the SIGTERM schedulers and `kill` send) ends the run at the next
safe point -- the end of the current optimizer step, with a checkpoint -- and a failed save is told apart from
any other failure.

The rule for the step a signal comes in: it finishes whole (its tool calls still run, each within its limits) and is
trained, logged and checkpointed as any step; a second signal stops at once, and the step it cut is not taken -- no
optimizer update, log or checkpoint of it reaches the run folder, whose last checkpoint is a whole step. A cut step is
never trained on, reported or plotted.

`StopOnSignal` turns the first SIGINT/SIGTERM during training into a request; `SafeStop`, a trainer callback,
honours it at the step end (every rank agrees first, so a multi-process run stops at the same step) and knows
when the trainer is saving, so that `training.run` can say "saving checkpoint-N failed" with what to do.
"""

from __future__ import annotations

import signal
import sys
import threading

from transformers import TrainerCallback

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}  # the shell's 128 + signal number


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class Stopped(KeyboardInterrupt):
    """The run stopped on a signal: at a safe point (`step` set, a checkpoint saved) or at once (a second
    signal, or one before training began). A KeyboardInterrupt, so no library's `except Exception` eats it."""

    def __init__(self, signum: int, step: int | None = None):
        self.signum, self.step = signum, step
        name = signal_name(signum)
        super().__init__(f"{name} at step {step}, after saving a checkpoint" if step is not None else f"{name}, at once")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signum, 128 + self.signum)


class SaveFailed(Exception):
    """Writing a checkpoint or the final model failed (a full disk, a vanished or read-only folder)."""

    def __init__(self, what: str, folder, error: BaseException):
        self.what, self.folder, self.error = what, folder, error
        super().__init__(f"saving {what} failed: {type(error).__name__}: {error}")


class StopOnSignal:
    """While `deferring`, the first SIGINT/SIGTERM is remembered and the run goes on to its next safe point; a
    second one, or one while not deferring (loading, before the first step), stops at once.

    >>> stop = StopOnSignal()
    >>> stop.deferring = True; stop.handle(signal.SIGTERM, None); stop.signum == signal.SIGTERM
    True
    """

    def __init__(self):
        self.signum: int | None = None
        self.deferring = False
        self.finishing = False  # training is done: the final save and the report are being written
        self._previous: dict = {}

    def handle(self, signum, frame) -> None:
        if self.deferring and self.signum is None:
            self.signum = signum
            what = ("the run is finished: completing its final save and report first" if self.finishing
                    else "stopping after this step with a checkpoint")
            print(f"\n[grpokit] {signal_name(signum)}: {what} (send it again to stop at once)", file=sys.stderr, flush=True)
            return
        self.signum = self.signum or signum
        raise Stopped(signum)

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():  # Python accepts handlers only there
            for sig in EXIT_CODES:
                self._previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


def _any_rank(flag: bool, args) -> bool:
    """True when `flag` holds on any process of the run (a one-number all-reduce; just `flag` without one).

    A signal reaches the ranks at slightly different moments; without agreeing, one rank would stop at step 5
    and another go on into step 6's collectives, waiting forever for it.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    import torch

    value = torch.tensor([1.0 if flag else 0.0], device=args.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


class SafeStop(TrainerCallback):
    """The trainer side: stop and checkpoint at the step end when asked; note when a save is under way.

    `saving` names the checkpoint being written between the step end that decides to save and `on_save`
    (called once the trainer has written it whole); an error escaping the trainer meanwhile is a failed save.
    """

    def __init__(self, stop: StopOnSignal):
        self.stop = stop
        self.saving: str | None = None
        self.stopped_at: int | None = None
        self.on_saving = None  # called with a checkpoint's name before the trainer writes it
        self.on_saved = None  # called after each checkpoint is written whole (the run records it as its own)

    def on_train_begin(self, args, state, control, **kwargs):
        self.stop.deferring = True  # from here on, a signal waits for the step end

    def on_step_end(self, args, state, control, **kwargs):
        if _any_rank(self.stop.signum is not None, args):
            self.stop.signum = self.stop.signum or signal.SIGTERM  # another rank got it (the launcher forwards SIGTERM)
            control.should_save = True  # even with save_strategy "no": the point is to lose nothing
            control.should_training_stop = True
            self.stopped_at = state.global_step
        self.saving = f"checkpoint-{state.global_step}" if control.should_save else None
        if self.saving and self.on_saving is not None:
            self.on_saving(self.saving)
        return control

    def on_save(self, args, state, control, **kwargs):
        self.saving = None
        if self.on_saved is not None:
            self.on_saved()
