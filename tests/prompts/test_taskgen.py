"""A reasoning-gym source's problems are made within a bound (grpokit.taskgen): a config that cannot make them in time or
in memory is refused at --check, and before a run loads weights, with one line naming the key that makes it expensive
and the bound. The bounds are made small here so that each refusal comes in seconds; the configs refused are past
them by orders of magnitude (a hang, or tens of GiB), so no verdict depends on this machine's speed."""

from __future__ import annotations

import pytest
from helpers import recipe_dict, write_recipe

from grpokit import taskgen
from grpokit.prompts import tasks
from grpokit.cli import main


def task_recipe(tmp_path, task: dict, size: int = 10) -> str:
    data = recipe_dict(dataset={"reasoning_gym": {"tasks": [task], "size": size, "eval_size": 5}},
                       rewards=[{"name": "task_score"}],
                       trainer={**recipe_dict()["trainer"], "output_dir": str(tmp_path / "run")})
    return str(write_recipe(tmp_path, data))


@pytest.fixture
def small_bounds(monkeypatch):
    monkeypatch.setattr(taskgen, "PROBLEM_S", 3.0)
    monkeypatch.setattr(taskgen, "TOTAL_S", 20.0)
    monkeypatch.setattr(taskgen, "MEMORY_BYTES", 2 * 2**30)
    monkeypatch.setattr(taskgen, "ROW_BYTES", 100 << 10)
    tasks._made.cache_clear()
    tasks._generate.cache_clear()


