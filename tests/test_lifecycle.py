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
