"""The run directory (`trainer.output_dir`): its checkpoints, which one to resume, and guarding a previous run.

A leaf: imports only grpokit's other leaves (errors, dist).
"""

from __future__ import annotations

from pathlib import Path

from grpokit.dist import is_main_process, say
from grpokit.errors import Problem, RecipeError

STATE_FILE = "trainer_state.json"  # what the trainer saves in output_dir and in every checkpoint-N/
RECIPE_FILE = "recipe.yaml"  # the resolved recipe a run saves beside its results


def guard_output_dir(output_dir: Path, resume: str | None, overwrite: bool, origin: str) -> None:
    """A previous run is never silently destroyed: a non-empty output_dir needs --resume or --overwrite.

    Only the main process judges: another rank could otherwise see the main one's fresh `recipe.yaml` and
    refuse its own run (or remove it under --overwrite); when the main process refuses, the launcher stops them all.
    """
    if resume or not is_main_process() or not output_dir.exists() or not any(output_dir.iterdir()):
        return
    if overwrite:
        import shutil

        say(f"--overwrite: removing the previous run in {output_dir}")
        shutil.rmtree(output_dir)
        return
    raise RecipeError([Problem("trainer.output_dir", "already holds a run; pass --resume to continue it, --overwrite to replace it, "
                               "or choose another trainer.output_dir=...", str(output_dir), file=origin)])


def latest_checkpoint(output_dir: Path) -> str | None:
    """The highest-numbered `checkpoint-N/` that holds a `trainer_state.json` (a complete one), if any."""
    found = [(int(p.name.partition("-")[2]), p) for p in Path(output_dir).glob("checkpoint-*")
             if p.name.partition("-")[2].isdigit() and (p / STATE_FILE).is_file()]
    return str(max(found)[1]) if found else None


def resolve_resume(resume: str | None, output_dir: Path, origin: str) -> str | None:
    """The checkpoint directory `--resume` means (None: start afresh); raises `RecipeError` when there is none."""
    if resume is None:
        return None
    if resume == "latest":
        found = latest_checkpoint(output_dir)
        if found is None:
            raise RecipeError([Problem("--resume", "no checkpoint to resume in trainer.output_dir", str(output_dir), file=origin)])
        return found
    if not (Path(resume) / STATE_FILE).exists():
        raise RecipeError([Problem("--resume", f"is not a checkpoint directory (no {STATE_FILE})", resume, file=origin)])
    return resume
