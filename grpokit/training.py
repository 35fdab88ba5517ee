"""From a validated recipe to a trained run: everything `launch.py` does after validating.

`prepare()` builds all that needs no weights (GRPOConfig, LoRA config, rewards, tokenizer, formatted
dataset) and is what `--check` runs; `train()` adds the weights and the trainer. Both go through the
same code, so a recipe that passes `--check` fails at training time only for reasons no check can
see before the weights load (out of memory, a reward raising on real completions).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpokit import ownership, rundir
from grpokit.config import Recipe, dump, engine
from grpokit.config.trainer_args import grpo_args, resolved_dtype
from grpokit.dist import end_distributed, is_main_process, say
from grpokit.errors import Problem, RecipeError
from grpokit.models import describe_error, is_gguf_file, load_model, load_tokenizer, model_source, not_cached
from grpokit.reporting.model_card import write_model_card
from grpokit.trl_compat import vllm_version

EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # the shell's code for Ctrl-C; SIGTERM ends with 143 (lifecycle.EXIT_CODES)


@dataclass
class Prepared:
    recipe: Recipe
    args: Any  # trl.GRPOConfig
    lora: Any  # peft.LoraConfig | None
    reward_funcs: list
    model_path: str | None  # local dir, or hub id; None when not reachable
    tokenizer: Any = None
    dataset: Any = None
    notes: list[str] = field(default_factory=list)


def prepare(recipe: Recipe, log=say, training: bool = False, launching: bool = False) -> Prepared:
    """Everything but the weights. Raises `RecipeError` listing every problem.

    For `--check` (training=False) a hub model or dataset that cannot be reached offline becomes a note;
    for training it must load (from the cache, or downloaded where the hub is reachable). `launching`: checked
    by the process that is about to start `recipe.num_processes` (grpokit.launcher), with training's rules.
    """
    import rewards
    from peft import LoraConfig

    from grpokit import data

    args = grpo_args(recipe, num_processes=None if training and not launching else recipe.num_processes)
    lora = LoraConfig(**recipe.lora) if recipe.lora is not None else None
    reward_funcs = [rewards.build(r["name"], **r["args"]) for r in recipe.rewards]
    notes, problems = [], []

    model_path, note = None, None
    try:
        model_path, note = model_source(recipe, convert=training)
    except RecipeError as err:
        problems += err.problems
    if is_gguf_file(model_path):
        notes.append(f"{Path(model_path).name}: tokenizer and context length read from the GGUF's metadata; its weights are "
                     "converted once (dequantized to float32, cached in ~/.cache/grpokit or $GRPOKIT_CACHE) by the first run")
    if note:  # a hub model neither cached nor fetchable: --check notes it, training cannot go on
        if training:
            problems.append(Problem("model.name_or_path", note, file=str(recipe.path)))
        else:
            notes.append(f"{note}; its tokenizer and prompt lengths are not checked")

    tokenizer = None
    if model_path and not note:
        log(f"loading tokenizer: {model_path}")
        try:
            tokenizer = load_tokenizer(model_path, recipe, offline_only=not training)
        except Exception as err:  # noqa: BLE001 - a broken model dir is a recipe problem, said plainly
            problems.append(Problem("model.name_or_path", f"cannot load its tokenizer: {describe_error(err)}",
                                    recipe.model["name_or_path"], file=str(recipe.path)))

    dataset = None
    try:
        log("loading dataset")
        source = recipe.blame("dataset.path" if recipe.dataset.get("path") else "dataset.name")
        raw = data.load_raw(recipe.dataset, origin=source)
        conversational = recipe.dataset["conversational"]
        if conversational == "auto":
            conversational = tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))
        dataset = data.prepare(raw, recipe.dataset, tokenizer, conversational, log=log, origin=source,
                               context_length=data.context_length(model_path), completion_length=args.max_completion_length)
        from grpokit.config.validate import reward_column_problems

        problems += reward_column_problems(recipe.rewards, dataset.column_names, str(recipe.path))
    except data.NotReachable:
        if training:
            problems.append(Problem("dataset.name", not_cached("dataset", recipe.dataset["name"]), file=str(recipe.path)))
        else:
            notes.append(f"{not_cached('dataset', recipe.dataset['name'])}; its columns are not checked")
    except RecipeError as err:
        problems += err.problems
    vllm_problems, vllm_notes = engine.environment(bool(args.use_vllm), _cuda(), vllm_version(), training)
    problems += [Problem("trainer.use_vllm", m, file=str(recipe.path)) for m in vllm_problems]
    notes += vllm_notes
    if not training:  # --check; a run finds out when it locks the folder (rundir.RunLock), before any weights load
        output_dir = Path(recipe.trainer["output_dir"])
        problems += rundir.forbidden_problems(output_dir, recipe.path, str(recipe.path))
        problems += rundir.writable_problems(output_dir, str(recipe.path))
    if problems:
        raise RecipeError(problems)
    return Prepared(recipe, args, lora, reward_funcs, model_path, tokenizer, dataset, notes)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def make_trainer(prep: Prepared, model):
    """The GRPOTrainer (or its dynamic-sampling subclass) exactly as `train()` uses it; tests call this too."""
    from trl import GRPOTrainer

    kwargs = dict(model=model, reward_funcs=prep.reward_funcs, args=prep.args, train_dataset=prep.dataset,
                  processing_class=prep.tokenizer, peft_config=prep.lora)
    if str(getattr(prep.args.eval_strategy, "value", prep.args.eval_strategy)) != "no":  # TRL's own periodic eval
        from grpokit.data import heldout_dataset

        kwargs["eval_dataset"] = heldout_dataset(prep.recipe, prep.tokenizer, log=say)
    if prep.recipe.sampling.get("dynamic"):
        from grpokit.dynamic_sampling import DynamicSamplingGRPOTrainer

        return DynamicSamplingGRPOTrainer(sampling=prep.recipe.sampling, **kwargs)
    return GRPOTrainer(**kwargs)


def train(recipe: Recipe, resume: str | None = None, overwrite: bool = False, continue_with: str | None = None):
    """Train a validated recipe; returns the trainer. Writes the resolved recipe first, then the run.

    The run directory is locked first, for the whole run (`rundir.RunLock`): a second run into it -- new,
    `--overwrite` or `--resume` -- is refused before it can delete or mix anything.
    """
    output_dir, origin = Path(recipe.trainer["output_dir"]), str(recipe.path)
    forbidden = rundir.forbidden_problems(output_dir, recipe.path, origin)
    if forbidden:  # before the lock: such a folder does not even get a lock file
        raise RecipeError(forbidden)
    with rundir.RunLock(output_dir, origin) as lock:
        return _train_locked(recipe, output_dir, lock, resume, overwrite, continue_with)


def already_finished(recipe: Recipe, output_dir: Path, resume: str, continue_with: str | None, lock=None) -> bool:
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
    last = rundir.latest_checkpoint(output_dir, quiet=True) if resume == "latest" else resume
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
    extend = continue_with or "python launch.py --recipe RECIPE --resume"
    say(f"the run in {output_dir} is finished (step {done} of trainer.max_steps {max_steps}); nothing to train. "
        f"To train it longer, raise trainer.max_steps: {extend} trainer.max_steps={2 * max_steps}")
    return True


def _train_locked(recipe: Recipe, output_dir: Path, lock, resume: str | None, overwrite: bool, continue_with: str | None):
    origin = str(recipe.path)
    previous = rundir.guard_output_dir(output_dir, resume, overwrite, origin, recipe.path)
    if resume is not None and already_finished(recipe, output_dir, resume, continue_with, lock):
        return None
    checkpoint = rundir.resolve_resume(resume, output_dir, origin)
    prep = prepare(recipe, training=True)
    say(f"building model: {recipe.model['name_or_path']} ({resolved_dtype(recipe.model)}, quantization {recipe.model['quantization']}, "
        + (f"LoRA r={recipe.lora['r']})" if recipe.lora else "full fine-tune)"))
    model = load_model(prep.model_path, recipe)
    # Every check has passed and the weights are in: only now does --overwrite remove the previous run.
    rundir.remove_previous(output_dir, previous, origin, lock)
    lock.begin()
    output_dir.mkdir(parents=True, exist_ok=True)
    if is_main_process():
        write_recipe_file(recipe, output_dir)
    from grpokit.progress import events

    for where in events(prep.args):  # before the trainer: it fixes TensorBoard's directory at construction
        say(where)
    trainer = make_trainer(prep, model)
    from grpokit.lifecycle import SaveFailed, StopOnSignal, Stopped, signal_name

    say(f"training: {prep.args.max_steps if prep.args.max_steps > 0 else prep.args.num_train_epochs} "
        f"{'steps' if prep.args.max_steps > 0 else 'epochs'} -> {output_dir}" + (f" (resuming {checkpoint})" if checkpoint else ""))
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
            raise Stopped(stop.signum, step=safe.stopped_at)  # not finished: no final save, the checkpoint is the run
        # Finished: a signal now waits until the final save and the report are written (seconds).
        stop.finishing = True
        lock.pending()  # the final save's files have names the trainer chooses: what appears now is the run's
        try:
            trainer.save_model(str(output_dir))
            trainer.save_state()  # trainer_state.json last: present and readable only once the final save is whole
        except Exception as err:  # noqa: BLE001
            raise SaveFailed("the final model", output_dir, err) from err
        if is_main_process():
            write_model_card(recipe, output_dir, trainer.state.global_step)
            finish_run(output_dir, recipe, prep.args, trainer)
        if stop.signum is not None:
            say(f"{signal_name(stop.signum)} came as the run finished: its final save and report were completed first")
    return trainer


def add_run_callbacks(trainer, stop):
    """What a grpokit run adds to the trainer's steps (bench/overhead.py measures the same): the compact progress
    lines, the first logged step's completions kept for report.md, and stopping at a step's end on a signal.
    Returns the `SafeStop` callback."""
    from grpokit import progress
    from grpokit.lifecycle import SafeStop
    from grpokit.reporting.report import keep_first_completions

    progress.install(trainer)
    keep_first_completions(trainer)  # report.md shows the first logged step's completions next to the last's
    safe = SafeStop(stop)
    trainer.add_callback(safe)
    return safe


def write_recipe_file(recipe: Recipe, output_dir: Path) -> Path:
    """Save the resolved recipe beside the run as `recipe.yaml`, rerunnable as is and portable with its folder.

    Files are written relative to the run folder (the loader reads a recipe's paths relative to its own folder)
    when they share more than the filesystem root with it, so a project copied elsewhere with its runs still
    reruns; `*_steps` counts that GRPOConfig types as float (a value below 1 is a fraction of the run) are
    written as the ints a person writes.
    """
    import copy
    import os

    from rewards import user_reward_file

    here = output_dir.resolve()

    def portable(path: str) -> str:
        target = Path(path)
        if not target.is_absolute() or os.path.commonpath([target, here]) == target.anchor:
            return path
        relative = os.path.relpath(target, here)
        return relative if relative.startswith("..") else f"./{relative}"

    data = copy.deepcopy(recipe.as_dict())
    if data["dataset"].get("path"):
        data["dataset"]["path"] = portable(data["dataset"]["path"])
    if Path(data["model"]["name_or_path"]).is_absolute():
        data["model"]["name_or_path"] = portable(data["model"]["name_or_path"])
    for reward in data["rewards"]:
        found = user_reward_file(reward["name"])
        if found:
            reward["name"] = f"{portable(found[0])}:{found[1]}"
    for key, value in data["trainer"].items():
        if key.endswith("_steps") and isinstance(value, float) and value.is_integer():
            data["trainer"][key] = int(value)
    path = output_dir / rundir.RECIPE_FILE
    ownership.replace_text(path, f"# resolved from {recipe.path} (overrides applied); paths are relative to this folder. Rerun: "
                    f"python launch.py --recipe {path}\n" + dump(data))
    return path


def finish_run(output_dir: Path, recipe: Recipe, args, trainer=None, compare=None) -> list[Path]:
    """Curves (PNG) and report.md for a finished run; with a live trainer, its early and last completions too;
    with `compare` (`reporting.compare.load_runs`), the runs side by side."""
    from grpokit.reporting.explain import explain_table
    from grpokit.reporting.plots import plot_run
    from grpokit.reporting.report import run_completions, write_report

    plots = plot_run(output_dir, args=args)
    completions = (run_completions(trainer) or None) if trainer is not None else None
    report = write_report(output_dir, recipe_name=recipe.name, explain_lines=[f"recipe: {recipe.path}", f"model: {recipe.model['name_or_path']}"] + explain_table(recipe, args),
                          completions=completions, plots=plots, args=args, compare=compare)
    for path in plots + [report]:
        say(f"wrote {path}")
    return plots + [report]


def run(recipe: Recipe, resume: str | None = None, overwrite: bool = False, continue_with: str | None = None) -> int:
    """Train a validated recipe as `launch.py` does; returns the exit code. A failing reward or Ctrl-C ends with
    a message saying where the run can go on from and the whole command that continues it (`continue_with`,
    from `rundir.resume_command`), not a traceback. Ctrl-C and SIGTERM stop at the end of the current step with a
    checkpoint (exit 130 / 143; a second signal stops at once); under a distributed launcher the process ends here
    (`dist.end_distributed`)."""
    import sys

    from rewards import RewardFailure

    from grpokit.lifecycle import SaveFailed

    output_dir = Path(recipe.trainer["output_dir"])
    try:
        train(recipe, resume=resume, overwrite=overwrite, continue_with=continue_with)
    except SaveFailed as err:
        print(f"run stopped: {err}", file=sys.stderr)
        print(save_failure_help(err, output_dir), file=sys.stderr)
        print(stopped_at(output_dir, continue_with), file=sys.stderr)
        code = EXIT_FAILED
    except (RewardFailure, KeyboardInterrupt) as err:  # Ctrl-C too: say where the run can go on from
        print(f"run stopped: {str(err) or 'interrupted'}", file=sys.stderr)
        print(stopped_at(output_dir, continue_with), file=sys.stderr)
        code = EXIT_FAILED if isinstance(err, RewardFailure) else getattr(err, "exit_code", EXIT_INTERRUPTED)
    else:
        code = 0
    end_distributed(code)
    return code


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
        shutil.rmtree(folder, ignore_errors=True)
        lines.append(f"removed the incomplete {folder}")
    return "\n".join(lines)


def stopped_at(output_dir: Path, continue_with: str | None) -> str:
    """The lines after "run stopped": the checkpoint a resume would start from, and the command that does it."""
    last = rundir.latest_checkpoint(output_dir, quiet=True)
    if last is None:
        return "no checkpoint was saved yet: the run starts over" + (f" with: {continue_with.removesuffix(' --resume')} --overwrite"
                                                                     if continue_with else "")
    return f"last checkpoint: {last}\ncontinue with: {continue_with}" if continue_with else f"last checkpoint: {last} (continue with --resume)"
