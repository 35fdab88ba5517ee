"""A small pool of worker processes that run math-verify with a hard per-verification time limit.

Why processes: math-verify's own timeout uses `signal.alarm`, which only works on the main thread,
and some inputs (`9^{9^{9^{9}}}`) make sympy compute a bignum power that holds the GIL, so neither a
signal nor a timer thread gets to run until it is done, minutes later. A child process can simply be
killed. The workers are started once and kept, so a verification costs a pipe round trip (~0.1 ms),
not a process start (~1 s).

Workers are plain `python -c` subprocesses, not `multiprocessing` children: nothing is forked from a
parent that may hold torch's threads, and the parent's `__main__` is never re-imported.

Protocol, over two pipes carrying pickled tuples:
    parent -> worker   (gold, pred | None, cpu_limit_s); gold and pred are tuples of strings to try
                       with math-verify's `parse` in order, the first non-empty parse counting
    worker -> parent   ("ready", pid) once at start; per job ("gold", ok) then, if ok, ("verdict", ok)
Seeing ("gold", True) before a job times out tells the parent the gold parsed, so a job that runs out
of time scores 0.0 rather than None ("the gold cannot be parsed").
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core box takes seconds, not minutes
_ROOT = str(Path(__file__).resolve().parent.parent)  # so the worker imports this very `rewards`

_WORKER_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from rewards._mathpool import serve; serve(int(sys.argv[2]), int(sys.argv[3]))"
)


class WorkerStartError(RuntimeError):
    """A math-verify worker process could not start (the reason is printed on stderr above)."""


# ----------------------------------------------------------------------------------------------------
# Worker side


def serve(read_fd: int, write_fd: int) -> None:
    """The worker's main loop: parse gold and prediction, verify gold first, answer; exit on EOF."""
    import logging
    import warnings
    from functools import lru_cache

    warnings.simplefilter("ignore")
    # math-verify warns that its own timeout is off: the parent enforces the limit by killing us.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import parse, verify

    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)

    def parse_first(candidates: tuple) -> list:
        for candidate in candidates:
            parsed = parse(candidate, parsing_timeout=None)
            if parsed:
                return parsed
        return []

    parse_gold = lru_cache(maxsize=4096)(parse_first)  # a gold is checked against each completion of its group

    # Warm up before saying ready: the first parse builds the LaTeX parser (~0.1 s), which must not eat
    # into the first job's time limit.
    verify(parse_first(("$\\frac{1}{2}$",)), parse_first(("\\boxed{\\sqrt{x}+0.5}",)), timeout_seconds=None)
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            gold, pred, cpu_limit_s = inbox.recv()
        except (EOFError, OSError):  # the parent closed the pipe or died: nothing left to do
            return
        _limit_cpu(cpu_limit_s)
        try:
            parsed_gold = parse_gold(gold)
        except Exception:  # noqa: BLE001 - any failure means "cannot be parsed"
            parsed_gold = []
        # Only a number, an expression or a set counts: a parse that is nothing but the input string
        # would be compared as text, and the answer scored against prose nobody can check.
        if not any(not isinstance(p, str) for p in parsed_gold):
            parsed_gold = []
        outbox.send(("gold", bool(parsed_gold)))
        if not parsed_gold:
            continue
        try:
            ok = pred is not None and bool(verify(parsed_gold, parse_first(pred), timeout_seconds=None))
        except Exception:  # noqa: BLE001 - a prediction that breaks sympy is a wrong answer
            ok = False
        outbox.send(("verdict", ok))


