"""Hostile inputs against one promise: grpokit deletes (or truncates, or replaces) only files it wrote itself.

Each test pins one rule (its `Rule:` comment) where a hostile input could break a promise. Every test touches only pytest's tmp_path.
"""

from __future__ import annotations

import json

import helpers
import pytest
from helpers import age_claims, overwrite

from grpokit.files import ownership
from grpokit.errors import RecipeError


def fake_run(folder):
    """A finished run whose checkpoint holds a model card and weights beside its state, and a report at the top."""
    return helpers.fake_run(folder, ("checkpoint-1", "trainer_state.json", "recipe.yaml", "report.md"),
                            checkpoint_files=("trainer_state.json", "README.md", "adapter_model.safetensors"), text="grpokit's")


# Rule: a claim left by a killed save (claim_writing: {"since": t}, no identity) expires after SAVE_WINDOW_NS
# (docs/troubleshooting.md: "what was written in its folder within an hour of that save's start counts as the
# run's"), and a later rewrite of the manifest -- the report grpokit writes for `--plot RUN`, `--eval RUN`'s report
# refresh, anything that calls claim/claim_file/remove -- does not turn it into a lasting claim with the folder's
# inode. Days later, the user's notes put into the half-written checkpoint are refused by --overwrite, with or
# without that intermediate write (checkpoint-2 is the user's once the window has passed).
def test_a_later_report_write_does_not_make_a_killed_saves_claim_permanent(tmp_path):
    run = fake_run(tmp_path / "run")
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
    run = fake_run(tmp_path / "run")
    ownership.start_pending(run)  # the final save starts ... and the process is SIGKILLed here
    (run / "tokenizer_files").mkdir()  # what the final save had written of a folder
    ownership.write_text(run / "report.md", "# report\n")  # `--plot run` soon after
    age_claims(run, 2 * ownership.SAVE_WINDOW_NS)  # days later ...
    (run / "tokenizer_files" / "notes.txt").write_text("mine")  # ... the user's notes in it
    with pytest.raises(RecipeError, match="tokenizer_files"):
        overwrite(run)
    assert (run / "tokenizer_files" / "notes.txt").read_text() == "mine"


# Rule: writing a file (report.md, model card, recipe.yaml, curves, eval.json: `replace_text`, whose temporary is
# `.NAME.partial` beside the target) never removes a file grpokit did not write under the temporary's name: a user's
# `.report.md.partial` in a run folder survives `--plot RUN`, and `results/.eval.json.partial` survives
# `--eval-out results/eval.json`.
def test_plot_keeps_a_users_file_named_like_its_temporary(tmp_path, capsys):
    from grpokit.cli import main

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


# Rule: a `.grpokit.lock` that grpokit did not write -- the user's, or a hard link to one (O_NOFOLLOW stops symbolic
# links only) -- keeps its content when the run is refused (exit 2, docs/troubleshooting.md: "exits 2 before
# anything is touched").
def test_a_refused_run_leaves_a_users_lock_named_file_untouched(tmp_path):
    from grpokit.rundir import RunLock, guard_output_dir

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
