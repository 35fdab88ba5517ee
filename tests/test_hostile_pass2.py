"""Hostile inputs against two promises: grpokit deletes only what it wrote, and code under test never decides its
own score.

Each test pins one rule (its `Rule:` comment) where a hostile input could break a promise. Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import os
import shutil

import helpers
import pytest
from helpers import age_claims, overwrite

from grpokit.files import ownership
from grpokit.errors import RecipeError


def fake_run(folder):
    """A finished run whose checkpoint holds a model card and weights beside its state, and a report at the top."""
    return helpers.fake_run(folder, ("checkpoint-1", "trainer_state.json", "recipe.yaml", "report.md"),
                            checkpoint_files=("trainer_state.json", "README.md", "adapter_model.safetensors"), text="grpokit's")


# Rule: a file grpokit wrote inside one of the run's folders and the user then edited -- the checkpoint's model card
# README.md filled in with their evaluation notes, or adapter_model.safetensors replaced by weights of their own
# under the same name -- is the user's: --overwrite (and the trainer's checkpoint rotation after --resume) refuses
# to remove it, as at the top of the folder (docs/troubleshooting.md: "an entry replaced or edited since is no
# longer grpokit's").
def test_a_file_edited_inside_a_checkpoint_is_no_longer_grpokits(tmp_path):
    run = fake_run(tmp_path / "run")
    card = run / "checkpoint-1" / "README.md"
    card.write_text("# my evaluation notes for this checkpoint, written over two days\n" * 20)
    with pytest.raises(RecipeError, match="README.md"):
        overwrite(run)
    assert card.is_file()


# Rule: a file edited in place to the same size whose mtime is then restored (`touch -r`, `cp -p`/`rsync -t` over
# it, an editor that keeps times) is the user's: the change time (st_ctime), which no user can set back, is part of
# an entry's identity, so --overwrite refuses to remove the edit.
def test_a_file_edited_keeping_its_size_and_mtime_is_no_longer_grpokits(tmp_path):
    run = fake_run(tmp_path / "run")
    report = run / "report.md"
    before = os.stat(report)
    report.write_text("MY report")  # as long as "grpokit's"
    os.utime(report, ns=(before.st_atime_ns, before.st_mtime_ns))  # touch -r
    assert os.stat(report).st_size == before.st_size
    with pytest.raises(RecipeError, match="report.md"):
        overwrite(run)
    assert report.read_text() == "MY report"


# Rule: a checkpoint a user copies in under the run's name (checkpoint-1, from another machine, to resume from it)
# after removing the run's own is the user's, even when ext4 hands it the freed inode back and it holds the
# trainer's standard file names: --overwrite refuses. (On a filesystem that does not reuse the inode at once this
# test passes trivially.)
def test_a_checkpoint_copied_in_over_a_removed_one_is_not_grpokits(tmp_path):
    run = fake_run(tmp_path / "run")
    theirs = tmp_path / "from-cluster" / "checkpoint-1"
    theirs.mkdir(parents=True)
    for name in ("trainer_state.json", "README.md", "adapter_model.safetensors"):
        (theirs / name).write_text("THEIR weights, trained for a week")
    shutil.rmtree(run / "checkpoint-1")
    shutil.copytree(theirs, run / "checkpoint-1")
    with pytest.raises(RecipeError, match="checkpoint-1"):
        overwrite(run)
    assert (run / "checkpoint-1" / "adapter_model.safetensors").read_text() == "THEIR weights, trained for a week"


# Rule: a checkpoint claimed before its first byte (`claim_writing`, from SafeStop.on_step_end) and never recorded
# (a SIGKILL: OOM killer, scancel -s KILL, a node lost) does not claim whatever later stands under its name: a folder
# of the user's put there after the half-written checkpoint-2 was removed is refused by --overwrite, as a stale
# recorded entry is (test_a_stale_manifest_entry_does_not_claim_a_users_new_file).
def test_a_claim_left_by_a_killed_save_does_not_claim_a_users_later_folder(tmp_path):
    run = fake_run(tmp_path / "run")
    ownership.claim_writing(run, "checkpoint-2")  # the save starts ... and the process is SIGKILLed here
    (run / "checkpoint-2").mkdir()  # the half-written checkpoint, removed by the user below
    (run / "checkpoint-2" / "model.safetensors").write_text("half")
    shutil.rmtree(run / "checkpoint-2")
    age_claims(run, 2 * ownership.SAVE_WINDOW_NS)  # days later (past the save window) ...
    mine = run / "checkpoint-2"  # ... the user's own folder under that name
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match="checkpoint-2"):
        overwrite(run)
    assert (mine / "notes.txt").is_file()


# Rule: grpokit's report (write_report), model card (write_model_card) and recipe.yaml (write_recipe_file) are
# written as a fresh file renamed over the old one (ownership.write_text), never in place: a run folder snapshotted
# with hard links -- `cp -al runs/my backups/my-monday`, rsync --link-dest, rsnapshot -- keeps the backup's
# report.md as it was through `--plot` (and --resume, and --eval's report refresh).
def test_plot_never_changes_a_hard_linked_backup_of_the_report(tmp_path, capsys):
    from grpokit.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text('{"global_step": 1, "log_history": [{"step": 1, "reward": 0.5, "loss": 0.1}]}')
    ownership.claim(run, ["trainer_state.json"])
    ownership.write_text(run / "report.md", "# Monday's report\n")
    backup = tmp_path / "backups" / "run-monday"
    backup.mkdir(parents=True)
    os.link(run / "report.md", backup / "report.md")  # cp -al run backups/run-monday
    assert main(["--plot", str(run)]) in (0, 2)  # replaced as a new file, or refused: the link changed its change time
    capsys.readouterr()
    assert (backup / "report.md").read_text() == "# Monday's report\n"
    ownership.replace_text(run / "report.md", "# Tuesday's report\n")  # how every report, card and recipe is written
    assert (backup / "report.md").read_text() == "# Monday's report\n"


# Rule: a `for` over a literal whose item holds a probe (`for v in [f(4)]: ...`) evaluates the item once, as Python
# does: graded code that counts its calls and answers each use differently (10 for `v > 3`, then 0 for `v < 5`)
# cannot pass a test that no single value but 4 passes; a wrong solution does not score 1.0
# (docs/troubleshooting.md: a loop over a literal is a value check, which cannot be forged).
def test_an_unrolled_loop_item_is_one_value_not_one_probe_per_use():
    from rewards._sandbox import run

    code = "calls = [0]\ndef f(x):\n    calls[0] += 1\n    return 10 if calls[0] % 2 else 0"
    test = "for v in [f(4)]:\n    assert v > 3 and v < 5"
    with pytest.raises(AssertionError):  # Python itself: the code fails the test
        namespace = {}
        exec(code, namespace)
        exec(test, namespace)
    assert run(code, [test]).passed == [False]


# Rule: a dataset test looping over `range(<literal past 2**63>)` (too long for a C ssize_t) is opaque, never an
# exception out of CodeTests for the whole batch: one such row in the dataset must not stop every run that draws it.
def test_a_huge_literal_range_loop_is_opaque_not_a_crash():
    from rewards._judge import plan

    (check,) = plan(("for i in range(100000000000000000000):\n    assert f(i) == i",), "")
    assert check.expr is None
