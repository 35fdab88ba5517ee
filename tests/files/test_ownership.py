"""grpokit removes only what it wrote itself, and only after every check of the new work has passed.

Each destructive path -- `--overwrite`, `--merge-out ... --overwrite`, `--plot` -- meets folders holding a user's
files; nothing of theirs may go, and each refusal is one message, exit 2, no traceback.

Every folder these tests point a destructive flag at lies under pytest's tmp_path (a relative output_dir too:
each such test changes into tmp_path first), so a regression can only ever cost the test's own files. The
filesystem root is checked through `forbidden_reason` alone, never through a run.

The sections after the first (each under a `# ---` line) gather the hostile cases: each test pins one rule (its
`Rule:` comment) where a hostile input -- an edited or copied-in file, a link, a killed save, a live run -- could make
grpokit remove, truncate or replace a file it did not write.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import SMOKE_DATA, age_claims, fake_run, load_bench, overwrite, with_trainer, write_recipe

from grpokit import files
from grpokit.files import ownership
from grpokit.cli import main
from grpokit.errors import RecipeError
from grpokit.checkpoints.rundir import RunLock, guard_output_dir


def user_files(folder):
    """What a user keeps in a folder: a key, notes, a model file."""
    (folder / ".ssh").mkdir(parents=True)
    (folder / ".ssh" / "id_rsa").write_text("KEY")
    (folder / "docs").mkdir()
    (folder / "docs" / "notes.md").write_text("notes")
    (folder / "other-model.bin").write_bytes(b"\0" * 16)
    return {".ssh/id_rsa", "docs/notes.md", "other-model.bin"}


def still_there(folder, files):
    return all((folder / f).is_file() for f in files)


def test_overwrite_refuses_a_folder_of_user_files(tmp_path, capsys):
    home_like = tmp_path / "me"
    files = user_files(home_like)
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(home_like)))
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "grpokit did not write" in err and ".ssh" in err and "docs" in err and "Traceback" not in err
    assert still_there(home_like, files)


def test_a_run_into_the_recipes_own_folder_is_refused(tmp_path, monkeypatch, capsys):
    """A copied recipe with `output_dir: .`, run from its folder: the recipe, its reward and its data stay."""
    project = tmp_path / "mine"
    project.mkdir()
    (project / "data.jsonl").write_text(SMOKE_DATA.read_text())
    (project / "my_reward.py").write_text("def r(completions, **kw):\n    return [0.0] * len(completions)\n")
    data = with_trainer(project, output_dir=".")
    data["dataset"]["path"] = "data.jsonl"
    path = write_recipe(project, data)
    monkeypatch.chdir(project)
    for flags in (["--overwrite"], [], ["--check"]):
        assert main(["--recipe", str(path), *flags]) == 2
        err = capsys.readouterr().err
        assert "is the folder of the recipe itself" in err and "Traceback" not in err
    assert sorted(p.name for p in project.iterdir()) == ["data.jsonl", "my_reward.py", "recipe.yaml"]


def test_the_home_directory_is_never_an_output_folder(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    files = user_files(home)
    monkeypatch.setenv("HOME", str(home))
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(home)))
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    assert "is the home directory" in capsys.readouterr().err
    assert still_there(home, files)


def test_forbidden_folders():
    assert ownership.forbidden_reason(Path("/")) == "is the filesystem root"
    assert ownership.forbidden_reason(Path("/usr/..")) == "is the filesystem root"
    assert ownership.forbidden_reason(Path.home()) == "is the home directory"
    recipe = Path("/srv/project/recipes/my.yaml")
    assert "folder of the recipe itself" in ownership.forbidden_reason(Path("/srv/project/recipes"), recipe)
    assert "holds the recipe itself" in ownership.forbidden_reason(Path("/srv/project"), recipe)
    assert ownership.forbidden_reason(Path("/srv/project/runs/my"), recipe) is None


def test_overwrite_keeps_the_old_run_until_the_new_one_checks(tmp_path, capsys):
    """A bad data file in the new run is found before the old run is touched."""
    run = fake_run(tmp_path / "run")
    before = ownership.entries(run)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{not json\n')
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    assert main(["--recipe", str(path), "--overwrite", f"dataset.path={bad}"]) == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "Traceback" not in err
    assert ownership.entries(run) == before


def test_overwrite_refuses_a_folder_holding_another_run(tmp_path, capsys):
    """The parent of a run (training or not): the run inside is not this folder's to remove."""
    parent = tmp_path / "runs"
    inner = fake_run(parent / "inner")
    (inner / ownership.LOCK_FILE).write_text("pid 1 on host\n")
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(parent)))
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    assert "inner" in capsys.readouterr().err
    assert (inner / "recipe.yaml").is_file() and (inner / ownership.LOCK_FILE).is_file()


def test_a_listed_folder_that_now_holds_another_run_is_not_removed(tmp_path):
    outer = fake_run(tmp_path / "outer")
    nested = fake_run(outer / "checkpoint-1" / "nested")  # a run started inside one of outer's folders
    (nested / ownership.LOCK_FILE).write_text("pid 1 on host\n")  # a run leaves its lock file behind
    with pytest.raises(RecipeError, match="another grpokit run"):
        ownership.remove(outer, ownership.listed(outer), "trainer.output_dir")
    assert (outer / "checkpoint-1" / "nested" / "recipe.yaml").is_file() and (outer / "recipe.yaml").is_file()


def test_a_damaged_manifest_reaches_nothing_outside_its_folder(tmp_path):
    outside = tmp_path / "precious.txt"
    outside.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    names = ["../precious.txt", "..", "/etc", ".", ""]
    (run / ownership.MANIFEST).write_text(json.dumps({"written": names}))
    ownership.remove(run, names, "trainer.output_dir")
    assert outside.read_text() == "keep" and run.is_dir() and ownership.listed(run) == set()


def test_merge_never_writes_over_its_own_run(tmp_path, capsys):
    run = fake_run(tmp_path / "run", names=("adapter_config.json", "adapter_model.safetensors", "recipe.yaml"))
    for out in (run, tmp_path):  # the run itself, and a folder holding it
        assert main(["--merge", str(run), "--merge-out", str(out), "--overwrite"]) == 2
        err = capsys.readouterr().err
        assert "--merge-out" in err and "Traceback" not in err
    assert ownership.entries(run) == ["adapter_config.json", "adapter_model.safetensors", "recipe.yaml"]


