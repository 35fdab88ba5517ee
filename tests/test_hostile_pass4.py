"""Hostile inputs against two promises: grpokit deletes only what it wrote, and code under test never decides its
own score.

Each test pins one rule (its `Rule:` comment) where a hostile input could break a promise. Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import importlib.util

import pytest
import helpers
from helpers import load_bench

from grpokit.files import ownership
from grpokit.rundir import RunLock


def fake_run(folder):
    """A run with a checkpoint and, at the top, its recipe and report."""
    return helpers.fake_run(folder, ("checkpoint-1", "recipe.yaml", "report.md"),
                            checkpoint_files=("trainer_state.json", "adapter_model.safetensors"), text="grpokit's")


class _Stop(Exception):
    pass


# Rule: `python bench/gpu_memory.py --pack-deps DIR` respects the run lock, as --merge-out does
# (test_merge_out_overwrite_refuses_a_folder_a_run_is_training_in): pointed (by a typo, or a shared
# `--pack-deps runs/x`) at a run that is training right now, it removes none of its checkpoints, recipe or report --
# README "One run per folder": a second user of the folder "exits 2 before anything is touched".
def test_pack_deps_never_removes_a_live_training_run(tmp_path, monkeypatch):
    gpu_memory = load_bench("gpu_memory")
    live = fake_run(tmp_path / "runs" / "live")

    def stop(name, *a, **k):  # stop right after the removal: no need to copy trl & co. to see it
        raise _Stop(name)

    monkeypatch.setattr(importlib.util, "find_spec", stop)
    with RunLock(live, "recipe.yaml"):
        with pytest.raises((SystemExit, _Stop, Exception)):
            gpu_memory.pack_deps(live)
        assert (live / "checkpoint-1" / "trainer_state.json").is_file(), "a live run's checkpoint was deleted"
        assert (live / "recipe.yaml").is_file()


# Rule: `--merge A --merge-out LINK --overwrite` where LINK is a symbolic link to a training run (`runs/latest ->
# runs/exp7`, the usual "latest" link) is refused like the run's folder itself, live or not, and removes nothing
# through the link. README: "a merge never writes into ... any training run's folder"; "One run per folder ... exits
# 2 before anything is touched".
def test_merge_out_through_a_symlink_refuses_a_training_run(tmp_path):
    from grpokit.errors import RecipeError
    from grpokit.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "runs" / "exp6")
    live = fake_run(tmp_path / "runs" / "exp7")
    latest = tmp_path / "runs" / "latest"
    latest.symlink_to(live)
    with RunLock(live, "recipe.yaml"):
        try:
            previous = _previous_merge(adapter_run, latest, overwrite=True)
        except RecipeError:
            previous = None  # refused: what the rule asks
        if previous is not None:  # what merge() does next, once the merged model is built
            ownership.remove(latest, previous, "--merge-out")
        assert (live / "checkpoint-1" / "trainer_state.json").is_file(), "the live run's checkpoint was deleted"
        assert (live / "recipe.yaml").is_file()
