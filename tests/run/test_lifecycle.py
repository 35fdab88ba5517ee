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
from helpers import ROOT, docs_block, launch, normal, numberless, with_trainer, write_recipe

from grpokit.checkpoints import rundir
from grpokit.files import ownership
from grpokit.errors import RecipeError


def fake_checkpoint(run: Path, step: int, state: str | None = None) -> Path:
    """A checkpoint-N/ holding only a trainer_state.json (what the finder reads); `state` replaces its text."""
    folder = run / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    text = json.dumps({"global_step": step, "max_steps": 4, "log_history": []}) if state is None else state
    (folder / rundir.STATE_FILE).write_text(text)
    return folder


# ---------------------------------------------------------------------------------------------------------
# a checkpoint counts only when its trainer_state.json (written last by the trainer) is readable


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
# `--resume` takes no value, `--resume-from PATH` names a checkpoint; a stopped run says the
# whole command that continues it


def dispatched(monkeypatch, argv):
    """What `launch.py argv` hands to training.run (the recipe's max_steps, resume, continue command)."""
    from grpokit.run import training
    from grpokit.cli import main

    seen = {}

    def fake_run(recipe, request):
        seen.update(max_steps=recipe.trainer["max_steps"], resume=request.resume, continue_with=request.continue_with)
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
    assert seen["continue_with"] == f"{rundir.interpreter()} launch.py --recipe {path} trainer.beta=0.04 'lora.target_modules=[q_proj, v_proj]' --resume"
    code, seen = dispatched(monkeypatch, ["--resume-from", "runs/x/checkpoint-3", "--recipe", str(path)])
    assert seen["continue_with"] == f"{rundir.interpreter()} launch.py --recipe {path} --resume"


def test_a_stopped_run_says_the_whole_command_to_continue(tmp_path, capsys, monkeypatch):
    from grpokit.run import training
    from grpokit.cli import main

    path = write_recipe(tmp_path, with_trainer(tmp_path))
    fake_checkpoint(tmp_path / "run", 3)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(training, "train", interrupted)
    assert main(["--recipe", str(path), "trainer.max_steps=4", "--resume"]) == 130
    err = capsys.readouterr().err
    assert f"last checkpoint: {tmp_path / 'run' / 'checkpoint-3'}" in err
    assert f"continue with: {rundir.interpreter()} launch.py --recipe {path} trainer.max_steps=4 --resume" in err


# ---------------------------------------------------------------------------------------------------------
# one run per directory, for the run's whole life

HOLD_LOCK = """
import os, sys
from pathlib import Path
from grpokit.checkpoints.rundir import RunLock
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


@pytest.mark.slow
def test_a_second_run_into_a_training_runs_directory_is_refused(tmp_path, capsys):
    from grpokit.cli import main

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
        second = launch("--recipe", str(path))  # the command a user types, in its own process
        said = [(second.returncode, second.stderr)]
        for flags in (["--overwrite"], ["--resume"]):  # the same refusal, the flags that would replace or continue
            code = main(["--recipe", str(path), *flags])
            said.append((code, capsys.readouterr().err))
        for flags, (code, err) in zip(([], ["--overwrite"], ["--resume"]), said):
            assert code == 2, (flags, err[-2000:])
            assert f"trainer.output_dir: is in use by another run (pid {first.pid} on " in err, flags
            assert "Traceback" not in err
        assert (run / "recipe.yaml").read_text() == saved_recipe, "a refused run touched the running run"
    finally:
        os.write(go_w, b"g")
        os.close(go_w), os.close(ready_r)
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-3000:]
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2


# ---------------------------------------------------------------------------------------------------------
# SIGTERM (schedulers, `kill`) stops at the end of the step with a checkpoint, like Ctrl-C

# Sends its own process SIGTERM from inside step 2's reward call (global_step 1 there), once: as a scheduler's
# `scancel` or `kill` would, at a known point.
TERMINATING = """
import os, signal