def test_merge_out_overwrite_refuses_user_files(tmp_path, capsys):
    run = fake_run(tmp_path / "run", names=("adapter_config.json", "recipe.yaml"))
    out = tmp_path / "models"
    out.mkdir()
    (out / "other-model.bin").write_bytes(b"\1")
    assert main(["--merge", str(run), "--merge-out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "other-model.bin" in err and "grpokit did not write" in err and "Traceback" not in err
    assert (out / "other-model.bin").read_bytes() == b"\1"


def test_plot_leaves_a_foreign_folders_report_alone(tmp_path, capsys):
    folder = tmp_path / "notes"
    (folder / "plots").mkdir(parents=True)
    (folder / "report.md").write_text("my own report")
    (folder / "plots" / "training.png").write_bytes(b"my own plot")
    history = [{"step": 1, "reward": 0.5, "loss": 0.1}]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": history}))
    assert main(["--plot", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "report.md" in err and "Traceback" not in err
    assert (folder / "report.md").read_text() == "my own report"
    assert (folder / "plots" / "training.png").read_bytes() == b"my own plot"


def test_write_text_replaces_only_its_own_files(tmp_path):
    mine = tmp_path / "eval.json"
    ownership.write_text(mine, "1")
    ownership.write_text(mine, "2")  # its own: replaced
    assert mine.read_text() == "2"
    theirs = tmp_path / "theirs.json"
    theirs.write_text("keep")
    with pytest.raises(RecipeError, match="grpokit did not write it"):
        ownership.write_text(theirs, "x")
    assert theirs.read_text() == "keep"


def test_recorder_keeps_what_was_there_before(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "before.txt").write_text("user")
    recorder = ownership.Recorder(folder)
    (folder / "checkpoint-1").mkdir()
    other = fake_run(folder / "someone-elses")  # another run started inside: never recorded as this one's
    (other / ownership.LOCK_FILE).write_text("pid 1 on host\n")
    recorder.record()
    assert ownership.listed(folder) == {"checkpoint-1"}
    assert ownership.foreign(folder) == ["before.txt", "someone-elses"]


@pytest.mark.slow
def test_a_real_run_records_everything_it_wrote(tmp_path, capsys):
    """Trainer, tokenizer, checkpoint, report and plots: all of it is in the manifest, so --overwrite can replace the
    run -- and a file the user drops into the run folder stops --overwrite, untouched."""
    path = write_recipe(tmp_path, with_trainer(tmp_path, max_steps=1, save_strategy="steps", save_steps=1))
    assert main(["--recipe", str(path)]) == 0
    run = tmp_path / "run"
    assert {"checkpoint-1", "recipe.yaml", "report.md", "plots", "adapter_model.safetensors"} <= ownership.listed(run)
    assert ownership.foreign(run) == []
    (run / "my-notes.txt").write_text("mine")
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    assert "my-notes.txt" in capsys.readouterr().err and (run / "checkpoint-1").is_dir()
    (run / "my-notes.txt").unlink()
    assert main(["--recipe", str(path), "--overwrite"]) == 0
    assert ownership.foreign(run) == [] and (run / "checkpoint-1").is_dir()


def test_a_file_put_inside_a_runs_folder_stops_the_removal(tmp_path):
    """A note dropped into a checkpoint the run wrote: the checkpoint is grpokit's, the note is not."""
    run = fake_run(tmp_path / "run")
    (run / "checkpoint-1" / "my-notes.md").write_text("why this checkpoint matters")
    with pytest.raises(RecipeError, match="checkpoint-1/my-notes.md"):
        ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert (run / "checkpoint-1" / "my-notes.md").is_file() and (run / "recipe.yaml").is_file()


def test_a_symlink_in_a_run_is_removed_not_followed(tmp_path):
    elsewhere = tmp_path / "docs"
    elsewhere.mkdir()
    (elsewhere / "keep.md").write_text("keep")
    run = fake_run(tmp_path / "run", names=("recipe.yaml",))
    (run / "checkpoint-1").symlink_to(elsewhere)
    ownership.claim(run, ["checkpoint-1"])
    ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert (elsewhere / "keep.md").read_text() == "keep" and ownership.entries(run) == []


def test_eval_out_never_replaces_a_users_file(tmp_path, capsys, no_weights):
    """Refused before the model loads (`no_weights` fails the test otherwise), and the file is as it was."""
    theirs = tmp_path / "results.json"
    theirs.write_text('{"mine": true}')
    data = with_trainer(tmp_path)
    data["dataset"].update(eval_path=str(SMOKE_DATA), eval_limit=2)
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--eval", "--eval-out", str(theirs)]) == 2
    err = capsys.readouterr().err
    assert "--eval-out" in err and "grpokit did not write it" in err and "Traceback" not in err
    assert theirs.read_text() == '{"mine": true}'


def test_output_dir_through_a_symlink_is_judged_by_what_it_points_to(tmp_path, capsys):
    home_like = tmp_path / "me"
    files = user_files(home_like)
    (tmp_path / "link").symlink_to(home_like)
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(tmp_path / "link")))
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    assert "grpokit did not write" in capsys.readouterr().err and still_there(home_like, files)


def test_a_run_without_a_manifest_is_named_as_such(tmp_path, capsys):
    """A run folder from a grpokit that kept no manifest: refused like any other, with what to do about it."""
    run = tmp_path / "run"
    run.mkdir()
    for name in ("recipe.yaml", ownership.LOCK_FILE, "adapter_model.safetensors"):
        (run / name).write_text("")
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    assert main(["--recipe", str(path), "--overwrite"]) == 2
    assert "kept no manifest" in capsys.readouterr().err and ownership.entries(run) == ["adapter_model.safetensors", "recipe.yaml"]


def finished_run(folder):
    """A finished run whose checkpoint holds a model card and weights beside its state, and a report at the top."""
    return fake_run(folder, ("checkpoint-1", "trainer_state.json", "recipe.yaml", "report.md"),
                    checkpoint_files=("trainer_state.json", "README.md", "adapter_model.safetensors"), text="grpokit's")


# --- The manifest claims only what is as grpokit left it: an entry gone, edited or copied in since is the user's.


# Rule: a manifest name whose entry is gone claims nothing. After `rm -rf run/*` (the shell's * skips the dotfile
# .grpokit-files), a file the user later puts there under a name the old run used (report.md, README.md,
# config.json ...) is the user's: --overwrite refuses, naming it.
def test_a_stale_manifest_entry_does_not_claim_a_users_new_file(tmp_path):
    run = fake_run(tmp_path / "run", names=("checkpoint-1", "report.md"))
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


# Rule: a file grpokit wrote inside one of the run's folders and the user then edited -- the checkpoint's model card
# README.md filled in with their evaluation notes, or adapter_model.safetensors replaced by weights of their own
# under the same name -- is the user's: --overwrite (and the trainer's checkpoint rotation after --resume) refuses
# to remove it, as at the top of the folder (docs/troubleshooting.md: "an entry replaced or edited since is no
# longer grpokit's").
def test_a_file_edited_inside_a_checkpoint_is_no_longer_grpokits(tmp_path):
    run = finished_run(tmp_path / "run")
    card = run / "checkpoint-1" / "README.md"
    card.write_text("# my evaluation notes for this checkpoint, written over two days\n" * 20)
    with pytest.raises(RecipeError, match="README.md"):
        overwrite(run)
    assert card.is_file()


# Rule: a file edited in place to the same size whose mtime is then restored (`touch -r`, `cp -p`/`rsync -t` over
# it, an editor that keeps times) is the user's: the change time (st_ctime), which no user can set back, is part of
# an entry's identity, so --overwrite refuses to remove the edit.
def test_a_file_edited_keeping_its_size_and_mtime_is_no_longer_grpokits(tmp_path):
    run = finished_run(tmp_path / "run")
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
    run = finished_run(tmp_path / "run")
    theirs = tmp_path / "from-cluster" / "checkpoint-1"
    theirs.mkdir(parents=True)
    for name in ("trainer_state.json", "README.md", "adapter_model.safetensors"):
        (theirs / name).write_text("THEIR weights, trained for a week")
    shutil.rmtree(run / "checkpoint-1")
    shutil.copytree(theirs, run / "checkpoint-1")
    with pytest.raises(RecipeError, match="checkpoint-1"):
        overwrite(run)
    assert (run / "checkpoint-1" / "adapter_model.safetensors").read_text() == "THEIR weights, trained for a week"


# --- A killed save's claim (claim_writing, start_pending) expires after its window; nothing makes it lasting.


# Rule: a checkpoint claimed before its first byte (`claim_writing`, from SafeStop.on_step_end) and never recorded
# (a SIGKILL: OOM killer, scancel -s KILL, a node lost) does not claim whatever later stands under its name: a folder
# of the user's put there after the half-written checkpoint-2 was removed is refused by --overwrite, as a stale
# recorded entry is (test_a_stale_manifest_entry_does_not_claim_a_users_new_file).
def test_a_claim_left_by_a_killed_save_does_not_claim_a_users_later_folder(tmp_path):
    run = finished_run(tmp_path / "run")
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


# Rule: a claim left by a killed save (claim_writing: {"since": t}, no identity) expires after SAVE_WINDOW_NS
# (docs/troubleshooting.md: "what was written in its folder within an hour of that save's start counts as the
# run's"), and a later rewrite of the manifest -- the report grpokit writes for `--plot RUN`, `--eval RUN`'s report
# refresh, anything that calls claim/claim_file/remove -- does not turn it into a lasting claim with the folder's
# inode. Days later, the user's notes put into the half-written checkpoint are refused by --overwrite, with or
# without that intermediate write (checkpoint-2 is the user's once the window has passed).
def test_a_later_report_write_does_not_make_a_killed_saves_claim_permanent(tmp_path):
    run = finished_run(tmp_path / "run")
    ownership.claim_writing(run, "checkpoint-2")  # the save starts ... and the process is SIGKILLed here
    (run / "checkpoint-2").mkdir()
    (run / "checkpoint-2" / "model.safetensors").write_text("half")
    ownership.write_text(run / "report.md", "# report\n")  # `--plot run` soon after: grpokit rewrites its report
    age_claims(run, 2 * ownership.SAVE_WINDOW_NS)  # days later, well past the save window ...
    (run / "checkpoint-2" / "notes.txt").write_text("mine")  # ... the user keeps notes in the leftover folder
    with pytest.raises(RecipeError, match="checkpoint-2"):
        overwrite(run)
    assert (run / "checkpoint-2" / "notes.txt").read_text() == "mine"


# Rule: the same for a killed *final* save (start_pending): a top-level folder written within the window counts as
# the run's only within it; a manifest rewrite in the meantime does not make it the run's for good, so what the user
# writes inside it days later is refused by --overwrite.
def test_a_later_report_write_does_not_make_a_killed_final_saves_window_permanent(tmp_path):
    run = finished_run(tmp_path / "run")
    ownership.start_pending(run)  # the final save starts ... and the process is SIGKILLed here
    (run / "tokenizer_files").mkdir()  # what the final save had written of a folder
    ownership.write_text(run / "report.md", "# report\n")  # `--plot run` soon after
    age_claims(run, 2 * ownership.SAVE_WINDOW_NS)  # days later ...
    (run / "tokenizer_files" / "notes.txt").write_text("mine")  # ... the user's notes in it
    with pytest.raises(RecipeError, match="tokenizer_files"):
        overwrite(run)
    assert (run / "tokenizer_files" / "notes.txt").read_text() == "mine"


# --- A refused launch or --overwrite records nothing: a refusal never makes a user's file grpokit's.


# Rule: a refused launch into a run folder (here: a new run without --resume/--overwrite, exit 2) records nothing
# new on its way out (RunLock.__exit__ -> Recorder.record): a user's file inside a listed folder (checkpoint-1)
# never becomes "grpokit's", so no later --overwrite deletes it.
def test_a_refused_launch_does_not_launder_a_users_file_inside_a_checkpoint(tmp_path, capsys):
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
def test_a_refused_overwrite_does_not_launder_the_file_it_refused_for(tmp_path):
    run = fake_run(tmp_path / "run")
    notes = run / "checkpoint-1" / "notes.txt"
    notes.write_text("mine")
    for _ in range(2):
        with pytest.raises(RecipeError, match="notes.txt"):
            with RunLock(run, "recipe.yaml"):
                ownership.remove(run, ownership.listed(run), "trainer.output_dir")
    assert notes.is_file()


# --- --resume runs the same checks: checkpoint rotation and the final save remove or overwrite no user's file.


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


# --- The lock, the manifest and write temporaries: never written through a link, a user's file of that name kept.


# Rule: a `.grpokit.lock` that is a symbolic link (planted in a shared folder, or copied along) is never followed:
# the launch is refused, naming the link, and writes its pid line into no file grpokit did not write.
def test_the_lock_file_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / ownership.LOCK_FILE).symlink_to(victim)
    with pytest.raises(RecipeError, match="symbolic link"):  # refused, naming the link
        with RunLock(run, "recipe.yaml"):
            pass
    assert victim.read_text() == "precious"


# Rule: a `.grpokit.lock` that grpokit did not write -- the user's, or a hard link to one (O_NOFOLLOW stops symbolic
# links only) -- keeps its content when the run is refused (exit 2, docs/troubleshooting.md: "exits 2 before
# anything is touched").
def test_a_refused_run_leaves_a_users_lock_named_file_untouched(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "data.txt").write_text("x")
    original = tmp_path / "notes.txt"
    original.write_text("my notes")
    (folder / ownership.LOCK_FILE).hardlink_to(original)  # a hard link: what O_NOFOLLOW does not stop
    with pytest.raises(RecipeError, match="did not write"):
        with RunLock(folder, "recipe.yaml"):
            guard_output_dir(folder, None, False, "recipe.yaml")
    assert original.read_text() == "my notes"


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


# Rule: the manifest `.grpokit-files` (and its temporary `.grpokit-files.partial`) is replaced only when grpokit
# wrote it: a user's own file of that name in a folder given as `--eval-out DIR/eval.json` (or --plot, or a merge's
# folder) keeps its content.
def test_a_users_file_named_like_the_manifest_is_not_replaced(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / ".grpokit-files").write_text("my list of files to keep\n")  # not JSON, not grpokit's
    (results / ".grpokit-files.partial").write_text("mine too\n")
    try:
        ownership.write_text(results / "eval.json", "{}\n")
    except (RecipeError, OSError):
        pass  # refusing is fine; replacing the user's files is not
    assert (results / ".grpokit-files").read_text() == "my list of files to keep\n"
    assert (results / ".grpokit-files.partial").read_text() == "mine too\n"


# Rule: ownership.write_text's temporary `.NAME.partial` (eval.json, --eval-out) is never written through a symlink.
def test_write_texts_temporary_is_never_written_through_a_symlink(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    (run / ".eval.json.partial").symlink_to(victim)
    ownership.write_text(run / "eval.json", "{}")
    assert victim.read_text() == "precious"


# Rule: writing a file (report.md, model card, recipe.yaml, curves, eval.json: `replace_text`, whose temporary is
# `.NAME.partial` beside the target) never removes a file grpokit did not write under the temporary's name: a user's
# `.report.md.partial` in a run folder survives `--plot RUN`, and `results/.eval.json.partial` survives
# `--eval-out results/eval.json`.
def test_plot_keeps_a_users_file_named_like_its_temporary(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "trainer_state.json").write_text('{"global_step": 1, "log_history": [{"step": 1, "reward": 0.5, "loss": 0.1}]}')
    ownership.claim(run, ["trainer_state.json"])
    (run / ".report.md.partial").write_text("my draft of the write-up")  # the user's, never grpokit's
    main(["--plot", str(run)])
    capsys.readouterr()
    assert (run / ".report.md.partial").read_text() == "my draft of the write-up"


def test_eval_out_keeps_a_users_file_named_like_its_temporary(tmp_path):
    results = tmp_path / "results"  # the user's folder, given as --eval-out results/eval.json
    results.mkdir()
    (results / ".eval.json.partial").write_text("mine")
    ownership.write_text(results / "eval.json", "{}\n")  # what evaluate() writes
    assert (results / ".eval.json.partial").read_text() == "mine"


# --- --plot writes its report and figures as new files, never through a symlinked folder or a hard link.


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


# Rule: grpokit's report (write_report), model card (write_model_card) and recipe.yaml (write_recipe_file) are
# written as a fresh file renamed over the old one (ownership.write_text), never in place: a run folder snapshotted
# with hard links -- `cp -al runs/my backups/my-monday`, rsync --link-dest, rsnapshot -- keeps the backup's
# report.md as it was through `--plot` (and --resume, and --eval's report refresh).
def test_plot_never_changes_a_hard_linked_backup_of_the_report(tmp_path, capsys):
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


# --- --merge-out and --pack-deps refuse a training run's folder, live, finished or behind a link.


# Rule: grpokit/run/merge.py and grpokit/run/evaluate.py import (no statement left at the wrong indentation), so
# `launch.py --merge` and `--eval` reach their own messages, never a traceback.
@pytest.mark.parametrize("module", ["grpokit.run.merge", "grpokit.run.evaluate"])
def test_merge_and_eval_modules_import(module):
    import importlib

    importlib.import_module(module)


# Rule: `--merge A --merge-out B --overwrite` where B is a run that is training right now (its lock held) exits 2
# and touches nothing: the live run keeps its checkpoints, recipe.yaml and model card.
# docs/troubleshooting.md: "One run per folder ... exits 2 before anything is touched".
def test_merge_out_overwrite_refuses_a_folder_a_run_is_training_in(tmp_path):
    from grpokit.run.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    live = fake_run(tmp_path / "B")
    with RunLock(live, "recipe.yaml"):
        with pytest.raises(RecipeError):
            _previous_merge(adapter_run, live, overwrite=True)
    assert (live / "checkpoint-1" / "trainer_state.json").is_file()


# Rule: `--merge-out B --overwrite` replaces only a previous merge; where B is a (finished) training run it is
# refused, naming the run, and its checkpoints, adapter, recipe.yaml and report stay (docs/troubleshooting.md).
def test_merge_out_overwrite_refuses_a_training_run(tmp_path):
    from grpokit.run.merge import _previous_merge

    adapter_run = fake_run(tmp_path / "A")
    other = fake_run(tmp_path / "B")
    (other / ownership.LOCK_FILE).write_text("pid 1 on host\n")  # what every run leaves behind
    with pytest.raises(RecipeError):
        _previous_merge(adapter_run, other, overwrite=True)


class _Stop(Exception):
    pass


# Rule: `python bench/gpu_memory.py --pack-deps DIR` respects the run lock, as --merge-out does
# (test_merge_out_overwrite_refuses_a_folder_a_run_is_training_in): pointed (by a typo, or a shared
# `--pack-deps runs/x`) at a run that is training right now, it removes none of its checkpoints, recipe or report --
# README "One run per folder": a second user of the folder "exits 2 before anything is touched".
def test_pack_deps_never_removes_a_live_training_run(tmp_path, monkeypatch):
    gpu_memory = load_bench("gpu_memory")
    live = finished_run(tmp_path / "runs" / "live")

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
    from grpokit.run.merge import _previous_merge

    adapter_run = finished_run(tmp_path / "runs" / "exp6")
    live = finished_run(tmp_path / "runs" / "exp7")
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


# Rule: a folder whose `.grpokit-files` is the user's own cannot hold grpokit's record of what it wrote, so grpokit
# writes nothing there: refused before the first file, by the door itself (every writer goes through it).
def test_plot_into_a_folder_whose_manifest_is_the_users_writes_nothing(tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / ".grpokit-files").write_text("my own notes\n")
    history = [{"step": 1, "reward": 0.5, "loss": 0.1}, {"step": 2, "reward": 0.6, "loss": 0.2}]
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": history}))
    assert main(["--plot", str(folder)]) == 2
    err = capsys.readouterr().err
    assert ".grpokit-files: is not a manifest grpokit wrote" in err and "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == [".grpokit-files", "trainer_state.json"]
    assert (folder / ".grpokit-files").read_text() == "my own notes\n"


def test_the_door_refuses_a_write_it_could_not_record_before_writing(tmp_path):
    (tmp_path / ".grpokit-files").write_text("mine\n")
    for path in (tmp_path / "report.md", tmp_path / "plots" / "training.png"):
        with pytest.raises(RecipeError, match="is not a manifest grpokit wrote"):
            files.write_text(path, "x", root=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".grpokit-files"]
