"""Nothing lost: a killed run resumes from its checkpoint, a failing reward leaves a resumable one, and a
previous run is never overwritten by accident."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, with_trainer, write_recipe

from grpokit.checkpoints import rundir
from grpokit.run import training
from grpokit.files import ownership
from grpokit.checkpoints.rundir import latest_checkpoint
from grpokit.cli import main

# A reward that records the global step at which it is called (the trainer passes its state): the
# steps a run computes, seen from inside it.
STEP_PROBE = '''
import pathlib

def step_probe(completions, trainer_state=None, **kwargs):
    with open(pathlib.Path(__file__).with_name("steps.log"), "a") as f:
        f.write(f"{trainer_state.global_step}\\n")
    return [0.0 for _ in completions]
'''


def checkpointed_recipe(tmp_path, max_steps: int, reward: str):
    data = with_trainer(tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=1, optim="adamw_torch",
                        per_device_train_batch_size=4, num_generations=4)
    data["rewards"].append({"name": reward})
    return write_recipe(tmp_path, data)


def logged_steps(output_dir) -> list[int]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [h["step"] for h in state["log_history"] if "loss" in h]


def global_step(checkpoint) -> int:
    return json.loads((checkpoint / "trainer_state.json").read_text())["global_step"]


# The same probe, which also SIGKILLs its own process at the first reward call after checkpoint-2 was
# saved, while a `kill` file lies beside it: a crash at a known point, with no polling and no sleeps.
KILLING_PROBE = STEP_PROBE + '''
import os, signal

_step_probe = step_probe

def step_probe(completions, trainer_state=None, **kwargs):
    out = _step_probe(completions, trainer_state=trainer_state, **kwargs)
    if trainer_state.global_step >= 2 and pathlib.Path(__file__).with_name("kill").exists():
        os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup, as when a node dies
    return out
'''


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(tmp_path, capsys):
    (tmp_path / "probe.py").write_text(KILLING_PROBE)
    (tmp_path / "kill").touch()
    path = checkpointed_recipe(tmp_path, max_steps=4, reward="probe.py:step_probe")
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "launch.py", "--recipe", str(path)], cwd=ROOT, text=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    assert proc.returncode == -9, f"the run was not killed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    resumed_from = latest_checkpoint(out)
    assert Path(resumed_from).name == "checkpoint-2" and global_step(Path(resumed_from)) == 2

    (tmp_path / "kill").unlink()
    (tmp_path / "steps.log").unlink()
    assert main(["--recipe", str(path), "--resume"]) == 0
    assert f"(resuming {resumed_from})" in capsys.readouterr().out
    seen = [int(s) for s in (tmp_path / "steps.log").read_text().split()]
    assert seen == [2, 3]  # the resumed run computed steps 3 and 4 only: it did not restart at 1
    assert logged_steps(out) == [1, 2, 3, 4]  # the checkpoint's history, then the new steps, none twice
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4


FLAKY = '''
def flaky(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 2:
        raise ValueError("the grader service is down")
    return [0.0 for _ in completions]
'''
FIXED = '''
def flaky(completions, trainer_state=None, **kwargs):
    # fixed: the grader is reachable again (this file differs in size, so no stale bytecode is reused)
    return [0.0 for _ in completions]
'''


@pytest.mark.slow
def test_a_reward_that_raises_stops_the_run_with_a_resumable_checkpoint(tmp_path, capsys):
    (tmp_path / "flaky.py").write_text(FLAKY)
    path = checkpointed_recipe(tmp_path, max_steps=4, reward="flaky.py:flaky")
    out = tmp_path / "run"
    assert main(["--recipe", str(path)]) == 1
    err = capsys.readouterr().err
    assert "run stopped: reward 'flaky' raised at step 3 on sample 0: ValueError: the grader service is down; completion: " in err
    assert f"last checkpoint: {out / 'checkpoint-2'}\ncontinue with: {rundir.interpreter()} launch.py --recipe {path} --resume" in err
    assert "Traceback" not in err

    (tmp_path / "flaky.py").write_text(FIXED)
    assert main(["--recipe", str(path), "--resume"]) == 0
    assert f"(resuming {out / 'checkpoint-2'})" in capsys.readouterr().out
    assert logged_steps(out) == [1, 2, 3, 4]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 4

    # The trained adapter of the finished run merges into its base (recipe.yaml names builtin:tiny-llama).
    assert main(["--merge", str(out)]) == 0
    assert (out / "merged" / "config.json").is_file()


def test_a_new_run_into_a_used_output_dir_is_refused(tmp_path, capsys):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "recipe.yaml").write_text("# the previous run\n")
    ownership.claim(tmp_path / "run", ["recipe.yaml"])  # grpokit's: its manifest lists it
    assert main(["--recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert "trainer.output_dir: already holds a run; pass --resume to continue it, --overwrite to replace it" in err
    assert "Traceback" not in err
    assert (tmp_path / "run" / "recipe.yaml").read_text() == "# the previous run\n"  # untouched


@pytest.mark.parametrize(
    "resume,fragment",
    [
        (["--resume"], "--resume: no checkpoint to resume in trainer.output_dir"),  # latest, but none saved
        (["--resume-from", "/no/such/checkpoint-3"], "--resume-from: is not a checkpoint directory (no trainer_state.json)"),
    ],
    ids=["latest-none", "bad-path"],
)
def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, capsys, resume, fragment):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    (tmp_path / "run").mkdir()
    assert main(["--recipe", str(path), *resume]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_ctrl_c_names_the_checkpoint_to_resume(tmp_path, capsys, monkeypatch):
    """Ctrl-C mid-run: no traceback, exit 130, and where to continue from."""
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    (tmp_path / "run" / "checkpoint-3").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-3" / "trainer_state.json").write_text('{"global_step": 3}')

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    assert main(["--recipe", str(path), "--resume"]) == 130
    err = capsys.readouterr().err
    assert "run stopped: interrupted" in err and f"last checkpoint: {tmp_path / 'run' / 'checkpoint-3'}\ncontinue with: " in err
