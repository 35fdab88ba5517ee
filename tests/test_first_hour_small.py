"""Small things a new user meets in the first hour: a key given without its section, a reward file's name one letter
off, progress bars in a log that is not a terminal, accelerate's one thread on a CPU, and the time a run will take."""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

from grpokit.cli import main


@pytest.mark.parametrize("override, section", [("max_steps=3", "trainer.max_steps"),  # a GRPOConfig field
                                               ("chat_template=qwen2_5", "model.chat_template"),  # grpokit's own schema
                                               ("r=8", "lora.r")])  # a LoraConfig field
def test_a_key_given_without_its_section_gets_the_dotted_name(tmp_path, capsys, no_weights, override, section):
    assert main(["--recipe", str(write_recipe(tmp_path, recipe_dict())), override, "--check"]) == 2
    err = capsys.readouterr().err
    key = override.partition("=")[0]
    assert f"{key}: is not a recipe section" in err and f"did you mean '{section}'?" in err and "Traceback" not in err


def test_a_reward_file_one_letter_off_names_the_file_beside_it(tmp_path, capsys, no_weights):
    (tmp_path / "my_rewards.py").write_text("def mine(completions, **kwargs):\n    return [1.0 for _ in completions]\n")
    data = recipe_dict(rewards=[{"name": "my_reward.py:mine"}])
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "my_reward.py' does not exist; did you mean 'my_rewards.py' (beside it)?" in err


def test_the_expected_time_of_a_cpu_run_comes_from_a_measured_row_and_says_which():
    from grpokit.planning import cpu_time

    trainer = {**cpu_time.SHAPE, "max_steps": 30}
    said = cpu_time.estimate(cpu_time.MODEL, trainer, "float32", cpu_bf16=False, cores=2)
    # 115.3 s + 29 x 147.1 s = 73 min, the row measured on a CPU without bfloat16 instructions
    assert said.startswith("time on this CPU: about 73 min for 30 steps (a first step of 115 s, then 147.1 s a step), "
                           "from the measured row for a float32 base on a CPU without bfloat16 instructions: "
                           "bench/cpu_speed.py --steps 3 on 2026-12-03, a 2-core x86_64 with AVX2")
    assert said.endswith('bench/README.md, "CPU time of the real-model recipe". A busier machine takes longer.')
    with_bf16 = cpu_time.estimate(cpu_time.MODEL, trainer, "bfloat16", cpu_bf16=True, cores=16)
    assert "about 7 min for 30 steps" in with_bf16 and "measured with 2 cores, this machine has 16" in with_bf16
    # no row, no figure: another shape, or a dtype no row was measured in
    assert "not measured for this model and batch shape" in cpu_time.estimate("builtin:tiny-llama", trainer, "float32",
                                                                              False, 2)
    assert "not measured for a bfloat16 base on a CPU without" in cpu_time.estimate(cpu_time.MODEL, trainer, "bfloat16",
                                                                                     False, 2)


def test_bench_readme_shows_the_rows_check_estimates_from():
    from helpers import ROOT

    from grpokit.planning import cpu_time

    page = (ROOT / "bench" / "README.md").read_text()
    section = page.split("## CPU time of the real-model recipe", 1)[1].split("\n## ", 1)[0]
    for row in cpu_time.MEASURED:
        line = next(x for x in section.splitlines() if x.startswith(f"| {row.dtype} base ")
                    and ("with bfloat16" if row.cpu_bf16 else "without bfloat16") in x)
        assert f"| {row.first_s:g} | {row.per_step_s:g} | {cpu_time.total_s(row, 30) / 60:.1f} min |" in line, line


def test_check_gives_the_time_of_the_real_model_recipe_on_this_cpu(capsys, no_weights):
    from helpers import ROOT

    assert main(["--recipe", str(ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml"), "--check"]) == 0
    out = capsys.readouterr().out
    assert "  time on this CPU: about " in out and "for 30 steps" in out and "from the measured row" in out


@pytest.mark.slow
def test_accelerate_launch_on_a_cpu_uses_every_core_not_its_one_thread(tmp_path):
    """`accelerate launch` sets OMP_NUM_THREADS=1 for its processes when nothing says otherwise; one process on a CPU
    then ran on one core of the machine's. A recipe mistake ends the process right after it says its threads."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    from grpokit.cpu import default_threads

    bad = write_recipe(tmp_path, recipe_dict() | {"trainer": recipe_dict()["trainer"] | {"epsilon_hihg": 0.3}})
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "recipes/accelerate/single_gpu.yaml",
           str(ROOT / "launch.py"), "--recipe", str(bad)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400, env=env)
    said = [line for line in (done.stdout + done.stderr).splitlines() if "torch thread" in line]
    cores = default_threads()
    assert len(said) == 1 and f"cpu: {cores} torch thread" in said[0], said
    if cores > 1:
        assert "accelerate launch's OMP_NUM_THREADS=1" in said[0]  # what it did not keep, and why


BARS = ("Converting and de-quantizing GGUF tensors", "Writing model shards")


@pytest.mark.slow
def test_a_log_that_is_not_a_terminal_gets_no_progress_bars(tmp_path):
    """A first real-model run converts the GGUF and writes its shards: in a log file each bar's redraws were lines.
    The conversion runs once (a real one, its console a pipe): it draws both bars, which is what the rule is for. Under
    the rule, in a process whose console is a pipe, the very bars it draws -- transformers' GGUF loader's tqdm and its
    shard writer's -- draw nothing (a second conversion would test the same path again, ~20 s)."""
    import os
    import subprocess
    import sys

    from helpers import ROOT

    def run(script: str) -> str:
        env = {**os.environ, "GRPOKIT_CACHE": str(tmp_path / "cache")}
        env.pop("TQDM_DISABLE", None)
        done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=400,
                              env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stderr

    converted = run("from grpokit.checkpoints import gguf\ngguf.ensure_builtin('smollm2-135m-instruct')\n")
    assert [b for b in BARS if b in converted] == list(BARS)
    ruled = run("from grpokit import cli\ncli.bars_only_on_a_terminal()\n"
                "from transformers import modeling_gguf_pytorch_utils as gguf_utils\n"
                "from transformers.utils import logging\n"
                f"for _ in gguf_utils.tqdm(range(3), desc={BARS[0] + '...'!r}):\n    pass\n"
                f"for _ in logging.tqdm(range(3), desc={BARS[1]!r}):\n    pass\n")
    assert not [b for b in BARS if b in ruled], ruled[-2000:]


def test_check_of_the_python_tool_recipe_is_short_and_has_no_library_noise():
    """--check as a user runs it (its own process, so a library's logging reaches the console as it would): the
    decisions first, within 90 lines, and no line of a library's that the user can do nothing about."""
    from helpers import ROOT, launch

    done = launch("--recipe", str(ROOT / "recipes" / "smollm2-135m" / "python_tool.yaml"), "--check")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert len(lines) <= 90, len(lines)
    assert not [line for line in lines if "publisher trust check" in line or "Hugging Face Hub is in offline" in line]
    order = [next(i for i, line in enumerate(lines) if line.startswith(head)) for head in
             ("  model ", "  rewards ", "  tools ", "# data:", "# tool use", "# what this recipe computes", "Memory plan")]
    assert order == sorted(order)  # the decisions, the data, the tools, the objective, then the plan
    assert "gguf_file: null" not in done.stdout and "task_item': '{\"entry\"" not in done.stdout
