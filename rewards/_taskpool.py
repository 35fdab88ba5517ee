"""Worker processes that run reasoning-gym scorers with a hard time limit per completion.

Why processes: a scorer is the task's own Python (some parse and evaluate expressions, some solve puzzles), and a
thread cannot be stopped mid-call; a process can be killed. Each worker is a fresh `python -c` (nothing is forked
from the trainer's process, which holds torch's threads) that imports reasoning-gym once (~2 s) and then scores
jobs over a pipe (`rewards._taskworker`). A job past its time limit is killed with its worker and scores 0.0; the
replacement starts in the background. A worker that dies on a job (a crash) scores it 0.0 the same way.
Workers stop when the pool is collected or the interpreter exits; each also ends when the pool closes its pipe,
and a per-job CPU limit (3 x timeout + 1 s) is the kernel's backstop should the pool die mid-job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing.connection import Connection, wait
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0  # importing reasoning-gym on a loaded 2-core box takes seconds, not minutes
_ROOT = str(Path(__file__).resolve().parent.parent)  # so the worker imports this very `rewards` and `grpokit`
_CODE = ("import sys, warnings; sys.path.insert(0, sys.argv[1]); warnings.simplefilter('ignore'); "
         "from rewards._taskworker import serve; serve(int(sys.argv[2]), int(sys.argv[3]))")


class ScorerStartError(RuntimeError):
    """A scorer process could not start (the reason is printed on stderr above)."""


class ScorerFailure(Exception):
    """The task's scorer raised on a job: its message."""


class _Worker:
    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _CODE, _ROOT, str(to_child_r), str(from_child_w)],
                                         pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.ready = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.job: int | None = None

    def send(self, index: int, task_item: str, answer: str | None, timeout: float) -> None:
        self.outbox.send((task_item, answer, max(2, int(3 * timeout) + 1)))
        self.job = index
        self.deadline = time.monotonic() + timeout

    def stop(self) -> None:
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def _stop_all(workers: list) -> None:
    while workers:
        workers.pop().stop()


class ScorerPool:
    """`size` scorer processes; `run(jobs, timeout)` scores (task_item, answer) pairs in parallel, each within
    `timeout` seconds of wall time from when a worker takes it (0.0 past it); a scorer's exception comes back as a
    `ScorerFailure` in its job's place."""

    def __init__(self, size: int = 2):
        self.size = size
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._failed_starts = 0
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)  # also runs at exit
        _POOLS.add(self)

    def start(self) -> None:
        """Start the missing workers without waiting for them."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if os.getpid() != self._pid:  # forked (a DataLoader worker): the workers are the parent's
            self._workers.clear()
            self._pid = os.getpid()
        while len(self._workers) < self.size:
            self._workers.append(_Worker())

    def run(self, jobs: list[tuple[str, str | None]], timeout: float) -> list:
        results: list = [0.0] * len(jobs)
        if not jobs:
            return results
        with self._lock:
            self._fill()
            try:
                self._run(jobs, timeout, results)
            except BaseException:  # no job left running whose late answer the next call would misread
                _stop_all(self._workers)
                raise
        return results

    def _run(self, jobs, timeout: float, results: list) -> None:
        todo = list(range(len(jobs)))[::-1]
        while todo or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and todo:
                    i = todo.pop()
                    try:
                        w.send(i, *jobs[i], timeout)
                    except OSError:  # it died while idle: the job goes to another
                        todo.append(i)
                        w.job = None
                        self._replace(w)
            waiting = [w for w in self._workers if not w.ready or w.job is not None]
            ready = wait([w.inbox for w in waiting], timeout=max(0.0, min(w.deadline for w in waiting) - time.monotonic()))
            for w in waiting:
                if w.inbox in ready:
                    self._receive(w, results)
            now = time.monotonic()
            for w in list(self._workers):
                if (not w.ready or w.job is not None) and w.deadline <= now:
                    if not w.ready:
                        self._replace(w)
                        raise ScorerStartError(f"a task scorer process did not start within {STARTUP_TIMEOUT_S:.0f} s; "
                                               "check that `python -c 'import reasoning_gym'` works in this environment")
                    results[w.job] = 0.0  # past its time: killed, scored as no answer
                    self._replace(w)

    def _receive(self, w: _Worker, results: list) -> None:
        try:
            kind, value = w.inbox.recv()
        except (EOFError, OSError):
            if not w.ready:
                self._failed_starts += 1
                code = w.proc.poll()
                self._replace(w)
                if self._failed_starts > 2 * self.size:
                    raise ScorerStartError(f"task scorer processes keep exiting at start (exit code {code}; the error is on "
                                           "stderr above); check that `python -c 'import reasoning_gym'` works") from None
                return
            if w.job is not None:  # it died on this job (a crash, or the kernel's CPU limit): no answer
                results[w.job] = 0.0
            self._replace(w)
            return
        if kind == "ready":
            w.ready, w.deadline = True, float("inf")
            self._failed_starts = 0
        elif w.job is not None:
            results[w.job] = value if kind == "score" else ScorerFailure(value)
            w.job = None

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._workers[self._workers.index(w)] = _Worker()

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.ready]

    def close(self) -> None:
        with self._lock:
            _stop_all(self._workers)


_POOLS: "weakref.WeakSet[ScorerPool]" = weakref.WeakSet()
_shared: ScorerPool | None = None
_shared_lock = threading.Lock()


def shared_pool(min_size: int) -> ScorerPool:
    """The process-wide pool, grown to at least `min_size` workers (every `task_score` shares it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ScorerPool(min_size)
        _shared.size = max(_shared.size, min_size)
        return _shared


def _after_fork_in_child() -> None:
    # A forked child (a DataLoader worker) must neither use nor, at its exit, kill the parent's workers.
    for pool in list(_POOLS):
        pool._lock = threading.Lock()  # another thread may have held it at the fork
        pool._workers.clear()
        pool._pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
