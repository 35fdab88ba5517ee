"""A run's life, from a validated recipe and the request: lock the folder, prepare, build, train, finish -- and,
when it stops early, what it says (where it can go on from, the whole command that continues it).

The steps are rooms of their own: `build` (prepare, make_trainer), `runfiles` (recipe.yaml, curves, report.md),
`lifecycle` (signals, failed saves), `rundir` (the folder's lock and checkpoints).
"""

from __future__ import annotations

from pathlib import Path

from grpokit.checkpoints import rundir
from grpokit.warm_start import section as warmstart
from grpokit.run.build import make_trainer, prepare
from grpokit.config import Recipe
from grpokit.config.trainer_args import grpo_args, resolved_dtype
from grpokit.prompts.data import source_name
from grpokit.dist import end_distributed, is_main_process, say
from grpokit.errors import RecipeError
from grpokit.trainer.models import load_model
from grpokit.reporting.explain import what_it_learns
from grpokit.reporting.model_card import write_model_card
from grpokit.run.request import Request
from grpokit.run.runfiles import finish_run, write_recipe_file

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C; SIGTERM ends with 143 (lifecycle.EXIT_CODES)
NEW_RUN = Request()  # a new run: no resume, no overwrite, no continue command


def run(recipe: Recipe, request: Request = NEW_RUN) -> int:
    """Train a validated recipe as `launch.py` does; returns the exit code. A failing reward or Ctrl-C ends with
    a message saying where the run can go on from and the whole command that continues it (`request.continue_with`,
    from `rundir.resume_command`), not a traceback. Ctrl-C and SIGTERM stop at the end of the current step with a
    checkpoint (exit 130 / 143; a second signal stops at once); under a distributed launcher the process ends here
    (`dist.end_distributed`)."""
    import sys

    from rewards import RewardFailure

    from grpokit.lifecycle import SaveFailed
    from grpokit.tools.toolguard import EnvironmentFailure

    output_dir = Path(recipe.trainer["output_dir"])
    try:
        train(recipe, request)
    except SaveFailed as err:
        print(f"run stopped: {err}", file=sys.stderr)
        print(save_failure_help(err, output_dir), file=sys.stderr)
        print(stopped_at(output_dir, request.continue_with), file=sys.stderr)
        code = EXIT_FAILED
    except (RewardFailure, EnvironmentFailure, KeyboardInterrupt) as err:  # Ctrl-C too: say where the run can go on from
        print(f"run stopped: {str(err) or 'interrupted'}", file=sys.stderr)
        print(stopped_at(output_dir, request.continue_with), file=sys.stderr)
        code = EXIT_INTERRUPTED if isinstance(err, KeyboardInterrupt) else EXIT_FAILED
        code = getattr(err, "exit_code", code)
    except (RuntimeError, MemoryError) as err:  # out of memory in any phase: what the plan says, not a traceback
        from grpokit import trl_compat
        from grpokit.trainer import watch

        if not trl_compat.out_of_memory(err):
            raise
        lines = watch.explain(watch.active())
        print("run stopped: " + "\n".join(lines), file=sys.stderr)
        print(stopped_at(output_dir, request.continue_with), file=sys.stderr)
        code = watch.EXIT_OUT_OF_MEMORY
    else:
        code = 0
    end_distributed(code)
    return code


def train(recipe: Recipe, request: Request = NEW_RUN):
    """Train a validated recipe; returns the trainer. Writes the resolved recipe first, then the run.

    The run directory is locked first, for the whole run (`rundir.RunLock`): a second run into it -- new,
    `--overwrite` or `--resume` -- is refused before it can delete or mix anything.
    """
    output_dir, recipe_path = Path(recipe.trainer["output_dir"]), str(recipe.path)
    forbidden = rundir.forbidden_problems(output_dir, recipe.path, recipe_path)
    if forbidden:  # before the lock: such a folder does not even get a lock file
        raise RecipeError(forbidden)
    with rundir.RunLock(output_dir, recipe_path) as lock:
        return _train_locked(recipe, output_dir, lock, request)


def already_finished(recipe: Recipe, output_dir: Path, request: Request, lock=None) -> bool:
    """True when `--resume` meets a run that already reached `trainer.max_steps`: nothing is trained.

    What a kill may have cut short is completed instead -- the final save from the final checkpoint (the
    trainer checkpoints the last step), then the curves and report -- and the run says it is finished and how
    to extend it. Without this, TRL trains past max_steps (`step 5/4`) and replaces the final adapter.
    An epoch-based run (no max_steps) is left to the trainer.
    """
    max_steps = recipe.trainer.get("max_steps", -1)
    if not isinstance(max_steps, int) or max_steps <= 0:
        return False
    final_path = output_dir / rundir.STATE_FILE
    final, _ = rundir.read_state(final_path)
    done = final["global_step"] if final else 0
    last = rundir.latest_checkpoint(output_dir, quiet=True) if request.resume == "latest" else request.resume
    last_state = rundir.read_state(Path(last) / rundir.STATE_FILE)[0] if last else None
    from_checkpoint = last_state["global_step"] if last_state else 0
    if max(done, from_checkpoint) < max_steps:
        return False
    args = grpo_args(recipe)  # on every rank: building it joins a multi-process launch's process group
    if lock is not None:
        lock.begin()  # what it completes below (final save, report) is the run's
    if is_main_process():
        if done < max_steps:
            say(f"the run reached step {from_checkpoint} but its final save is incomplete: completing it from {last}")
            rundir.complete_final_save(Path(last), output_dir)
            write_model_card(recipe, output_dir, from_checkpoint)
            done = from_checkpoint
        report = output_dir / "report.md"
        if not report.is_file() or report.stat().st_mtime_ns < final_path.stat().st_mtime_ns:
            finish_run(output_dir, recipe, args)
    extend = request.continue_with or "python launch.py --recipe RECIPE --resume"
    say(f"the run in {output_dir} is finished (step {done} of trainer.max_steps {max_steps}); nothing to train. "
        f"To train it longer, raise trainer.max_steps: {extend} trainer.max_steps={2 * max_steps}")
    return True


def _final_save(trainer, output_dir: Path, lock) -> None:
    """The finished run's model and state, claimed as the run's files while they are written (their names are the
    trainer's to choose) and recorded once whole; a failure is a `SaveFailed` naming what it was writing."""
    from grpokit.lifecycle import SaveFailed

    lock.pending()  # the final save's files have names the trainer chooses: what appears now is the run's
    try:
        trainer.save_model(str(output_dir))
        trainer.save_state()  # trainer_state.json last: present and readable only once the final save is whole
    except Exception as err:  # noqa: BLE001
        raise SaveFailed("the final model", output_dir, err) from err
    lock.record()  # the final save is whole: its files are the run's by record, no longer by the pending window


