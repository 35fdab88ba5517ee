"""A hostile pass on two promises: grpokit deletes only what it wrote, and code under test never decides its own score.

Each test reproduces one defect found by trying to break a promise; each fails until the defect is fixed.
Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import pytest
from helpers import fake_run, with_trainer, write_recipe

from grpokit import ownership
from grpokit.cli import main
from grpokit.errors import RecipeError
from grpokit.rundir import LOCK_FILE, RunLock


# Reproduces: a refused launch into a run folder (here: a new run without --resume/--overwrite, exit 2) records the
# folder's manifest on its way out (RunLock.__exit__ -> Recorder.record), re-listing every file inside each listed
# folder *as it is now* -- a user's file put inside checkpoint-1 becomes "grpokit's", and the next --overwrite
# deletes it. Seen end to end with launch.py: `--overwrite` refused naming checkpoint-1/notes.txt, the same command
# again removed it.
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


# Reproduces: the same laundering through a refused --overwrite itself: remove() refuses because of the user's file,
# RunLock.__exit__ then records it as the run's, and a second --overwrite removes it.
def test_a_refused_overwrite_launders_the_file_it_refused_for(tmp_path):
    run = fake_run(tmp_path / "run")
    notes = run / "checkpoint-1" / "notes.txt"
    notes.write_text("mine")
    for _ in range(2):
        with pytest.raises(RecipeError, match="notes.txt"):
            with RunLock(run, "recipe.yaml"):
                ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert notes.is_file()


# Reproduces: a `.grpokit.lock` that is a symbolic link (planted in a shared folder, or copied along) is followed:
# RunLock opens it with O_CREAT (no O_NOFOLLOW), truncates and writes its pid line into the file it points to --
# a file grpokit did not write, destroyed by merely launching a run into the folder.
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


# Reproduces: `.grpokit-files.partial` (the manifest's temporary file) as a symbolic link is written through by
# ownership._store (Path.write_text follows links): the file it points to is overwritten with manifest JSON.
def test_the_manifest_temporary_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").write_text("# run")
    (run / f"{ownership.MANIFEST}.partial").symlink_to(victim)
    ownership.claim(run, ["report.md"])
    assert victim.read_text() == "precious"


# Reproduces: ownership.write_text's temporary `.NAME.partial` (eval.json, --eval-out) is written through a symlink.
def test_write_texts_temporary_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".eval.json.partial").symlink_to(victim)
    ownership.write_text(run / "eval.json", "{}")
    assert victim.read_text() == "precious"


# Reproduces: the merge of 'trust-inputs' (351927f) left three statements at column 0 inside functions
# (grpokit/merge.py `previous = _check_inputs(...)`, grpokit/evaluate.py `path = ...` and `ownership.write_text(...)`):
# both modules fail to import (IndentationError), so `launch.py --merge` and `--eval` crash with a traceback.
@pytest.mark.parametrize("module", ["grpokit.merge", "grpokit.evaluate"])
def test_merge_and_eval_modules_import(module):
    import importlib

    importlib.import_module(module)


# Reproduces: `--merge A --merge-out B --overwrite` where B is a run that is training right now (its lock held):
# the merge never looks at the lock and removes the live run's checkpoints, recipe.yaml and model card, then writes
# the merged model among the files the run goes on writing. Seen end to end: T/checkpoint-5 and T/recipe.yaml gone
# mid-training. docs/troubleshooting.md: "One run per folder ... exits 2 before anything is touched".
def test_merge_out_overwrite_refuses_a_folder_a_run_is_training_in(tmp_path):
    from grpokit.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    live = fake_run(tmp_path / "B")
    with RunLock(live, "recipe.yaml"):
        with pytest.raises(RecipeError):
            _previous_merge(adapter_run, live, overwrite=True)
    assert (live / "checkpoint-1" / "trainer_state.json").is_file()


# Reproduces: `--merge-out B --overwrite` where B is another (finished) training run, not a previous merge: the whole
# run -- checkpoints, adapter, recipe.yaml, report -- is removed and replaced by a merged model, with no word that B
# was a run. docs/troubleshooting.md promises `--merge-out DIR --overwrite` replaces a previous merge.
def test_merge_out_overwrite_refuses_a_training_run(tmp_path):
    from grpokit.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    other = fake_run(tmp_path / "B")
    (other / LOCK_FILE).write_text("pid 1 on host\n")  # what every run leaves behind
    with pytest.raises(RecipeError):
        _previous_merge(adapter_run, other, overwrite=True)


# Reproduces: `--resume` continues a run whose trainer rotates checkpoints (save_total_limit, as recipes/smoke.yaml
# sets): TRL's rotation rmtree's an old checkpoint-N whole, a user's file inside it included -- grpokit's ownership
# check never runs on that path. Seen end to end with launch.py --resume trainer.max_steps=4 ... save_total_limit=2.
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


# Reproduces: `--resume` skips every ownership check (rundir.guard_output_dir returns at once for a resume), so a
# folder holding a user's files and a checkpoint -- a Hugging Face Trainer's output, a copied checkpoint, a run from
# before the manifest -- has them replaced: README.md (the model card), recipe.yaml and report.md are written over
# (Path.write_text, never ownership.write_text). Seen end to end: a real --resume overwrote all three.
# Cheap form: a finished checkpoint makes --resume complete the final save, which writes the card over README.md.
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


# Reproduces: the manifest keeps names whose entries are gone. `rm -rf run/*` (the shell's * skips the dotfile
# .grpokit-files) empties a run; a file the user later puts there under a name the old run used (report.md,
# README.md, config.json ...) counts as grpokit's: a new run says "already holds a run; pass --overwrite", and
# --overwrite deletes the user's file.
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


# Reproduces: folders a user makes inside a run's checkpoint are invisible to the check when they hold no file
# (ownership.contents lists files and links only), so --overwrite removes them: a folder grpokit did not write.
def test_a_users_empty_folder_inside_a_checkpoint_stops_the_removal(tmp_path):
    run = fake_run(tmp_path / "run")
    (run / "checkpoint-1" / "my-experiments" / "todo").mkdir(parents=True)
    with pytest.raises(RecipeError, match="my-experiments"):
        ownership.remove(run, ownership.listed(run), "trainer.output_dir")


# Reproduces: `--plot RUN` where RUN/plots (listed: grpokit made it) is now a symbolic link to a user's folder holding
# their own training.png: ownership.replaceable() finds "plots" in the manifest and calls the user's file grpokit's,
# and plot_run's savefig writes through the link. Seen end to end: `launch.py --plot PL` replaced the user's PNG.
def test_plot_never_replaces_a_file_reached_through_a_symlinked_plots_folder(tmp_path):
    run = fake_run(tmp_path / "run", names=("plots", "report.md"))
    (run / "plots").unlink()  # fake_run made it a file; a folder or a file, a link now stands in its place
    theirs = tmp_path / "my-figures"
    theirs.mkdir()
    (theirs / "training.png").write_text("MY figure")
    (run / "plots").symlink_to(theirs)
    with pytest.raises(RecipeError):
        ownership.refuse_unless_replaceable([run / "report.md", run / "plots" / "training.png"], root=run, key="--plot")


# Reproduces: rewards/_judge.py learns the setup's names from its assignments, defs and imports only; a setup that
# binds names another way -- a star import (`from string import *`, MBPP-style test_imports), `globals()[...] = ...`,
# `exec(...)` -- leaves them out, so a test comparing with such a name (`assert add(1, 2) == EXPECTED`) is planned as
# a value check whose *expected side is a probe too*: the graded code rebinds the name and chooses both values. A
# wrong solution scores 1.0 (docs/troubleshooting.md: a test that needs the setup's names is opaque; value checks cannot be forged).
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