def _limit_cpu(seconds: int) -> None:
    """Make the kernel kill this worker if one job burns `seconds` more CPU: a guard for when the parent
    died mid-job and cannot kill it (a bignum power would otherwise spin on, orphaned)."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + seconds
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ImportError, ValueError, OSError):  # not on this platform: the parent's kill still holds
        pass


# ----------------------------------------------------------------------------------------------------
# Parent side


class _Worker:
    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, _ROOT, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.ready = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.job: int | None = None
        self.gold_ok = False

    @property
    def waiting(self) -> bool:
        return not self.ready or self.job is not None

    def send(self, index: int, gold: str, pred: str | None, timeout: float) -> None:
        self.outbox.send((gold, pred, max(2, int(3 * timeout) + 1)))
        self.job, self.gold_ok = index, False
        self.deadline = time.monotonic() + timeout

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not take this long
                pass
        self.forget()

    def forget(self) -> None:
        """Close our pipe ends without touching the process (used in a forked child)."""
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass


def _stop_all(workers: list) -> None:
    while workers:
        workers.pop().stop()


class VerifierPool:
    """`size` math-verify workers; `run(jobs, timeout)` verifies (gold, pred) pairs in parallel.

    Each job gets `timeout` seconds of wall time from the moment a worker takes it; a worker that runs
    over is killed and replaced, and its job scores 0.0 (None if the gold had not parsed yet). A worker
    that crashes (sympy recursion, a segfault) is treated the same way. Workers start on first use and
    stop when the pool is collected or the interpreter exits.
    """

    def __init__(self, size: int = 2):
        self.size = size
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._failed_starts = 0
        self._finalizer = weakref.finalize(self, _stop_all, self._workers)  # also runs at exit
        _POOLS.add(self)

    def start(self) -> None:
        """Start the missing workers without waiting for them (they take a second or two to import sympy)."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if os.getpid() != self._pid:  # forked: the workers belong to the parent
            self._forget()
        while len(self._workers) < self.size:
            self._workers.append(_Worker())

    def run(self, jobs: list[tuple[tuple, tuple | None]], timeout: float) -> list[float | None]:
        results: list[float | None] = [0.0] * len(jobs)
        if not jobs:
            return results
        with self._lock:
            self._fill()
            try:
                self._run(jobs, timeout, results)
            except BaseException:  # don't leave a job running whose late answer the next call would misread
                _stop_all(self._workers)
                raise
        return results

    def _run(self, jobs, timeout: float, results: list) -> None:
        todo, retried = deque(range(len(jobs))), set()  # jobs not yet sent; jobs already given a second try
        while todo or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and todo:
                    i = todo.popleft()
                    try:
                        w.send(i, *jobs[i], timeout)
                    except OSError:  # it died while idle: replace it and retry the job elsewhere
                        todo.appendleft(i)
                        w.job = None
                        self._replace(w)
            waiting = [w for w in self._workers if w.waiting]
            soonest = min(w.deadline for w in waiting)
            ready = wait([w.inbox for w in waiting], timeout=max(0.0, soonest - time.monotonic()))
            for w in waiting:
                if w.inbox in ready:
                    self._receive(w, results, todo, retried)
            now = time.monotonic()
            for w in waiting:
                if w in self._workers and w.waiting and w.deadline <= now:
                    if not w.ready:
                        self._replace(w)
                        raise WorkerStartError(
                            f"a math-verify worker did not start within {STARTUP_TIMEOUT_S:.0f} s; "
                            "check that `python -c 'import math_verify'` works in this environment"
                        )
                    results[w.job] = 0.0 if w.gold_ok else None
                    self._replace(w)

    def _receive(self, w: _Worker, results: list, todo: deque, retried: set) -> None:
        try:
            msg = w.inbox.recv()
        except (EOFError, OSError):
            if not w.ready:
                # One start can die for outside reasons (killed, OOM); a broken environment kills them all.
                self._failed_starts += 1
                code = w.proc.wait()
                self._replace(w)
                if self._failed_starts > 2 * self.size:
                    raise WorkerStartError(
                        f"math-verify worker processes keep exiting during startup (last exit code {code}; the error is "
                        "on stderr above); check that `python -c 'import math_verify'` works in this environment"
                    ) from None
                return
            if w.job is not None and not w.gold_ok and w.job not in retried:
                # No answer at all: it may have died before reading the job (killed from outside), so
                # the job gets one more try; a gold that crashes math-verify crashes it twice.
                retried.add(w.job)
                todo.appendleft(w.job)
            elif w.job is not None:  # it crashed on this job
                results[w.job] = 0.0 if w.gold_ok else None
            self._replace(w)
            return
        kind, value = msg
        if kind != "ready" and w.job is None:  # cannot happen with one job in flight; never misfile it
            return
        if kind == "ready":
            w.ready = True
            self._failed_starts = 0
        elif kind == "gold":
            w.gold_ok = bool(value)
            if not value:
                results[w.job] = None
                w.job = None
        else:  # "verdict"
            results[w.job] = 1.0 if value else 0.0
            w.job = None

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._workers[self._workers.index(w)] = _Worker()

    def _forget(self) -> None:
        for w in self._workers:
            w.forget()
        self._workers.clear()
        self._pid = os.getpid()

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def close(self) -> None:
        with self._lock:
            _stop_all(self._workers)


_POOLS: "weakref.WeakSet[VerifierPool]" = weakref.WeakSet()
_shared: VerifierPool | None = None
_shared_lock = threading.Lock()


def shared_pool(min_size: int) -> VerifierPool:
    """The process-wide pool, grown to at least `min_size` workers (all verifiers share it)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = VerifierPool(min_size)
        _shared.size = max(_shared.size, min_size)
        return _shared


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) must not use or kill the parent's workers.
    for pool in list(_POOLS):
        pool._lock = threading.Lock()  # another thread may have held it at the fork
        pool._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