def _train_locked(recipe: Recipe, output_dir: Path, lock, request: Request):
    recipe_path = str(recipe.path)
    previous = rundir.guard_output_dir(output_dir, request.resume, request.overwrite, recipe_path, recipe.path)
    if request.resume is not None and already_finished(recipe, output_dir, request, lock):
        return None
    checkpoint = rundir.resolve_resume(request.resume, output_dir, recipe_path)
    # the step the checkpoint holds: what this session trains is counted from it, not from 0
    resumed_at = (rundir.read_state(Path(checkpoint) / rundir.STATE_FILE)[0] or {}).get("global_step") if checkpoint else None
    prep = prepare(recipe, mode="train")
    model, base = _first_weights(recipe, prep, output_dir, request)
    # Every check has passed and the weights are in: only now does --overwrite remove the previous run.
    rundir.remove_previous(output_dir, previous, recipe_path, lock)
    lock.begin()
    output_dir.mkdir(parents=True, exist_ok=True)
    if is_main_process():
        write_recipe_file(recipe, output_dir)
    if model is None:  # the warm start first (TRL's SFTTrainer), then GRPO from it
        model = _from_a_new_warm_start(recipe, prep, output_dir, base, lock)
        base = None  # its weights were merged and saved: freed before GRPO loads the warm start
    trainer = _trainer(recipe, prep, model)
    from grpokit.lifecycle import SaveFailed, StopOnSignal, Stopped, signal_name

    say(f"training: {planned(prep.args.max_steps, prep.args.num_train_epochs, resumed_at)} -> {output_dir}"
        + (f" (resuming {checkpoint})" if checkpoint else ""))
    tools = prep.tools
    say(what_it_learns(recipe.rewards, source_name(recipe.dataset), prep.args,
                       tools.environment.__name__ if tools is not None and tools.owns_reward else None))
    with StopOnSignal() as stop:
        safe = add_run_callbacks(trainer, stop)
        safe.on_saving = lock.claim_writing  # a checkpoint is grpokit's from before its first byte ...
        safe.on_saved = lock.record  # ... and recorded file by file as soon as it is whole
        try:
            trainer.train(resume_from_checkpoint=checkpoint)
        except Exception as err:  # noqa: BLE001 - only a failure while a checkpoint is being written is ours to explain
            if safe.saving:
                raise SaveFailed(safe.saving, output_dir / safe.saving, err) from err
            raise
        if safe.stopped_at is not None and trainer.state.global_step < trainer.state.max_steps:
            stopped = Stopped(stop.signum, step=safe.stopped_at)  # not finished: no final save, the checkpoint is the run
            if is_main_process():  # the run so far, read where it was left: its curves and report, marked as stopped
                _report_so_far(output_dir, recipe, prep.args, trainer, resumed_at, stopped, request.continue_with)
            raise stopped
        # Finished: a signal now waits until the final save and the report are written (seconds).
        stop.finishing = True
        _final_save(trainer, output_dir, lock)
        if is_main_process():
            write_model_card(recipe, output_dir, trainer.state.global_step, resumed_at)
            finish_run(output_dir, recipe, prep.args, trainer, resumed_at=resumed_at)
        if stop.signum is not None:
            say(f"{signal_name(stop.signum)} came as the run finished: its final save and report were completed first")
    return trainer


def _trainer(recipe: Recipe, prep, model):
    """The run's trainer around `model`: where its events go said first, TRL's draft card off, its memory watched."""
    from grpokit.run.progress import events

    for where in events(prep.args):  # before the trainer: it fixes TensorBoard's directory at construction
        say(where)
    trainer = make_trainer(prep, model)
    from grpokit import trl_compat
    from grpokit.trainer import watch
    from grpokit.run.build import planned_shapes

    trl_compat.no_draft_card(trainer)  # the folder's card is grpokit's, written with the final model
    watch.install(trainer, recipe, prep.args, say, planned_shapes(prep, recipe))  # the run measures its own memory
    return trainer


def _first_weights(recipe: Recipe, prep, output_dir: Path, request: Request):
    """(the policy, None) -- the recipe's model, or the warm start this run made before (`--resume`) -- or (None, the
    base a new warm start trains on, in the supervised pass's dtype): the weights that load before anything is removed."""
    warm = warmstart.made(output_dir) if recipe.warm_start and request.resume is not None else None
    if warm:
        say(f"warm start: {warm}, this run's own (--resume never trains it again)")
    if warm or not recipe.warm_start:
        return _policy(recipe, str(warm or prep.model_path), str(warm or recipe.model["name_or_path"])), None
    from grpokit.run import supervised

    return None, supervised.load_base(prep)


def _from_a_new_warm_start(recipe: Recipe, prep, output_dir: Path, base, lock):
    """The warm start made from `base` (TRL's SFTTrainer, merged into the run folder), then loaded as GRPO's policy."""
    from grpokit.run import supervised

    prep.model_path = supervised.ensure(prep, output_dir, base)
    lock.record()  # the warm start is the run's from now on, even if GRPO never reaches a checkpoint
    return _policy(recipe, prep.model_path, f"{prep.model_path} (the warm start)")


