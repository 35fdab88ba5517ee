"""What a newcomer meets in the first hour after `make demo`: each stumble a newcomer can meet, pinned.

These run `launch.py` the way a user does -- as a subprocess, with the interpreter a user might have --
and assert on what they would read: one plain line, the exit code, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv

import pytest
from helpers import ROOT, recipe_dict, write_recipe

LAUNCH = str(ROOT / "launch.py")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A fresh venv without pip or any package: the interpreter a user gets from `python3` outside .venv."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    return str(where / "bin" / "python")


@pytest.mark.parametrize("argv", [
    ["--recipe", "recipes/smoke.yaml", "trainer.max_steps=2"],  # the command
    ["--help"],  # --help needs no dependencies: it must not pass for a working install
])
def test_launch_without_dependencies_says_what_to_do(bare_python, argv):
    done = subprocess.run([bare_python, LAUNCH, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    line = lines[0]
    assert "yaml" in line and "torch" in line  # what is missing, named
    assert ".venv/bin/python launch.py" in line and "make demo" in line and "activate" in line
    assert " ".join(argv) in line  # the user's own command, ready to paste


def test_launch_with_dependencies_goes_on(tmp_path):
    """The check costs nothing where the dependencies are present: --help answers as before."""
    done = subprocess.run([sys.executable, LAUNCH, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: launch.py" in done.stdout


def _launch(*argv, env_extra=None, timeout=240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, LAUNCH, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


HUB_RECIPE = recipe_dict(
    model={"name_or_path": "grpokit-tests/no-such-model"},
    dataset={"name": "grpokit-tests/no-such-dataset", "prompt_column": "prompt"},
)


@pytest.mark.slow
@pytest.mark.parametrize("env_extra, why", [
    # nothing listens on port 9: the hub cannot be reached, as on a machine without network
    ({"HF_ENDPOINT": "http://127.0.0.1:9"}, "cannot be reached"),
    ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1 is set"),
])
def test_hub_model_and_dataset_not_reachable_fail_at_once_and_plainly(tmp_path, env_extra, why):
    """No retry warnings and no message cut mid-URL: at once, one problem per
    missing thing, naming it, saying it is not cached and why nothing was fetched, and the download command."""
    recipe = write_recipe(tmp_path, HUB_RECIPE | {"trainer": HUB_RECIPE["trainer"] | {"output_dir": str(tmp_path / "run")}})
    done = _launch("--recipe", str(recipe), env_extra=env_extra | {"HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Retrying" not in done.stderr and "..." not in done.stderr
    problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 2, done.stderr
    model, dataset = problems
    assert "model.name_or_path" in model and "'grpokit-tests/no-such-model' is not in the local cache" in model
    assert "`hf download grpokit-tests/no-such-model`" in model
    assert "dataset.name" in dataset and "'grpokit-tests/no-such-dataset' is not in the local cache" in dataset
    assert "`hf download grpokit-tests/no-such-dataset --repo-type dataset`" in dataset
    for line in problems:
        assert why in line and "HF_HUB_OFFLINE" in line
    assert not (tmp_path / "run").exists()  # refused before the run directory is made


# --- a multi-process launch keeps the promise: exit 2, grpokit's message only ---

ACCELERATE_NOISE = ("Traceback", "CalledProcessError", "ChildFailedError", "defaults used", "were not passed to")

# A reward module that cannot be imported in the started processes only: the one kind of mistake the launching
# process cannot see first, so the processes' own exit 2 must travel through accelerate unchanged.
FAILS_WHEN_LAUNCHED = '''
import os

if os.environ.get("GRPOKIT_LAUNCHED"):
    raise RuntimeError("the grader's table is missing on this node")


def score(completions, **kwargs):
    return [0.0 for _ in completions]
'''


@pytest.mark.slow
def test_num_processes_validates_before_any_process_starts(tmp_path):
    bad = write_recipe(tmp_path, recipe_dict() | {"trainer": recipe_dict()["trainer"] | {"epsilon_hihg": 0.3}})
    done = _launch("--recipe", str(bad), "--num-processes", "2")
    assert done.returncode == 2
    assert done.stderr.startswith("1 problem found:\n") and "did you mean 'epsilon_high'?" in done.stderr
    assert not any(noise in done.stderr + done.stdout for noise in ACCELERATE_NOISE)


@pytest.mark.slow
@pytest.mark.parametrize("launch_args, batch", [
    (["--accelerate-config", "recipes/accelerate/single_gpu.yaml"], 8),  # accelerate's one-process launcher
    pytest.param(["--num-processes", "2"], 2, marks=pytest.mark.slow),  # DDP through torch's elastic agent
])
def test_a_mistake_found_in_the_started_processes_ends_as_theirs(tmp_path, launch_args, batch):
    (tmp_path / "grader.py").write_text(FAILS_WHEN_LAUNCHED)
    data = recipe_dict(rewards=[{"name": "grader.py:score"}])
    data["trainer"] |= {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": batch}
    recipe = write_recipe(tmp_path, data)
    done = _launch("--recipe", str(recipe), *launch_args, env_extra={"OMP_NUM_THREADS": "1"}, timeout=400)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "problem found" in done.stderr and "the grader's table is missing on this node" in done.stderr
    assert not any(noise in done.stderr + done.stdout for noise in ACCELERATE_NOISE), done.stderr[-3000:]
    assert not (tmp_path / "run").exists()


# --- no noise a user cannot act on; real progress stays ---

def test_loading_the_model_prints_no_loading_weights_bar(tmp_path, tiny_model_dir, capfd):
    """transformers 5 draws a 'Loading weights' bar for every load, 21/21 in a blink for the tiny model; grpokit
    already says 'building model: ...'. Download bars (huggingface_hub's own) are real progress and stay."""
    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model

    recipe = validate(load(write_recipe(tmp_path, recipe_dict())))
    capfd.readouterr()
    model = load_model(str(tiny_model_dir), recipe)
    assert model is not None and "Loading weights" not in capfd.readouterr().err


def test_the_end_of_training_is_one_line_not_a_dict(capsys):
    """The raw {'train_runtime': '40.89', ...} dict transformers prints at the end becomes one sentence."""
    import io

    from tqdm.auto import tqdm
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from grpokit.run.progress import CompactProgress

    callback, out = CompactProgress(), io.StringIO()
    callback.training_bar = tqdm(total=30, file=out)
    state = TrainerState(global_step=30, max_steps=30)
    logs = {"train_runtime": 40.89, "train_samples_per_second": 5.87, "train_steps_per_second": 0.734,
            "train_loss": 0.0007017, "epoch": 0.9375}
    callback.on_log(TrainingArguments(output_dir="/tmp/unused", report_to=[]), state, TrainerControl(), logs=logs)
    text = capsys.readouterr().out  # tqdm.write prints above the bar, on stdout
    assert "{" not in text and "train_runtime" not in text
    assert "trained 30 steps in 40.9 s (0.734 steps/s); mean loss over the run 0.0007017" in text


def test_metrics_destinations_are_said_and_trackio_project_is_the_recipe(tmp_path, monkeypatch):
    from grpokit.config import load, validate
    from grpokit.config.trainer_args import grpo_args
    from grpokit.run.progress import events

    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    data = recipe_dict()
    data["trainer"] |= {"output_dir": str(tmp_path / "run"), "report_to": ["tensorboard", "trackio"]}
    args = grpo_args(validate(load(write_recipe(tmp_path, data, name="my-run.yaml"))))
    assert args.project == "my-run"  # not transformers' "huggingface"
    assert args.ddp_find_unused_parameters is False  # LoRA: no per-step unused-parameter search, no DDP warning
    lines = events(args)
    board = str(tmp_path / "run" / "tensorboard")
    assert lines == [f"metrics: TensorBoard, {board} (view: tensorboard --logdir {board})",
                     "metrics: Trackio, project 'my-run' (view: trackio show --project my-run)"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == board  # where transformers' TensorBoard callback will write


@pytest.mark.slow
def test_a_two_process_run_through_the_launcher_is_quiet(tmp_path):
    """A real 2-step DDP run on CPU via --num-processes 2: it trains, and prints neither DDP's
    find_unused_parameters warning (once per rank) nor transformers' end-of-run dict nor a loading bar, nor its line
    that it turns off the cache a checkpointed training forward cannot use (TRL's default checkpointing is on)."""
    data = recipe_dict()
    data["trainer"] |= {"output_dir": str(tmp_path / "run"), "per_device_train_batch_size": 2, "disable_tqdm": False}
    done = _launch("--recipe", str(write_recipe(tmp_path, data)), "--num-processes", "2",
                   env_extra={"OMP_NUM_THREADS": "1"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    both = done.stdout + done.stderr
    for noise in ("find_unused_parameters", "train_runtime", "Loading weights", "Traceback", "defaults used",
                  "incompatible with gradient checkpointing"):
        assert noise not in both, noise
    assert "trained 2 steps in " in both and (tmp_path / "run" / "report.md").is_file()


def test_make_setup_says_what_it_does_without_echoing_its_shell(tmp_path):
    """The set-up recipe runs for real, against a stand-in venv whose python and uv only record their calls: the
    user sees make's progress lines, not the shell block (if ... then ... fi) make would echo."""
    import shutil

    if not shutil.which("make"):
        pytest.skip("no make on this machine")
    venv_dir = tmp_path / "venv"
    (venv_dir / "bin").mkdir(parents=True)
    for tool in ("python", "uv"):
        stub = venv_dir / "bin" / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\n')
        stub.chmod(0o755)
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # no nvidia-smi: the CPU branch
    done = subprocess.run(["make", "--no-print-directory", "setup", f"VENV={venv_dir}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("set-up: ") and lines[-1].startswith("set-up done: further commands run with ")
    assert "  torch 2.13.0: the CPU build (no CUDA GPU)" in lines
    assert not any(word in done.stdout for word in ("if command", "pip install", "touch", "test -x", "fi"))
    calls = (tmp_path / "calls").read_text()
    assert "-m pip install -q torch==2.13.0" in calls  # the work still ran
    # compiled to bytecode: uv writes no .pyc unless told, and under PYTHONDONTWRITEBYTECODE (CI) Python writes none
    assert calls.count("uv pip install -q --compile-bytecode --python") == 2  # grpokit's dependencies and the GGUF


@pytest.mark.slow
def test_plain_accelerate_launch_says_what_its_traceback_is(tmp_path):
    """`accelerate launch launch.py` cannot be kept from adding its traceback (it re-raises any non-zero exit);
    grpokit's message comes first, then one line saying the traceback adds nothing and which command has none."""
    bad = write_recipe(tmp_path, recipe_dict() | {"trainer": recipe_dict()["trainer"] | {"epsilon_hihg": 0.3}})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/single_gpu.yaml",
           LAUNCH, "--recipe", str(bad)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1  # accelerate's own code for a failed script
    message, note = done.stderr.index("1 problem found:"), done.stderr.index("(accelerate launch follows this")
    assert message < note < done.stderr.index("Traceback")
    assert "--num-processes N` checks the recipe" in done.stderr
