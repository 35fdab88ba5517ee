"""A run's life in its directory: which checkpoint counts, one run per directory, stopping on a signal, a finished
run left alone, a failed save said plainly, and the run's own files (recipe.yaml, model card) portable and true.

Real-process tests start `launch.py` on the tiny model and synchronise through pipes the reward writes to or
reads from at a known step -- never through sleeps or polling.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import with_trainer, write_recipe

from grpokit import rundir
from grpokit.errors import RecipeError


def fake_checkpoint(run: Path, step: int, state: str | None = None) -> Path:
    """A checkpoint-N/ holding only a trainer_state.json (what the finder reads); `state` replaces its text."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    text = json.dumps({"global_step": step, "max_steps": 4, "log_history": []}) if state is None else state
    (folder / rundir.STATE_FILE).write_text(text)
    return folder


# ---------------------------------------------------------------------------------------------------------
# Issue 13.2: a checkpoint counts only when its trainer_state.json (written last by the trainer) is readable


@pytest.mark.parametrize(
    "damage",
    [
        "",  # 0 bytes: the disk filled up as the file was opened
        '{"global_step": 3, "log_hist',  # cut mid-write
        "[1, 2]",  # valid JSON, not a trainer state
        '{"log_history": []}',  # no global_step
    ],
    ids=["empty", "truncated", "not-a-state", "no-step"],
)
def test_a_damaged_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path, capsys, damage):
    run = tmp_path / "run"
    good = fake_checkpoint(run, 2)
    bad = fake_checkpoint(run, 3, state=damage)
    assert rundir.latest_checkpoint(run) == str(good)
    err = capsys.readouterr().err
    assert f"skipping {bad}: its {rundir.STATE_FILE} is damaged" in err


def test_resume_from_a_damaged_checkpoint_is_a_clear_error(tmp_path):
    bad = fake_checkpoint(tmp_path / "run", 3, state="")
    with pytest.raises(RecipeError) as err:
        rundir.resolve_resume(str(bad), tmp_path / "run", "recipe.yaml")
    assert f"is not a complete checkpoint (its {rundir.STATE_FILE} is damaged" in str(err.value)


def test_resume_latest_picks_the_good_checkpoint_over_a_damaged_newer_one(tmp_path):
    good = fake_checkpoint(tmp_path / "run", 2)
    fake_checkpoint(tmp_path / "run", 3, state='{"global_st')
    assert rundir.resolve_resume("latest", tmp_path / "run", "recipe.yaml") == str(good)


# ---------------------------------------------------------------------------------------------------------
# Issue 14.3: `--resume` takes no value, `--resume-from PATH` names a checkpoint; a stopped run says the
# whole command that continues it


def dispatched(monkeypatch, argv):
    """What `launch.py argv` hands to training.run (the recipe's max_steps, resume, continue command)."""
    from grpokit import training
    from grpokit.cli import main

    seen = {}

    def fake_run(recipe, resume=None, overwrite=False, continue_with=None):
        seen.update(max_steps=recipe.trainer["max_steps"], resume=resume, continue_with=continue_with)
        return 0

    monkeypatch.setattr(training, "run", fake_run)
    return main(argv), seen


def test_resume_takes_no_value_so_an_override_after_it_stays_an_override(tmp_path, monkeypatch):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    code, seen = dispatched(monkeypatch, ["--recipe", str(path), "--resume", "trainer.max_steps=40"])
    assert code == 0 and seen["resume"] == "latest" and seen["max_steps"] == 40


def test_resume_from_names_a_checkpoint(tmp_path, monkeypatch):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    code, seen = dispatched(monkeypatch, ["--recipe", str(path), "--resume-from", "runs/x/checkpoint-3"])
    assert code == 0 and seen["resume"] == "runs/x/checkpoint-3" and seen["max_steps"] == 2


def test_resume_and_resume_from_together_are_refused(tmp_path, monkeypatch, capsys):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    code, seen = dispatched(monkeypatch, ["--recipe", str(path), "--resume", "--resume-from", "runs/x/checkpoint-3"])
    assert code == 2 and not seen
    assert "--resume-from: give either --resume (the latest checkpoint) or --resume-from PATH, not both" in capsys.readouterr().err


def test_the_continue_command_keeps_the_runs_overrides_and_drops_one_off_flags(tmp_path, monkeypatch):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    argv = ["--recipe", str(path), "trainer.beta=0.04", "--overwrite", "lora.target_modules=[q_proj, v_proj]"]
    code, seen = dispatched(monkeypatch, argv)
    assert seen["continue_with"] == f"python launch.py --recipe {path} trainer.beta=0.04 'lora.target_modules=[q_proj, v_proj]' --resume"
    code, seen = dispatched(monkeypatch, ["--resume-from", "runs/x/checkpoint-3", "--recipe", str(path)])
    assert seen["continue_with"] == f"python launch.py --recipe {path} --resume"


def test_a_stopped_run_says_the_whole_command_to_continue(tmp_path, capsys, monkeypatch):
    from grpokit import training
    from grpokit.cli import main

    path = write_recipe(tmp_path, with_trainer(tmp_path))
    fake_checkpoint(tmp_path / "run", 3)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    assert main(["--recipe", str(path), "trainer.max_steps=4", "--resume"]) == 130
    err = capsys.readouterr().err
    assert f"last checkpoint: {tmp_path / 'run' / 'checkpoint-3'}" in err
    assert f"continue with: python launch.py --recipe {path} trainer.max_steps=4 --resume" in err
