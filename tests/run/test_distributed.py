"""Beyond one process: the shipped accelerate configs, batch checks that count processes, and a real
2-process DDP run on CPU (gloo) through `accelerate launch`.

Which accelerate invocation gives two CPU processes: `--cpu` (or a MULTI_CPU config) takes accelerate's
simple launcher, which starts ONE process unless given an MPI hostfile. The torchrun-based launcher
(`--multi_gpu`, or recipes/accelerate/multi_gpu.yaml) starts N processes with or without GPUs; on a
machine without one, grpokit sets `use_cpu` so transformers joins them into one gloo process group
(otherwise each would train alone with world size 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, with_trainer, write_recipe

from grpokit.cli import main
from grpokit.run.launcher import free_port

CONFIGS = ROOT / "recipes" / "accelerate"

# Each rank leaves a marker: its rank, the process group's size as torch.distributed sees it, and its threads.
RANK_PROBE = '''
import json, os, pathlib
import torch

def rank_probe(completions, **kwargs):
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    marker = pathlib.Path(__file__).with_name(f"rank-{os.environ.get('RANK', 'none')}.json")
    marker.write_text(json.dumps({"world": world, "samples": len(completions), "threads": torch.get_num_threads()}))
    return [0.0 for _ in completions]
'''


@pytest.mark.parametrize(
    "name,distributed_type,extra",
    [
        ("single_gpu", "NO", {}),  # one process, one GPU
        ("multi_gpu", "MULTI_GPU", {}),  # DDP via torchrun: the launcher that really starts N processes
        ("zero2", "DEEPSPEED", {"zero_stage": 2}),  # optimizer state + gradients sharded
        ("zero3", "DEEPSPEED", {"zero_stage": 3, "zero3_init_flag": True}),  # weights sharded too
    ],
)
def test_accelerate_configs_load(name, distributed_type, extra):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"{name}.yaml"))
    assert config.distributed_type.name == distributed_type
    for key, value in extra.items():
        assert config.deepspeed_config[key] == value
    text = (CONFIGS / f"{name}.yaml").read_text()
    assert f"accelerate launch --config_file recipes/accelerate/{name}.yaml" in text  # opens with its command


def test_check_counts_the_processes_given(tmp_path, capsys):
    """8 per device x 3 processes = 24 completions a step: not whole groups of 16; --check says how to fix it."""
    path = write_recipe(tmp_path, with_trainer(tmp_path, per_device_train_batch_size=8, num_generations=16))
    assert main(["--recipe", str(path), "--check", "--num-processes", "2"]) == 0  # 16: one whole group
    capsys.readouterr()
    assert main(["--recipe", str(path), "--check", "--num-processes", "3"]) == 2
    err = capsys.readouterr().err
    assert "the generation batch (24 = per_device_train_batch_size 8 x 3 process(es) x gradient_accumulation_steps 1)" in err
    assert "must be divisible by num_generations (16)" in err and "e.g. per_device_train_batch_size: 16" in err
    assert "Traceback" not in err


def test_check_reads_the_launchers_world_size(tmp_path, capsys, monkeypatch):
    """Under `accelerate launch` / torchrun, WORLD_SIZE gives the process count without --num-processes."""
    path = write_recipe(tmp_path, with_trainer(tmp_path, per_device_train_batch_size=8, num_generations=16))
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert main(["--recipe", str(path), "--check"]) == 2
    assert "x 3 process(es)" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["--recipe", str(path), "--check"]) == 0  # TRL's own check sees the same 2 processes


@pytest.mark.slow
def test_two_cpu_processes_train_as_one_ddp_run(tmp_path):
    (tmp_path / "probe.py").write_text(RANK_PROBE)
    data = with_trainer(tmp_path, max_steps=2, per_device_train_batch_size=2, num_generations=4, optim="adamw_torch")
    data["rewards"].append({"name": "probe.py:rank_probe"})
    path = write_recipe(tmp_path, data)
    # OMP_NUM_THREADS=1: two processes on two cores, one thread each (accelerate passes it on).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / "multi_gpu.yaml"),
           "--num_processes", "2", "--main_process_port", str(free_port()), "launch.py", "--recipe", str(path)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]

    markers = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("rank-*.json")}
    assert sorted(markers) == ["rank-0.json", "rank-1.json"]  # both ranks scored completions
    for marker in markers.values():
        assert marker["world"] == 2  # in one process group, not two runs side by side
        assert marker["samples"] == 2  # each scored its half of the 4-completion group
        assert marker["threads"] == 1  # no oversubscription of the cores
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    assert state["global_step"] == 2  # the run finished
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()
    assert proc.stdout.count("[grpokit] training: 2 steps") == 1  # progress lines come from the main process only