def refusal(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 1, err
    return lines[0]


AT_FIRST = "(training problem 0, seeds from 1)"


@pytest.mark.parametrize("task, key, bound", [
    # 10^8 terms: one problem never finishes (it did not in minutes): the per-problem time bound ends it
    ({"name": "chain_sum", "config": {"min_terms": 10**8, "max_terms": 10**8}}, "config.min_terms",
     f"made no problem in 3 s {AT_FIRST}"),
    # 10^6 steps of a 10 x 10 grid: the same
    ({"name": "game_of_life", "config": {"simulation_steps": 10**6}}, "config.simulation_steps",
     f"made no problem in 3 s {AT_FIRST}"),
    # primes up to 10^9 are sieved in a list of 10^9 flags (8 GB): the memory bound ends it at once
    ({"name": "count_primes", "config": {"max_n": 10**9}}, "config.max_n",
     f"needed more than 2 GiB of memory {AT_FIRST}"),
])
def test_a_config_past_the_bound_is_refused_at_check_naming_its_key(tmp_path, capsys, no_weights, small_bounds,
                                                                   task, key, bound):
    recipe = task_recipe(tmp_path, task)
    assert main(["--recipe", recipe, "--check"]) == 2
    line = refusal(capsys)
    assert f"{recipe}: dataset.reasoning_gym.tasks[0].{key}: reasoning-gym's {task['name']} " in line, line
    assert bound in line and "the value that makes it expensive" in line, line
    assert f"allowed: the bound: {taskgen.bounds()}" in line and "each problem within 3 s" in line, line


def test_a_set_too_slow_as_a_whole_is_refused_naming_the_size(tmp_path, capsys, no_weights, monkeypatch, small_bounds):
    # chain_sum at its defaults makes a problem in well under a millisecond; 10^6 of them do not fit in 0.5 s
    monkeypatch.setattr(taskgen, "TOTAL_S", 0.5)
    monkeypatch.setattr(taskgen, "PACE_AFTER_S", 0.2)
    assert main(["--recipe", task_recipe(tmp_path, {"name": "chain_sum"}, size=10**6), "--check"]) == 2
    line = refusal(capsys)
    assert "dataset.reasoning_gym.size: reasoning-gym's chain_sum " in line and "(got 1000000)" in line, line
    assert "the number of problems makes it expensive" in line and line.endswith("in 2 GiB of memory; a smaller size"), line


def test_a_run_is_refused_the_same_way_before_any_weights_load(tmp_path, capsys, no_weights, small_bounds):
    task = {"name": "game_of_life", "config": {"simulation_steps": 10**6}}
    assert main(["--recipe", task_recipe(tmp_path, task)]) == 2
    assert "tasks[0].config.simulation_steps: reasoning-gym's game_of_life made no problem in 3 s" in refusal(capsys)
    assert not (tmp_path / "run").exists()


def test_the_key_furthest_past_its_default_is_blamed_in_a_mix():
    mix = [{"name": "chain_sum", "config": {"max_terms": 12}},  # 2x its default 6
           {"name": "game_of_life", "config": {"simulation_steps": 50, "grid_size_x": 5}}]  # 50x; a smaller grid is cheaper
    named = taskgen.blame(mix, "problem", "dataset.reasoning_gym")
    assert named.path == "dataset.reasoning_gym.tasks[1].config.simulation_steps" and named.value == 50
    assert named.why == ("simulation_steps is 50x its default (1), the value that makes it expensive (also past their "
                         "defaults: chain_sum.max_terms)")
    at_defaults = [{"name": "chain_sum", "config": {}}]
    assert taskgen.blame(at_defaults, "total", "k").path == "k.size"
    assert taskgen.blame(at_defaults, "problem", "k").path == "k.tasks"


def test_a_normal_source_is_made_whole_and_the_same_as_in_process():
    src, problems = tasks.check_source({"tasks": [{"name": "leg_counting"}], "size": 30, "seed": 3, "eval_size": 10})
    assert not problems
    made = taskgen.produce([tasks._part(src, False), tasks._part(src, True)])
    assert [len(m) for m in made] == [30, 10]
    direct = tasks.build(tasks._part(src, False))
    assert made[0] == [taskgen.row(direct[i], "leg_counting") for i in range(30)]


# --- under a hard memory limit (a cluster's `ulimit -v`) ------------------------------------------------------------

UNDER_LIMIT = """
import resource, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))  # hard: as a scheduler sets it
from grpokit import taskgen
rows = taskgen.produce([{"tasks": [{"name": "chain_sum", "weight": 1.0, "config": {}}], "size": 3, "seed": 1}])
print(len(rows[0]), "|", taskgen.bounds())
"""


@pytest.mark.parametrize("gib", [16, 6, 3])
def test_problems_are_made_under_a_hard_address_space_limit(gib):
    # The child may not raise the hard limit it inherits: it sets its own bound within it, and says the lower one.
    import subprocess
    import sys

    from helpers import ROOT

    done = subprocess.run([sys.executable, "-c", UNDER_LIMIT, str(ROOT), str(gib << 30)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    made, said = done.stdout.strip().split(" | ")
    assert made == "3"
    if gib < 4:
        assert f"in {gib} GiB of memory (this process's hard address-space limit, `ulimit -v`" in said
    else:
        assert said.endswith("in 4 GiB of memory")


def test_a_child_that_dies_is_said_as_it_died_not_guessed_at():
    import os
    from multiprocessing.connection import Connection

    r, w = os.pipe()
    child = Connection(w, readable=False)
    child.send(("ready",))
    child.close()  # then nothing: it died mid-part

    class Killed:
        def wait(self):
            return -9

    part = {"tasks": [{"name": "chain_sum", "weight": 1.0, "config": {}}], "size": 3, "seed": 1}
    with pytest.raises(taskgen.Died) as died:
        taskgen._collect(Connection(r, writable=False), Killed(), [part], lambda: "Fatal Python error: Aborted")
    assert died.value.what == "killed by SIGKILL; the last line it printed: 'Fatal Python error: Aborted'"
    assert "most likely" not in died.value.what and (died.value.part, died.value.index) == (0, 0)


def test_a_problem_too_big_to_travel_is_refused_at_check_naming_its_key(tmp_path, capsys, no_weights, small_bounds):
    # count_primes keeps its sieve's primes in the entry: max_n 10^6 makes a problem of ~300 KB (10^7: megabytes),
    # which would travel with every completion to the scorer.
    assert main(["--recipe", task_recipe(tmp_path, {"name": "count_primes", "config": {"max_n": 1_000_000}}),
                 "--check"]) == 2
    line = refusal(capsys)
    assert "dataset.reasoning_gym.tasks[0].config.max_n: reasoning-gym's count_primes made a problem of " in line, line
    assert "bytes, over the 100 KiB one problem may hold" in line and "max_n is 100x its default" in line, line
