"""A run on CPU: how many threads, how idle threads wait, which dtype the frozen base computes in, and what the
console says about time (seconds per step from the second step on, the time left) -- in a terminal or a log file.

Speed itself is measured in bench/cpu_speed.py, never asserted here.
"""

from __future__ import annotations

import doctest
import importlib
import io
import os
import subprocess
import sys

import pytest
from helpers import ROOT

from grpokit import cpu
from grpokit.run import progress
from grpokit.planning import memory


@pytest.mark.parametrize("module", ["grpokit.run.progress", "grpokit.cpu"])
def test_docstring_examples_run(module):
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted and not result.failed


def _configure(monkeypatch, env: dict, threads=None) -> tuple[str, dict]:
    for key in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys.modules["torch"] if "torch" in sys.modules else cpu, "set_num_threads", lambda n: None,
                        raising=False)
    said = cpu.configure(threads)
    return said, {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}


def test_threads_default_to_every_core_with_sleeping_idle_threads(monkeypatch):
    said, env = _configure(monkeypatch, {})
    assert env == {"OMP_NUM_THREADS": str(cpu.default_threads()), "OMP_WAIT_POLICY": "PASSIVE"}
    assert said.startswith(f"cpu: {cpu.default_threads()} torch thread") and "waiting passive" in said


def test_the_flag_wins_and_the_environment_is_kept_where_the_user_set_it(monkeypatch):
    said, env = _configure(monkeypatch, {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE"}, threads=1)
    assert env == {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}
    assert "OMP_WAIT_POLICY=ACTIVE from the environment" in said
    said, env = _configure(monkeypatch, {"OMP_NUM_THREADS": "3"})
    assert env["OMP_NUM_THREADS"] == "3" and "OMP_NUM_THREADS from the environment" in said


def test_a_launch_says_its_threads_and_applies_them_before_torch_starts(tmp_path):
    """In a fresh process (torch not yet imported) the pool is built with the chosen count."""
    code = ("import sys; sys.argv = ['launch.py', '--threads', '1', '--recipe', 'recipes/smoke.yaml', '--eval', "
            f"'trainer.output_dir={tmp_path}/run']\n"
            "from grpokit import cli, cpu\nfrom grpokit.dist import say\n"
            "args = cli.parser().parse_intermixed_args(sys.argv[1:])\nsay(cpu.configure(args.threads))\n"
            "import torch; print('threads', torch.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "[grpokit] cpu: 1 torch thread, OpenMP waiting passive" in done.stdout + done.stderr
    assert "threads 1" in done.stdout


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_threads_must_be_a_whole_number_of_threads(text, capsys):
    from grpokit import cli

    with pytest.raises(SystemExit) as caught:
        cli.main(["--threads", text, "--check"])
    assert caught.value.code == 2
    assert f"argument --threads: must be a whole number of threads, 1 or more (got {text!r})" in capsys.readouterr().err


# --- the dtype `auto` resolves to on CPU ---------------------------------------------------------------

@pytest.mark.parametrize("flags, lora, quantization, expected", [
    ("fpu avx512f avx512_bf16", True, "none", "bfloat16"),   # LoRA on a CPU with bf16 instructions: the frozen base in bf16
    ("fpu avx512f amx_bf16", True, "none", "bfloat16"),
    ("fpu avx512f avx512_bf16", False, "none", "float32"),   # full fine-tune: the weights the optimizer updates stay fp32
    ("fpu avx512f avx512_bf16", True, "4bit", "float32"),     # a quantized base is not a bf16 one
    ("fpu avx2", True, "none", "float32"),                    # bf16 emulated: slower than fp32
])
def test_auto_on_cpu_is_bfloat16_only_where_it_is_native_and_the_base_is_frozen(tmp_path, monkeypatch, flags, lora,
                                                                                 quantization, expected):
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    native = cpu.cpu_computes_bf16(str(info))
    monkeypatch.setattr(cpu, "cpu_computes_bf16", lambda *args: native)
    model = {"dtype": "auto", "quantization": quantization}
    assert cpu.cpu_dtype(model, lora) == expected
    assert memory.planned_dtype(model, "cpu", lora=lora) == expected  # --check's plan follows the run
    assert memory.planned_dtype({"dtype": "float32"}, "cpu", lora=lora) == "float32"  # a recipe's own dtype wins


def test_cpu_bf16_is_read_from_the_kernels_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n")
    assert cpu.cpu_computes_bf16(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert not cpu.cpu_computes_bf16(str(info))


# --- what the console says about time ----------------------------------------------------------------

def test_each_step_line_carries_the_pace_and_the_time_left_from_the_second_step():
    pace = progress.Pace()
    first = progress.line({"reward": 0.1, "step_time": 41.0}, 1, 30, pace)
    second = progress.line({"reward": 0.2, "step_time": 18.0}, 2, 30, pace)
    third = progress.line({"reward": 0.3, "step_time": 20.0}, 3, 30, pace)
    assert first.endswith("first step 41 s (warm-up)")
    assert second.endswith("18 s/step, ~8 min left")  # 28 steps x 18 s
    assert third.endswith("19 s/step, ~9 min left")   # the first step left out of the rate
    assert progress.line({"reward": 0.3}, 4, 30, pace).endswith("reward 0.300")  # no step_time logged: nothing said


def test_in_a_log_file_the_bar_gives_way_to_one_line_per_step():
    """A bar's redraws would share each line of a saved log with the step lines."""
    from transformers.trainer_callback import ProgressCallback

    class Handler:
        def __init__(self):
            self.callbacks = [ProgressCallback()]

    class Trainer:
        callback_handler = Handler()

        def remove_callback(self, kind):
            self.callback_handler.callbacks = [c for c in self.callback_handler.callbacks if type(c) is not kind]

        def add_callback(self, kind):
            self.callback_handler.callbacks.append(kind())

    for interactive, kind in ((False, progress.CompactPrinter), (True, progress.CompactProgress)):
        trainer = Trainer()
        trainer.callback_handler = Handler()
        progress.install(trainer, interactive=interactive)
        assert [type(c) for c in trainer.callback_handler.callbacks] == [kind]
    out = io.StringIO()
    sys_stdout, sys.stdout = sys.stdout, out
    try:
        from types import SimpleNamespace

        progress.CompactPrinter().on_log(None, SimpleNamespace(is_world_process_zero=True, global_step=1, max_steps=2),
                                         None, logs={"reward": 0.5, "step_time": 3.0})
    finally:
        sys.stdout = sys_stdout
    assert out.getvalue() == ("step 1/2  reward 0.500  first step 3 s (warm-up)\n"
                              "(reward: the mean score of the step's completions ± its spread)\n")  # its legend, once