def _report_so_far(output_dir: Path, recipe: Recipe, args, trainer, resumed_at, stopped, continue_with) -> None:
    """A stopped run's curves and report.md, marked as stopped; a failure here is said, never raised: the checkpoint is
    what counts, and the stop is said whatever this did."""
    try:
        finish_run(output_dir, recipe, args, trainer, resumed_at=resumed_at, stopped=stopped,
                   continue_with=continue_with)
    except Exception as err:  # noqa: BLE001
        say(f"the report of the run so far was not written: {type(err).__name__}: {err} (`--plot RUN_DIR` draws it)")


def _policy(recipe: Recipe, path: str, shown: str):
    """The model GRPO trains, loaded from `path` (the recipe's model, or its warm start) and said so (as `shown`)."""
    say(f"building model: {shown} ({resolved_dtype(recipe.model, lora=recipe.lora is not None)}, quantization "
        f"{recipe.model['quantization']}, " + (f"LoRA r={recipe.lora['r']})" if recipe.lora else "full fine-tune)"))
    return load_model(path, recipe)


def planned(max_steps: int, epochs: float, resumed_at: int | None) -> str:
    """What a session is about to train, counted from the step it resumes at.

    >>> planned(30, 3.0, None), planned(30, 3.0, 9), planned(-1, 3.0, None)
    ('30 steps', 'steps 10-30 of 30 (21 steps, resumed at step 9)', '3.0 epochs')
    """
    if max_steps <= 0:
        return f"{epochs} epochs"
    if not resumed_at:
        return f"{max_steps} steps"
    return f"steps {resumed_at + 1}-{max_steps} of {max_steps} ({max_steps - resumed_at} steps, resumed at step {resumed_at})"


def add_run_callbacks(trainer, stop):
    """What a grpokit run adds to the trainer's steps (bench/overhead.py measures the same): the compact progress
    lines, the first logged step's completions kept for report.md, and stopping at a step's end on a signal.
    Returns the `SafeStop` callback."""
    from grpokit.run import progress
    from grpokit.lifecycle import SafeStop
    from grpokit.reporting.report import keep_first_completions

    progress.install(trainer)
    keep_first_completions(trainer)  # report.md shows the first logged step's completions next to the last's
    safe = SafeStop(stop)
    trainer.add_callback(safe)
    return safe


def save_failure_help(err, output_dir: Path) -> str:
    """After a failed save: the free space where it was writing, and the incomplete checkpoint removed.

    The removal is belt and braces -- its trainer_state.json, written last, is missing or cut short, so resume
    skips it anyway -- but it frees the space the next try needs and leaves nothing that looks like a checkpoint.
    """
    import shutil

    lines = []
    try:
        usage = shutil.disk_usage(output_dir)
        lines.append(f"free space in {output_dir}: {usage.free / 1e9:.2f} GB of {usage.total / 1e9:.1f} GB")
    except OSError as usage_err:
        lines.append(f"free space in {output_dir}: unknown ({usage_err.strerror or usage_err})")
    folder = Path(err.folder)
    if is_main_process() and folder != output_dir and folder.is_dir() and rundir.read_state(folder / rundir.STATE_FILE)[0] is None:
        from grpokit import files
        from grpokit.errors import RecipeError

        try:
            files.remove(output_dir, [folder.name], "trainer.output_dir")  # only what the run's claim vouches for
            lines.append(f"kept the incomplete {folder}: grpokit did not write all of it" if folder.exists() else
                         f"removed the incomplete {folder}")
        except (RecipeError, OSError) as kept:
            lines.append(f"kept the incomplete {folder}: {kept.problems[0].message if isinstance(kept, RecipeError) else kept}")
    return "\n".join(lines)


def stopped_at(output_dir: Path, continue_with: str | None) -> str:
    """The lines after "run stopped": the checkpoint a resume would start from, and the command that does it."""
    last = rundir.latest_checkpoint(output_dir, quiet=True)
    if last is None:
        return "no checkpoint was saved yet: the run starts over" + (f" with: {continue_with.removesuffix(' --resume')} --overwrite"
                                                                     if continue_with else "")
    return f"last checkpoint: {last}\ncontinue with: {continue_with}" if continue_with else f"last checkpoint: {last} (continue with --resume)"
