"""A run's life in its directory: which checkpoint counts, one run per directory, stopping on a signal, a finished
run left alone, a failed save said plainly, and the run's own files (recipe.yaml, model card) portable and true.

Real-process tests start `launch.py` on the tiny model and synchronise through pipes the reward writes to or
reads from at a known step -- never through sleeps or polling.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, with_trainer, write_recipe

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


# ---------------------------------------------------------------------------------------------------------
# Issue 13.3: one run per directory, for the run's whole life

HOLD_LOCK = """
import os, sys
from pathlib import Path
from grpokit.rundir import RunLock
with RunLock(Path(sys.argv[1]), "holder.yaml"):
    os.write(int(sys.argv[2]), b"locked")
    os.read(int(sys.argv[3]), 1)  # until the test writes (or dies); SIGKILL may end it first
"""


def test_a_locked_run_directory_is_refused_and_a_dead_holders_lock_is_recovered(tmp_path):
    import signal

    run = tmp_path / "run"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run), str(ready_w), str(go_r)], cwd=ROOT,
                              pass_fds=(ready_w, go_r))
    os.close(ready_w), os.close(go_r)
    try:
        assert os.read(ready_r, 10) == b"locked", "the holder did not take the lock"
        with pytest.raises(RecipeError) as err:
            with rundir.RunLock(run, "second.yaml"):
                pass
        assert f"trainer.output_dir: is in use by another run (pid {holder.pid} on " in str(err.value)
        assert "wait for it to end, or choose another trainer.output_dir=..." in str(err.value)
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock, as a killed run does
        holder.wait()
        os.close(ready_r), os.close(go_w)
    assert f"pid {holder.pid}" in (run / rundir.LOCK_FILE).read_text()  # the stale file is still there ...
    with rundir.RunLock(run, "second.yaml"):  # ... and no obstacle: the kernel dropped the dead process's lock
        assert f"pid {os.getpid()} " in (run / rundir.LOCK_FILE).read_text()


def test_the_same_process_cannot_lock_a_run_directory_twice(tmp_path):
    with rundir.RunLock(tmp_path / "run", "a.yaml"):
        with pytest.raises(RecipeError, match="is in use by another run"):
            with rundir.RunLock(tmp_path / "run", "b.yaml"):
                pass
    with rundir.RunLock(tmp_path / "run", "b.yaml"):  # released: free again
        pass


def test_a_run_that_fails_before_writing_leaves_no_folder(tmp_path):
    with pytest.raises(KeyError):
        with rundir.RunLock(tmp_path / "run", "a.yaml"):
            raise KeyError("a recipe problem found after locking")
    assert not (tmp_path / "run").exists()


def test_an_unwritable_output_dir_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(RecipeError, match=r"trainer.output_dir: cannot be written \(.*\); choose a writable trainer.output_dir"):
        with rundir.RunLock(tmp_path / "file" / "run", "a.yaml"):
            pass


# A reward that, at its first call (inside training step 1, the run directory locked), writes "ready" to the
# pipe named by GATE_READY_FD and then waits until the test writes to GATE_GO_FD: the run is held mid-training
# for exactly as long as the test needs, with no sleeps.
GATE = """
import os

def gate(completions, **kwargs):
    ready = os.environ.pop("GATE_READY_FD", None)
    if ready is not None:
        os.write(int(ready), b"ready")
        os.read(int(os.environ["GATE_GO_FD"]), 1)
    return [0.0 for _ in completions]
"""


def gated_recipe(tmp_path, **trainer):
    (tmp_path / "gate.py").write_text(GATE)
    data = with_trainer(tmp_path, optim="adamw_torch", per_device_train_batch_size=4, num_generations=4, **trainer)
    data["rewards"].append({"name": "gate.py:gate"})
    return write_recipe(tmp_path, data)


def launch(*argv, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launch.py", *argv], cwd=ROOT, text=True, capture_output=True, timeout=600, **kwargs)


@pytest.mark.slow
def test_a_second_run_into_a_training_runs_directory_is_refused(tmp_path):
    path = gated_recipe(tmp_path, max_steps=2)
    run = tmp_path / "run"
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    first = subprocess.Popen([sys.executable, "launch.py", "--recipe", str(path)], cwd=ROOT, text=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(ready_w, go_r),
                             env={**os.environ, "GATE_READY_FD": str(ready_w), "GATE_GO_FD": str(go_r)})
    os.close(ready_w), os.close(go_r)
    try:
        assert os.read(ready_r, 10) == b"ready", "the first run never reached training"
        saved_recipe = (run / "recipe.yaml").read_text()
        for flags in ([], ["--overwrite"], ["--resume"]):
            second = launch("--recipe", str(path), *flags)
            assert second.returncode == 2, (flags, second.stderr[-2000:])
            assert f"trainer.output_dir: is in use by another run (pid {first.pid} on " in second.stderr, flags
            assert "Traceback" not in second.stderr
            assert (run / "recipe.yaml").read_text() == saved_recipe, f"{flags} touched the running run"
    finally:
        os.write(go_w, b"g")
        os.close(go_w), os.close(ready_r)
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2
