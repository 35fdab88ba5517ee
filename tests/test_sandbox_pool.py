"""The math-verify pool under hard input: identical checks run once per call, and workers whose parent died
exit at once instead of finishing a bignum power (with `timeout: 60` that could spin for minutes).

Speed (64 copies of a power tower in <= 3 s on 2 cores) is measured in bench/rewards.py, not here.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT

import rewards._mathpool as mathpool
from rewards.math import Accuracy

TOWER = r"\boxed{9^{9^{9^{9}}}}"


def test_identical_checks_run_once_per_call(monkeypatch):
    sent = []
    real_run = mathpool.VerifierPool.run

    def counting_run(self, jobs, timeout):
        sent.append(list(jobs))
        return real_run(self, jobs, timeout)

    monkeypatch.setattr(mathpool.VerifierPool, "run", counting_run)
    completions = [TOWER] * 64 + [r"\boxed{\sqrt{4}}"] * 3 + [r"\boxed{\sqrt{9}}"]
    golds = ["42"] * 64 + ["2"] * 3 + ["2"]
    got = Accuracy()(completions=completions, answer=golds)
    assert got == [0.0] * 64 + [1.0] * 3 + [0.0]  # every copy gets the verdict of the one check
    assert [len(jobs) for jobs in sent] == [3]  # the tower once, sqrt(4) once, sqrt(9) once


# A parent that starts the pool, gives each worker a bignum job with a 60 s limit, reports the worker
# pids once both are inside the job, and waits to be killed.
PARENT = r"""
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from rewards._mathpool import shared_pool

pool = shared_pool(2)
job = (("\\boxed{42}",), ("\\boxed{9^{9^{9^{9^{9^{9}}}}}}",))
threading.Thread(target=pool.run, args=([job, job], 60.0), daemon=True).start()
while not (len(pool._workers) == 2 and all(w.job is not None and w.gold_ok for w in pool._workers)):
    time.sleep(0.01)  # polling the pool's state, not a timing assert
print(" ".join(map(str, pool.pids())), flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs Linux pidfds to wait on a process that is not our child")
def test_workers_exit_when_their_parent_is_killed_mid_job():
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert len(pids) == 2, line
        fds = [os.pidfd_open(pid) for pid in pids]  # held before the kill, so a reused pid cannot confuse us
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    try:
        # Bounded wait on each exit event: "promptly" is well under the 60 s job limit, let alone the
        # ~3 min the CPU limit allowed; 20 s leaves room for a loaded 2-core machine.
        deadline = time.monotonic() + 20
        waiting = list(fds)
        while waiting and time.monotonic() < deadline:
            ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
            waiting = [fd for fd in waiting if fd not in ready]
        assert not waiting, "a math worker is still running after its parent was killed"
    finally:
        for fd in fds:
            os.close(fd)
        for pid in pids:  # never leave a spinning worker behind, whatever the outcome
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_killed_zygote_is_replaced():
    reward = Accuracy()
    assert reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"]) == [1.0]
    pool = mathpool.shared_pool(2)
    zygote = pool._zygotes[0].proc
    zygote.kill()
    zygote.wait()
    # Its workers die with it (parent-death signal); the next call starts a new zygote and retries.
    assert reward(completions=[r"\boxed{\sqrt{9}}", r"\boxed{\pi}"], answer=["3", r"\pi"]) == [1.0, 1.0]
    assert pool._zygotes[0].proc.pid != zygote.pid


def test_spares_take_the_queue_while_hard_checks_run_out_their_time():
    # Four distinct towers fill both workers and then the spares; the easy checks queued behind them
    # still get their verdicts, and the spares are gone when the call returns.
    pool = mathpool.shared_pool(2)
    towers = [rf"\boxed{{{b}^{{{b}^{{{b}^{{{b}}}}}}}}}" for b in (3, 4, 5, 6)]
    easy = [r"\boxed{\sqrt{4}}", r"\boxed{\sqrt{9}}", r"\boxed{\frac{6}{3}}"]
    got = Accuracy()(completions=towers + easy, answer=["42"] * 4 + ["2", "2", "2"])
    assert got == [0.0] * 4 + [1.0, 0.0, 1.0]
    assert len(pool._workers) == pool.size == 2
