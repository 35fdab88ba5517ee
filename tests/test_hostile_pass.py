"""Hostile inputs against two promises: grpokit deletes only what it wrote, and code under test never decides its own score.

Each test pins one rule (its `Rule:` comment) where a hostile input could break a promise.
Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import pytest
from helpers import fake_run, with_trainer, write_recipe

from grpokit.files import ownership
from grpokit.cli import main
from grpokit.errors import RecipeError
from grpokit.rundir import LOCK_FILE, RunLock


# Rule: a refused launch into a run folder (here: a new run without --resume/--overwrite, exit 2) records nothing
# new on its way out (RunLock.__exit__ -> Recorder.record): a user's file inside a listed folder (checkpoint-1)
# never becomes "grpokit's", so no later --overwrite deletes it.
def test_a_refused_launch_launders_a_users_file_inside_a_checkpoint(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    notes = run / "checkpoint-1" / "notes.txt"
    notes.write_text("mine")
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(run)))
    assert main(["--recipe", str(path)]) == 2  # "already holds a run": refused, nothing trained
    capsys.readouterr()
    with pytest.raises(RecipeError, match="notes.txt"):  # what --overwrite does once the new run's weights load
        ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert notes.is_file()


# Rule: the same for a refused --overwrite itself: remove() refuses because of the user's file, and the refusal
# does not record that file as the run's, so a second --overwrite refuses too.
def test_a_refused_overwrite_launders_the_file_it_refused_for(tmp_path):
    run = fake_run(tmp_path / "run")
    notes = run / "checkpoint-1" / "notes.txt"
    notes.write_text("mine")
    for _ in range(2):
        with pytest.raises(RecipeError, match="notes.txt"):
            with RunLock(run, "recipe.yaml"):
                ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert notes.is_file()


# Rule: a `.grpokit.lock` that is a symbolic link (planted in a shared folder, or copied along) is never followed:
# the launch is refused, naming the link, and writes its pid line into no file grpokit did not write.
def test_the_lock_file_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).symlink_to(victim)
    with pytest.raises(RecipeError, match="symbolic link"):  # refused, naming the link
        with RunLock(run, "recipe.yaml"):
            pass
    assert victim.read_text() == "precious"


# Rule: `.grpokit-files.partial` (the manifest's temporary file) as a symbolic link is not written through by
# ownership._store: the file it points to keeps its content.
def test_the_manifest_temporary_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").write_text("# run")
    (run / f"{ownership.MANIFEST}.partial").symlink_to(victim)
    ownership.claim(run, ["report.md"])
    assert victim.read_text() == "precious"


# Rule: ownership.write_text's temporary `.NAME.partial` (eval.json, --eval-out) is never written through a symlink.
def test_write_texts_temporary_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".eval.json.partial").symlink_to(victim)
    ownership.write_text(run / "eval.json", "{}")
    assert victim.read_text() == "precious"


# Rule: grpokit/merge.py and grpokit/evaluate.py import (no statement left at the wrong indentation), so
# `launch.py --merge` and `--eval` reach their own messages, never a traceback.
@pytest.mark.parametrize("module", ["grpokit.merge", "grpokit.evaluate"])
def test_merge_and_eval_modules_import(module):
    import importlib

    importlib.import_module(module)


# Rule: `--merge A --merge-out B --overwrite` where B is a run that is training right now (its lock held) exits 2
# and touches nothing: the live run keeps its checkpoints, recipe.yaml and model card.
# docs/troubleshooting.md: "One run per folder ... exits 2 before anything is touched".
def test_merge_out_overwrite_refuses_a_folder_a_run_is_training_in(tmp_path):
    from grpokit.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    live = fake_run(tmp_path / "B")
    with RunLock(live, "recipe.yaml"):
        with pytest.raises(RecipeError):
            _previous_merge(adapter_run, live, overwrite=True)
    assert (live / "checkpoint-1" / "trainer_state.json").is_file()


# Rule: `--merge-out B --overwrite` replaces only a previous merge; where B is a (finished) training run it is
# refused, naming the run, and its checkpoints, adapter, recipe.yaml and report stay (docs/troubleshooting.md).
def test_merge_out_overwrite_refuses_a_training_run(tmp_path):
    from grpokit.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    other = fake_run(tmp_path / "B")
    (other / LOCK_FILE).write_text("pid 1 on host\n")  # what every run leaves behind
    with pytest.raises(RecipeError):
        _previous_merge(adapter_run, other, overwrite=True)


# Rule: `--resume` of a run whose trainer rotates checkpoints (save_total_limit, as recipes/smoke.yaml sets) never
# lets TRL's rotation remove a user's file inside an old checkpoint-N: the ownership check covers that path too.
@pytest.mark.slow
def test_resume_rotation_keeps_a_users_file_inside_an_old_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(run), max_steps=1, save_strategy="steps", save_steps=1))
    assert main(["--recipe", str(path)]) == 0
    notes = run / "checkpoint-1" / "notes.txt"
    notes.write_text("mine")
    code = main(["--recipe", str(path), "--resume", "trainer.max_steps=3", "trainer.save_total_limit=1"])
    capsys.readouterr()
    assert notes.is_file() or code == 2  # kept, or the resume refused naming it


# Rule: `--resume` runs the ownership checks too: a folder holding a user's files and a checkpoint -- a Hugging Face
# Trainer's output, a copied checkpoint, a run without a manifest -- keeps its README.md, recipe.yaml and report.md;
# grpokit writes over none of them. Cheap form: a finished checkpoint makes --resume complete the final save, which
# would write the card over README.md.
def test_resume_never_writes_over_a_users_files(tmp_path, capsys, tiny_model_dir):
    run = tmp_path / "X"
    (run / "checkpoint-1").mkdir(parents=True)
    (run / "checkpoint-1" / "trainer_state.json").write_text('{"global_step": 1, "log_history": [{"step": 1, "reward": 0.5, "loss": 0.1}]}')
    readme = run / "README.md"
    readme.write_text("MY README")
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(run), max_steps=1))
    code = main(["--recipe", str(path), "--resume"])
    capsys.readouterr()
    assert readme.read_text() == "MY README" or code == 2


# Rule: a manifest name whose entry is gone claims nothing. After `rm -rf run/*` (the shell's * skips the dotfile
# .grpokit-files), a file the user later puts there under a name the old run used (report.md, README.md,
# config.json ...) is the user's: --overwrite refuses, naming it.
def test_a_stale_manifest_entry_does_not_claim_a_users_new_file(tmp_path):
    from grpokit.rundir import guard_output_dir

    run = fake_run(tmp_path / "run", names=("checkpoint-1", "report.md"))
    import shutil

    shutil.rmtree(run / "checkpoint-1")
    (run / "report.md").unlink()
    (run / "report.md").write_text("MY report, written after I emptied the folder")
    with pytest.raises(RecipeError, match="report.md"):  # refused, naming the file that is no longer grpokit's
        guard_output_dir(run, None, True, "recipe.yaml")
    ownership.remove(run, ["report.md"], "trainer.output_dir")  # and removal itself passes it over
    assert (run / "report.md").is_file()


# Rule: a folder a user makes inside a run's checkpoint is the user's even when it holds no file, so --overwrite
# refuses rather than removing it.
def test_a_users_empty_folder_inside_a_checkpoint_stops_the_removal(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "checkpoint-1" / "my-experiments" / "todo").mkdir(parents=True)
    with pytest.raises(RecipeError, match="my-experiments"):
        ownership.remove(run, ownership.listed(run), "trainer.output_dir")


# Rule: `--plot RUN` where RUN/plots (listed: grpokit made it) is now a symbolic link to a user's folder holding
# their own training.png writes nothing through the link: ownership.replaceable() does not call the user's file grpokit's.
def test_plot_never_replaces_a_file_reached_through_a_symlinked_plots_folder(tmp_path):
    run = fake_run(tmp_path / "run", names=("plots", "report.md"))
    (run / "plots").unlink()  # fake_run made it a file; a folder or a file, a link now stands in its place
    theirs = tmp_path / "my-figures"
    theirs.mkdir()
    (theirs / "training.png").write_text("MY figure")
    (run / "plots").symlink_to(theirs)
    with pytest.raises(RecipeError):
        ownership.refuse_unless_replaceable([run / "report.md", run / "plots" / "training.png"], root=run, key="--plot")


# Rule: a setup that binds names other than by assignment, def or import -- a star import (`from string import *`,
# MBPP-style test_imports), `globals()[...] = ...`, `exec(...)` -- makes a test comparing with such a name
# (`assert add(1, 2) == EXPECTED`) opaque, never a value check whose expected side the graded code can rebind:
# a wrong solution does not score 1.0 (docs/troubleshooting.md: a test that needs the setup's names is opaque;
# value checks cannot be forged).
@pytest.mark.parametrize("setup, test, code", [
    ("globals()['EXPECTED'] = 3", "assert add(1, 2) == EXPECTED",
     "def add(a, b):\n    global EXPECTED\n    EXPECTED = 0\n    return 0"),
    ("exec('REF = [1, 2, 3]')", "assert my_sort([3, 1, 2]) == REF",
     "def my_sort(x):\n    global REF\n    REF = None\n    return None"),
    ("from string import *", "assert count_letters() == len(ascii_lowercase)",
     "def count_letters():\n    global ascii_lowercase\n    ascii_lowercase = 'abc'\n    return 3"),
])
def test_a_wrong_solution_cannot_rebind_a_setup_name_it_is_compared_with(setup, test, code):
    from rewards._sandbox import run

    assert run(code, [test], setup).passed == [False]
