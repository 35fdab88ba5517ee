"""The untrusted-work pool (grpokit/untrusted/pool.py) under hard input, through math-verify and
reasoning-gym's scorers: identical checks run once per call, a dead worker or cage is replaced, spares take the queue, nothing outlives the
trainer's process, and the cage holds (layers reported; a worker that ran an answer's code scores nothing after it).

Speed (64 copies of a power tower in <= 3 s on 2 cores; the cage's cost per scored completion) is measured in
bench/rewards.py, not here.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, cage_processes

import rewards
from grpokit.prompts import tasks
from grpokit.untrusted import child as layers
from grpokit.untrusted import pool as untrusted
from rewards.math import MATH_VERIFY, Accuracy
from rewards.tasks import SCORERS

TOWER = r"\boxed{9^{9^{9^{9}}}}"


def test_identical_checks_run_once_per_call(monkeypatch):
    sent = []
    real_run = untrusted.Pool.run

    def counting_run(self, jobs, timeout):
        sent.append(list(jobs))
        return real_run(self, jobs, timeout)

    monkeypatch.setattr(untrusted.Pool, "run", counting_run)
    completions = [TOWER] * 64 + [r"\boxed{\sqrt{4}}"] * 3 + [r"\boxed{\sqrt{9}}"]
    golds = ["42"] * 64 + ["2"] * 3 + ["2"]
    got = Accuracy()(completions=completions, answer=golds)
    assert got == [0.0] * 64 + [1.0] * 3 + [0.0]  # every copy gets the verdict of the one check
    assert [len(jobs) for jobs in sent] == [3]  # the tower once, sqrt(4) once, sqrt(9) once


# A parent that starts the pool, gives each worker a bignum job with a 60 s limit, reports the pids of every process
# of the cage once both workers are inside the job, and waits to be killed.
PARENT = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/tests")
from helpers import cage_processes
from grpokit.untrusted.pool import shared
from rewards.math import MATH_VERIFY

pool = shared(MATH_VERIFY, 2)
job = [["\\boxed{42}"], ["\\boxed{9^{9^{9^{9^{9^{9}}}}}}"]]
threading.Thread(target=pool.run, args=([job, job], 60.0), daemon=True).start()
def running(pid):  # a runner computing its tower (state R), as /proc shows it
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "R"
    except OSError:
        return False
while not (len(pool._workers) == 2 and all(w.job is not None for w in pool._workers)
           and sum(map(running, cage_processes(pool, depth=4))) == 2):
    time.sleep(0.01)  # polling the pool's state, not a timing assert
print(pool._cages[0].group, " ".join(map(str, cage_processes(pool))), flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds to wait on a process that is not our child")
def test_nothing_of_the_cage_outlives_the_trainer_killed_mid_job():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        group, *pids = line.split()
        pids = [int(p) for p in pids]
        assert len(pids) >= 6, line  # bootstrap, zygote, two keepers, two workers
        fds = [os.pidfd_open(pid) for pid in pids]  # held before the kill, so a reused pid cannot confuse us
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        # Bounded wait on each exit event: "promptly" is well under the 60 s job limit, let alone the ~3 min the CPU
        # limit allowed; 20 s leaves room for a loaded 2-core machine.
        deadline = time.monotonic() + 20
        waiting = list(fds)
        while waiting and time.monotonic() < deadline:
            ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
            waiting = [fd for fd in waiting if fd not in ready]
        assert not waiting, "a process of the cage is still running after the trainer was killed"
        # Nor its cgroups: the bootstrap's parent-death signal lets it remove them before it goes.
        assert not [parent for parent, _, _ in layers._cgroup_places() if os.path.exists(os.path.join(parent, group))]
    finally:
        for fd in fds:
            os.close(fd)
        for pid in pids:  # never leave a spinning worker behind, whatever the outcome
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_killed_cage_is_replaced():
    reward = Accuracy()
    assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]
    pool = untrusted.shared(MATH_VERIFY, 2)
    cage = pool._cages[0].proc
    cage.kill()
    cage.wait()
    # Its workers die with it (parent-death signals, pid namespaces); the next call starts a new cage and retries.
    assert reward(completions=[r"\boxed{\sqrt{9}}", r"\boxed{\pi}"], answer=["3", r"\pi"]) == [1.0, 1.0]
    assert pool._cages[0].proc.pid != cage.pid


def test_workers_killed_from_outside_are_replaced_and_their_jobs_retried():
    reward = Accuracy()
    assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]  # workers are up
    pool = untrusted.shared(MATH_VERIFY, 2)
    for pid in cage_processes(pool, depth=4):  # the workers themselves (bootstrap 1, zygote 2, keepers 3)
        os.kill(pid, signal.SIGKILL)
    # Both workers are dead before the next job: it is retried on fresh ones, not scored 0.0.
    assert reward(completions=[r"\boxed{\sqrt{9}}", r"\boxed{\pi}"], answer=["3", r"\pi"]) == [1.0, 1.0]


def test_spares_take_the_queue_while_hard_checks_run_out_their_time():
    # Four distinct towers fill both workers and then the spares; the easy checks queued behind them still get their
    # verdicts, and the spares are gone when the call returns.
    pool = untrusted.shared(MATH_VERIFY, 2)
    towers = [rf"\boxed{{{b}^{{{b}^{{{b}^{{{b}}}}}}}}}" for b in (3, 4, 5, 6)]
    easy = [r"\boxed{\sqrt{4}}", r"\boxed{\sqrt{9}}", r"\boxed{\frac{6}{3}}"]
    got = Accuracy()(completions=towers + easy, answer=["42"] * 4 + ["2", "2", "2"])
    assert got == [0.0] * 4 + [1.0, 0.0, 1.0]
    assert len(pool._workers) == pool.size == 2


def test_the_cage_holds_on_this_machine():
    # What the development machine and CI grant (root, namespaces allowed): every layer the pool's docstring lists.
    assert Accuracy()(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]
    layers = untrusted.shared(MATH_VERIFY, 2).layers
    if os.geteuid() == 0:
        assert any(layer.startswith("uid=") and layer != "uid=0" for layer in layers)
    assert {"net", "pid", "pid-apart", "newroot", "readonly", "nocaps", "nomemfd"} <= layers, sorted(layers)


def countdown_item() -> str:
    source, problems = tasks.check_source({"tasks": [{"name": "countdown", "config": {"min_numbers": 3, "max_numbers": 3}}],
                                           "size": 1, "seed": 1})
    assert not problems
    return tasks.generate(source).rows[0]["task_item"]


def test_a_worker_that_ran_an_answers_code_scores_nothing_after_it():
    # countdown hands the answer to sympy's parse_expr, which evaluates it: an answer that replaces the scorer's
    # comparison would, in a kept worker, decide how every later completion there is scored.
    item = countdown_item()
    reward = rewards.build("task_score", workers=1)
    pool = untrusted.shared(SCORERS, 1)
    honest = reward(completions=["<answer>1 + 2</answer>"], task_item=[item])
    before = pool.counts.replaced_after_code
    assert reward(completions=["<answer>1 + 2</answer>"], task_item=[item]) == honest  # arithmetic: the worker is kept
    assert pool.counts.replaced_after_code == before
    # Run in a kept worker, this answer makes every later countdown answer there score 1.0 (seen in-process).
    hack = ("<answer>__import__('builtins').exec('import reasoning_gym.games.countdown as c; "
            "c.CountdownDataset.score_answer = lambda self, answer, entry: 1.0')</answer>")
    assert reward(completions=[hack], task_item=[item]) in ([0.0], [0.01], [0.05])
    assert pool.counts.replaced_after_code == before + 1 and "__import__" in pool.counts.last_code  # the first code
    # The next completion is scored by a fresh worker, where the scorer is the task's own.
    assert reward(completions=["<answer>1 + 2</answer>"], task_item=[item]) == honest


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop is what holds without namespaces, and only root can drop")
def test_without_namespaces_the_uid_drop_and_the_limits_still_hold(tmp_path):
    # What a machine refusing `unshare` gets (a container's default seccomp profile): no new root, no network namespace;
    # the job still runs as nobody, within its memory, process and time limits.
    kind = untrusted.Kind(SCORERS.module, SCORERS.what, SCORERS.check, namespaces=False)
    pool = untrusted.Pool(kind, 1)
    try:
        victim = tmp_path / "thesis.tex"
        victim.write_text("years of work")
        item = countdown_item()
        job = lambda text: {"item": item, "text": f"<answer>{text}</answer>", "answer_from": "tag", "tag": "answer"}  # noqa: E731
        delete = f"__import__('os').remove({str(victim)!r}) or 1"
        allocate = "__import__('builtins').exec('x = \" \" * (1 << 36)') or 1"
        replies = pool.run([job("1 + 2"), job(delete), job(allocate), job("__import__('time').sleep(600)")], 1.0)
        assert [r.how for r in replies] == ["result", "result", "result", "timeout"]
        assert replies[0].value == 0.05 and replies[1].value == replies[2].value == 0.01  # the scorer caught the error
        assert victim.read_text() == "years of work"
        assert "net" not in pool.layers and any(layer.startswith("uid=") and layer != "uid=0" for layer in pool.layers)
    finally:
        pool.close()


UNDER_LIMIT = """
import resource, sys
sys.path.insert(0, sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # hard, as a cluster's scheduler sets it
from rewards.math import Accuracy
from grpokit.tools.environments import PythonTool
from grpokit.untrusted import run
tool = PythonTool()
tool.reset()
print(Accuracy()(completions=[r"\\boxed{\\sqrt{4}}"], answer=["2"]), repr(tool.python("print(1 + 1)")),
      run("def add(a, b): return a + b", ["assert add(1, 2) == 3"]).passed)
"""


def test_every_cage_works_under_a_hard_address_space_limit():
    # A limit may only be lowered: each sandbox sets its own within the one it inherits (1 GiB here, below the
    # scorers' start plus their 1 GiB allowance), never above it.
    done = subprocess.run([sys.executable, "-c", UNDER_LIMIT, str(ROOT)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[1.0]", "'2\\n'", "[True]"], done.stdout


def test_the_cage_removes_its_own_cgroups_and_no_other():
    # Groups beside the cage's in the same hierarchy -- one named as another pool's would be -- are not its own.
    places = [parent for parent, _, _ in layers._cgroup_places()]
    if not places:
        pytest.skip("no cgroup hierarchy this process may write")
    foreign = [os.path.join(places[0], name) for name in (f"not-grpokit-{os.getpid()}", f"grpokit-pool-0-{os.getpid()}")]
    for path in foreign:
        os.mkdir(path)
    try:
        pool = untrusted.Pool(MATH_VERIFY, 1)
        assert pool.run([[["\\boxed{2}"], ["\\boxed{\\sqrt{4}}"]]], 30)[0].value is True
        ours = pool._cages[0].group
        assert os.path.isdir(os.path.join(places[0], ours))  # made, with the workers' groups inside
        pool.close()
        assert not os.path.exists(os.path.join(places[0], ours))
        assert all(os.path.isdir(path) for path in foreign)
    finally:
        for path in foreign:
            os.rmdir(path)
