"""The files grpokit writes into a run folder beside the trainer's: the resolved `recipe.yaml` (when the run
starts), and the curves and `report.md` (when it finishes, or on `--plot`).
"""

from __future__ import annotations

from pathlib import Path

from grpokit import files
from grpokit.checkpoints import rundir
from grpokit.config import Recipe, dump
from grpokit.dist import say


def write_recipe_file(recipe: Recipe, output_dir: Path) -> Path:
    """Save the resolved recipe beside the run as `recipe.yaml`, rerunnable as is and portable with its folder.

    Files are written relative to the run folder (the loader reads a recipe's paths relative to its own folder)
    when they share more than the filesystem root with it, so a project copied elsewhere with its runs still
    reruns; `*_steps` counts are written as the ints a person writes (`config.dump`).
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
    path = output_dir / rundir.RECIPE_FILE
    files.write_text(path, f"# resolved from {recipe.path} (overrides applied); data, model and reward paths are relative to this folder, "
                    f"output_dir is the run's own. Rerun into a new folder: "
                    f"python launch.py --recipe {path} trainer.output_dir=DIR\n" + dump(data))
    return path


def finish_run(output_dir: Path, recipe: Recipe, args, trainer=None, compare=None, resumed_at: int | None = None,
               stopped: BaseException | None = None, continue_with: str | None = None) -> list[Path]:
    """Curves (PNG) and report.md for a finished run; with a live trainer, its early and last completions and the
    step its session resumed at (`resumed_at`), kept with the run first (`report_record.json`) so any later report
    shows them too; with `compare` (`reporting.compare.load_runs`), the runs side by side. `stopped`: the signal
    that stopped the run at a step's end (`lifecycle.Stopped`): the report is of the run so far, says so, and names
    the command that continues it (`continue_with`)."""
    from grpokit.reporting.explain import explain_table
    from grpokit.reporting.failed_calls import run_failed_calls
    from grpokit.reporting.plots import plot_run
    from grpokit.reporting.report import read_record, run_completions, store_record, write_report

    plots = plot_run(output_dir, args=args)
    completions = (store_record(output_dir, run_completions(trainer), resumed_at, recipe.name,
                                run_failed_calls(trainer)) or None if trainer is not None else None)
    # drawn again (`--plot`, `--eval`), `recipe` is the run's saved recipe.yaml: the name is the one the run kept
    name = recipe.name if trainer is not None else read_record(output_dir)["recipe_name"] or recipe.name
    from grpokit.prompts.data import source_name

    model = recipe.model["name_or_path"] + (", GRPO from its warm start (warm_start/)" if recipe.warm_start else "")
    head = [f"recipe: {recipe.path}", f"model: {model}", f"data: {source_name(recipe.dataset)}"]
    report = write_report(output_dir, recipe_name=name, explain_lines=head + explain_table(recipe, args),
                          completions=completions, plots=plots, args=args, compare=compare,
                          stopped=_stopped_note(stopped, continue_with) if stopped is not None else None)
    for path in plots + [report]:
        say(f"wrote {path}")
    if trainer is not None and stopped is None:  # the end of a live run: report.md's verdict, where it is watched
        from grpokit.reporting.last_word import last_word
        from grpokit.reporting.tool_calls import failed_at_end

        history = trainer.state.log_history
        verdict = last_word(history, tools_failed=failed_at_end(history))
        if verdict:
            say(verdict)
    return plots + [report]


def _stopped_note(stopped: BaseException, continue_with: str | None) -> str:
    """report.md's first words about a run stopped at a step's end: what stopped it, and how it goes on."""
    go_on = f"`{continue_with}`" if continue_with else "`--resume`"
    return (f"**This run stopped** ({stopped}): the report is of the run so far, not of a finished run. Continue it "
            f"with {go_on}; its report is written again when it stops or finishes.")