def terminate(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step == 1 and os.environ.pop("SEND_SIGTERM", None):
        os.kill(os.getpid(), signal.SIGTERM)
    return [0.0 for _ in completions]
"""


@pytest.mark.slow
def test_sigterm_stops_at_the_step_end_with_a_checkpoint_and_resumes(tmp_path):
    (tmp_path / "term.py").write_text(TERMINATING)
    data = with_trainer(tmp_path, max_steps=3, save_strategy="no", optim="adamw_torch", per_device_train_batch_size=4,
                        num_generations=4)
    data["rewards"].append({"name": "term.py:terminate"})
    path = write_recipe(tmp_path, data)
    run = tmp_path / "run"
    stopped = launch("--recipe", str(path), "trainer.seed=1", env={**os.environ, "SEND_SIGTERM": "1"})
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "run stopped: SIGTERM at step 2, after saving a checkpoint" in stopped.stderr
    assert f"last checkpoint: {run / 'checkpoint-2'}\ncontinue with: {rundir.interpreter()} launch.py --recipe {path} trainer.seed=1 --resume" \
        in stopped.stderr
    assert "Traceback" not in stopped.stderr
    # nor transformers' line that it turns off the cache a checkpointed training forward never uses (TRL's default)
    assert "incompatible with gradient checkpointing" not in stopped.stdout + stopped.stderr
    assert rundir.read_state(run / "checkpoint-2" / rundir.STATE_FILE)[0]["global_step"] == 2  # complete, though save_strategy is "no"
    assert not (run / rundir.STATE_FILE).exists()  # not finished: no final save
    # the run so far has its report and curves, marked as stopped, before the process exits
    report = (run / "report.md").read_text()
    assert "**This run stopped** (SIGTERM at step 2, after saving a checkpoint)" in report
    assert f"`{rundir.interpreter()} launch.py --recipe {path} trainer.seed=1 --resume`" in report
    assert "- Steps: 2 of 3" in report and (run / "plots" / "training.png").is_file()
    # docs/troubleshooting.md shows what a stop prints, as printed (its paths are an example's)
    shown = {f"{run}": "/home/me/project/runs/my", f"{path}": "my.yaml", f"{rundir.interpreter()} ": ".venv/bin/python "}
    assert docs_block("stop") == [normal(line, shown) for line in stopped.stderr.splitlines() if line.startswith(
        ("run stopped:", "last checkpoint:", "continue with:"))]

    resumed = launch("--recipe", str(path), "trainer.seed=1", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"(resuming {run / 'checkpoint-2'})" in resumed.stdout
    assert json.loads((run / rundir.STATE_FILE).read_text())["global_step"] == 3
    assert "This run stopped" not in (run / "report.md").read_text()  # finished: the report is the whole run's
    printed = [normal(line, shown) for line in resumed.stdout.splitlines() if "resumed at step" in line]
    assert [numberless(line) for line in docs_block("resume")] == [numberless(line) for line in printed]


# ---------------------------------------------------------------------------------------------------------
# resuming a finished run changes nothing; raising trainer.max_steps extends it


def run_files(run: Path) -> dict[str, bytes]:
    """Every file of a run but the lock, by relative path: what 'changes nothing' compares."""
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != rundir.LOCK_FILE}


@pytest.mark.slow
def test_a_finished_run_is_left_alone_extended_on_request_and_completed_after_a_kill_in_its_final_save(tmp_path, capsys):
    from grpokit.cli import main

    path = write_recipe(tmp_path, with_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=1, optim="adamw_torch",
                                               per_device_train_batch_size=4, num_generations=4))
    run = tmp_path / "run"
    assert main(["--recipe", str(path)]) == 0
    before = run_files(run)
    assert "[None]" not in before["README.md"].decode() and "builtin:tiny-llama" in before["README.md"].decode()
    capsys.readouterr()

    assert main(["--recipe", str(path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"the run in {run} is finished (step 2 of trainer.max_steps 2); nothing to train" in out
    assert f"raise trainer.max_steps: {rundir.interpreter()} launch.py --recipe {path} --resume trainer.max_steps=4" in out
    assert run_files(run) == before  # not a byte changed: no step 3, no new checkpoint, the adapter kept

    # A kill during the final save: the trainer state (written last) never came, the adapter is cut short, no report.
    # The run marked the save's start in its manifest first (as training does before save_model).
    ownership.start_pending(run)
    (run / rundir.STATE_FILE).unlink()
    (run / "adapter_model.safetensors").write_bytes(before["adapter_model.safetensors"][:100])
    (run / "report.md").unlink()
    assert main(["--recipe", str(path), "--resume"]) == 0
    out = capsys.readouterr().out
    assert f"final save is incomplete: completing it from {run / 'checkpoint-2'}" in out and "is finished (step 2 of" in out
    after = run_files(run)
    assert after["adapter_model.safetensors"] == before["checkpoint-2/adapter_model.safetensors"]
    assert json.loads(after[rundir.STATE_FILE])["global_step"] == 2 and "report.md" in after
    assert not any(name.startswith("checkpoint-3") for name in after)

    # Extending: raise max_steps on the command line.
    assert main(["--recipe", str(path), "--resume", "trainer.max_steps=3"]) == 0
    assert f"(resuming {run / 'checkpoint-2'})" in capsys.readouterr().out
    state = json.loads((run / rundir.STATE_FILE).read_text())
    assert state["global_step"] == 3 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------------------
# a failed save is said plainly and leaves nothing --resume would pick; --check sees an unwritable dir

# From inside step 3's reward call on, this process may write no file over 32 KB -- as when the disk fills up
# mid-run: checkpoint-3's adapter weights (69 KB) fail part-written. SIGXFSZ is ignored so the write fails
# with EFBIG instead of killing the process.
DISK_FILLS = """
import os, resource, signal

def fill(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step == 2 and os.environ.get("FILL_DISK"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768))
    return [0.0 for _ in completions]
"""


@pytest.mark.slow
def test_a_failed_save_stops_with_a_clear_message_and_no_damaged_checkpoint(tmp_path):
    (tmp_path / "fill.py").write_text(DISK_FILLS)
    data = with_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=1, optim="adamw_torch",
                        per_device_train_batch_size=4, num_generations=4)
    data["rewards"].append({"name": "fill.py:fill"})
    path = write_recipe(tmp_path, data)
    run = tmp_path / "run"
    failed = launch("--recipe", str(path), env={**os.environ, "FILL_DISK": "1"})
    print(failed.stderr[-1500:])  # shown when the test fails
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert "run stopped: saving checkpoint-3 failed: " in failed.stderr
    assert f"free space in {run}: " in failed.stderr and " GB of " in failed.stderr
    assert f"removed the incomplete {run / 'checkpoint-3'}" in failed.stderr
    assert f"last checkpoint: {run / 'checkpoint-2'}\ncontinue with: {rundir.interpreter()} launch.py --recipe {path} --resume" in failed.stderr
    assert "Traceback" not in failed.stderr
    assert rundir.latest_checkpoint(run) == str(run / "checkpoint-2") and not (run / "checkpoint-3").exists()

    resumed = launch("--recipe", str(path), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / rundir.STATE_FILE).read_text())["global_step"] == 4


def test_check_refuses_an_output_dir_that_cannot_be_written(tmp_path, capsys):
    from grpokit.cli import main

    (tmp_path / "taken").write_text("a file where the runs folder should be")
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(tmp_path / "taken" / "run")))
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"trainer.output_dir: cannot be written: {tmp_path / 'taken'} is a file, not a folder" in err
    assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_check_refuses_a_read_only_output_dir(tmp_path, capsys):
    from grpokit.cli import main

    (tmp_path / "ro").mkdir(mode=0o555)
    path = write_recipe(tmp_path, with_trainer(tmp_path, output_dir=str(tmp_path / "ro" / "run")))
    assert main(["--recipe", str(path), "--check"]) == 2
    assert f"cannot be written: {tmp_path / 'ro'}: Permission denied" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------------
# the run's own files -- recipe.yaml portable and typed as written, a true model card

USER_REWARD = "def score(completions, **kwargs):\n    return [0.0 for _ in completions]\n"


def test_the_saved_recipe_is_portable_and_writes_step_counts_as_ints(tmp_path):
    import shutil

    from grpokit.config import load, validate
    from grpokit.run.runfiles import write_recipe_file
    from helpers import SMOKE_DATA

    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    shutil.copy(SMOKE_DATA, project / "data" / "smoke.jsonl")
    (project / "my_rewards.py").write_text(USER_REWARD)
    data = with_trainer(project, output_dir=str(project / "runs" / "a"), logging_steps=1, save_steps=10)
    data["dataset"]["path"] = "data/smoke.jsonl"
    data["rewards"].append({"name": "my_rewards.py:score"})
    recipe = validate(load(write_recipe(project, data)))
    (project / "runs" / "a").mkdir(parents=True)
    saved = write_recipe_file(recipe, project / "runs" / "a")
    text = saved.read_text()
    assert "path: ../../data/smoke.jsonl" in text and "name: ../../my_rewards.py:score" in text
    assert "logging_steps: 1\n" in text and "save_steps: 10\n" in text
    # Past the comment line no absolute path of the project is left but output_dir, kept as given (relative to
    # where a command runs, like any output_dir).
    assert [line for line in text.splitlines()[1:] if str(project) in line] == [f"  output_dir: {project / 'runs' / 'a'}"]

    moved = tmp_path / "elsewhere"
    shutil.move(project, moved)  # the project travels with its runs
    again = validate(load(moved / "runs" / "a" / "recipe.yaml"))
    assert again.dataset["path"] == str(moved / "data" / "smoke.jsonl")
    assert again.rewards[-1]["name"] == f"{moved / 'my_rewards.py'}:score"
    assert again.trainer["logging_steps"] == 1 and again.trainer["save_steps"] == 10


def test_the_model_card_names_the_real_base_model_dataset_and_recipe(tmp_path):
    from grpokit.config import load, validate
    from grpokit.reporting.model_card import write_model_card

    (tmp_path / "my_rewards.py").write_text(USER_REWARD)
    data = with_trainer(tmp_path)
    data["rewards"].append({"name": "my_rewards.py:score", "weight": 0.5})
    recipe = validate(load(write_recipe(tmp_path, data)))
    (tmp_path / "run").mkdir()
    card = write_model_card(recipe, tmp_path / "run", 30).read_text()
    assert "None" not in card
    assert "This is a LoRA adapter (r=8) for builtin:tiny-llama, trained with GRPO" in card
    assert "- base model: `builtin:tiny-llama`" in card and "- dataset: `smoke.jsonl` (split `train`)" in card
    assert "- rewards: 1 x char_fraction + 0.5 x my_rewards.py:score" in card and str(tmp_path / "my_rewards.py") not in card
    assert "- steps trained: 30" in card and "`recipe.yaml`" in card

    hub = validate(load(write_recipe(tmp_path, {**data, "model": {"name_or_path": "Qwen/Qwen2.5-1.5B-Instruct"},
                                                "dataset": {"name": "openai/gsm8k", "config": "main", "prompt_column": "question"}})))
    card = write_model_card(hub, tmp_path / "run", 30).read_text()
    assert "base_model: Qwen/Qwen2.5-1.5B-Instruct" in card and "datasets: [openai/gsm8k]" in card
    assert "[Qwen/Qwen2.5-1.5B-Instruct](https://huggingface.co/Qwen/Qwen2.5-1.5B-Instruct)" in card


def test_a_user_reward_shows_as_its_file_name_in_the_explain_table(tmp_path):
    from grpokit.config import load, validate
    from grpokit.config.trainer_args import grpo_args
    from grpokit.reporting.explain import explain_table

    (tmp_path / "my_rewards.py").write_text(USER_REWARD)
    data = with_trainer(tmp_path)
    data["rewards"].append({"name": "my_rewards.py:score"})
    recipe = validate(load(write_recipe(tmp_path, data)))
    table = "\n".join(explain_table(recipe, grpo_args(recipe)))
    assert "1 x my_rewards.py:score" in table and str(tmp_path) not in table


def test_the_continue_command_names_the_python_a_user_types(monkeypatch, tmp_path):
    """`python` only where it is the one the user's PATH finds (an activated venv); else the interpreter's path,
    relative to the working folder when inside it, as the README writes `.venv/bin/python`."""
    import sys

    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert rundir.interpreter() == ".venv/bin/python"
    assert rundir.resume_command(["--recipe", "my.yaml"]) == ".venv/bin/python launch.py --recipe my.yaml --resume"
    monkeypatch.setenv("PATH", str(venv))  # activated
    assert rundir.interpreter() == "python"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.chdir("/")
    assert rundir.interpreter() == str(venv / "python")


def test_the_continue_command_of_a_multi_process_run_keeps_its_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # inside one of the started processes
    # Started by grpokit's own launcher (--num-processes): the same python command starts them again.
    assert rundir.resume_command(["--recipe", "my.yaml", "--num-processes", "2"]) == \
        f"{rundir.interpreter()} launch.py --recipe my.yaml --num-processes 2 --resume"
    # Started by `accelerate launch launch.py ...`: so is the continuation.
    assert rundir.resume_command(["--recipe", "my.yaml"]) == "accelerate launch launch.py --recipe my.yaml --resume"


def test_a_first_signal_waits_for_the_step_end_and_a_second_stops_at_once():
    import signal

    from transformers import TrainerControl, TrainerState, TrainingArguments

    from grpokit.lifecycle import SafeStop, StopOnSignal, Stopped

    before = signal.getsignal(signal.SIGTERM)
    with StopOnSignal() as stop:
        with pytest.raises(Stopped) as early:  # while loading: nothing to save, stop now
            os.kill(os.getpid(), signal.SIGTERM)
        assert early.value.exit_code == 143 and early.value.step is None
        stop.signum = None
        safe = SafeStop(stop)
        safe.on_train_begin(None, None, None)
        os.kill(os.getpid(), signal.SIGINT)  # mid-step: remembered, the step goes on
        assert stop.signum == signal.SIGINT
        control, state = TrainerControl(), TrainerState(global_step=7, max_steps=10)
        safe.on_step_end(TrainingArguments(output_dir="unused", report_to=[]), state, control)
        assert control.should_save and control.should_training_stop and safe.stopped_at == 7
        assert safe.saving == "checkpoint-7"  # until on_save says the checkpoint is whole
        safe.on_save(None, state, control)
        assert safe.saving is None
        with pytest.raises(Stopped) as second:
            os.kill(os.getpid(), signal.SIGINT)  # a second signal: at once
        assert second.value.exit_code == 130
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored
