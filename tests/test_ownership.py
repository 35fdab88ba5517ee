"""grpokit removes only what it wrote itself, and only after every check of the new work has passed.

Each destructive path -- `--overwrite`, `--merge-out ... --overwrite`, `--plot` -- meets folders holding a user's
files; nothing of theirs may go, and each refusal is one message, exit 2, no traceback.

Every folder these tests point a destructive flag at lies under pytest's tmp_path (a relative output_dir too:
each such test changes into tmp_path first), so a regression can only ever cost the test's own files. The
filesystem root is checked through `forbidden_reason` alone, never through a run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import SMOKE_DATA, fake_run, with_trainer, write_recipe

from grpokit.files import ownership
from grpokit.cli import main
from grpokit.errors import RecipeError


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
