"""A small pool of worker processes that run math-verify with a hard per-verification time limit.

Why processes: math-verify's own timeout uses `signal.alarm`, which only works on the main thread,
and some inputs (`9^{9^{9^{9}}}`) make sympy compute a bignum power that holds the GIL, so neither a
signal nor a timer thread gets to run until it is done, minutes later. A child process can simply be
killed. The workers are kept between calls, so a verification costs a pipe round trip (~0.1 ms).

Why a zygote: a killed worker must be replaced, and a fresh Python importing sympy takes 1-2 s of CPU,
so a batch of hard answers would cost a re-import per timeout, one after another (64 power towers:
~50 s). One `python -c` process (the zygote) imports and warms math-verify once, then forks each worker
on request: a replacement is ready in milliseconds, already warm. Nothing is forked from the trainer's
process (which may hold torch's threads), and its `__main__` is never re-imported.

When the pool's process dies, nothing is left running: the zygote reads end-of-file on its control
socket and kills its workers, and each worker has asked the kernel (Linux `PR_SET_PDEATHSIG`) to be
killed when the zygote goes, even in the middle of a bignum power. Elsewhere a CPU-time limit per job
(3 x timeout + 1 s) is the backstop.

Protocol. Pool -> zygote, fixed-size frames on a Unix socket: `spawn` carrying the worker's two pipe
ends (SCM_RIGHTS), `kill <pid>`. Pool <-> worker, over those pipes, pickled tuples:
    pool -> worker     (gold, pred | None, cpu_limit_s); gold and pred are tuples of strings to try
                       with math-verify's `parse` in order, the first non-empty parse counting
    worker -> pool     ("ready", pid) once at start; per job ("gold", ok) then, if ok, ("verdict", ok)
Seeing ("gold", True) before a job times out tells the pool the gold parsed, so a job that runs out
of time scores 0.0 rather than None ("the gold cannot be parsed").
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from multiprocessing.connection import Connection, wait
from pathlib import Path

from rewards._mathworker import FRAME as _FRAME

STARTUP_TIMEOUT_S = 120.0  # importing sympy on a loaded 2-core box takes seconds, not minutes
# A job still running after this share of its time limit is likely to run it out (a check takes
# milliseconds; a bignum power, forever); with every worker busy, a spare is forked for the queue.
STUCK_FRACTION = 0.25
MAX_SPARES_PER_WORKER = 1  # at most `size` spares: each stuck job holds a CPU until its limit
_ROOT = str(Path(__file__).resolve().parent.parent)  # so the zygote imports this very `rewards`

_ZYGOTE_CODE = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from rewards._mathworker import zygote; zygote(int(sys.argv[2]))"
)


class WorkerStartError(RuntimeError):
    """A math-verify worker process could not start (the reason is printed on stderr above)."""


# ----------------------------------------------------------------------------------------------------
# Parent side


class _Zygote:
    """The pool's end of the zygote process (see the module docstring)."""

    def __init__(self):
        mine, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _ZYGOTE_CODE, _ROOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        finally:
            theirs.close()
        self.control = mine

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, fds: list[int]) -> None:
        """Ask for a worker on these two pipe ends; raises OSError when the zygote is gone."""
        frame = b"spawn".ljust(_FRAME)
        sent = socket.send_fds(self.control, [frame], fds)
        if sent < _FRAME:
            self.control.sendall(frame[sent:])

    def kill(self, pid: int) -> None:
        try:
            self.control.sendall(f"kill {pid}".encode().ljust(_FRAME))
        except OSError:  # the zygote is gone, and its workers with it (parent-death signal)
            pass

    def stop(self) -> None:
        self.forget()  # end of file: the zygote kills its workers and exits
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:  # still importing sympy, say: it has no workers yet
            self.proc.kill()
            self.proc.wait()

    def forget(self) -> None:
        """Close our end without touching the process (also used in a forked child)."""
        try:
            self.control.close()
        except OSError:
            pass


class _Worker:
    def __init__(self, zygote: _Zygote):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            zygote.spawn([to_child_r, from_child_w])
        except OSError:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.zygote = zygote
        self.pid: int | None = None  # known once the worker says it is ready
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
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + timeout

    def stop(self) -> None:
        # Closing our pipe ends first means no late answer can be read; a worker not yet forked finds
        # them closed when it says "ready", and exits.
        self.forget()
        if self.pid is not None:
            self.zygote.kill(self.pid)

    def forget(self) -> None:
        """Close our pipe ends without touching the process (used in a forked child)."""
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass


def _stop_workers(workers: list) -> None:
    while workers:
        workers.pop().stop()


def _stop_all(workers: list, zygotes: list) -> None:
    _stop_workers(workers)
    while zygotes:
        zygotes.pop().stop()


class VerifierPool:
    """`size` math-verify workers; `run(jobs, timeout)` verifies (gold, pred) pairs in parallel.

    Each job gets `timeout` seconds of wall time from the moment a worker takes it; a worker that runs
    over is killed and replaced by a warm fork of the zygote, and its job scores 0.0 (None if the gold
    had not parsed yet). While every worker is busy and one has used a quarter of its time, a spare
    (up to `size` of them) takes the queue; spares stop when the call returns. A worker that crashes (sympy recursion, a segfault) is treated the same way.
    Workers start on first use and stop when the pool is collected or the interpreter exits.
    """

    def __init__(self, size: int = 2):
        self.size = size
        self._workers: list[_Worker] = []
        self._zygotes: list[_Zygote] = []  # the current one; a list so the finalizer sees a replacement
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._failed_starts = 0
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._zygotes)  # also runs at exit
        _POOLS.add(self)

    def start(self) -> None:
        """Start the missing workers without waiting for them (they take a second or two to import sympy)."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if os.getpid() != self._pid:  # forked: the workers belong to the parent
            self._forget()
        while len(self._workers) < self.size:
            self._workers.append(self._new_worker())

    def _new_worker(self) -> _Worker:
        for _ in range(2):  # a zygote that died since it was last used is replaced once
            if not self._zygotes or not self._zygotes[0].alive():
                _stop_all([], self._zygotes)
                self._zygotes.append(_Zygote())
            try:
                return _Worker(self._zygotes[0])
            except OSError:  # its socket is broken: the zygote is dead or dying; the next pass starts another
                _stop_all([], self._zygotes)
        raise WorkerStartError("cannot start the math-verify zygote process; the error is on stderr above")

    def run(self, jobs: list[tuple[tuple, tuple | None]], timeout: float) -> list[float | None]:
        results: list[float | None] = [0.0] * len(jobs)
        if not jobs:
            return results
        with self._lock:
            self._fill()
            try:
                self._run(jobs, timeout, results)
            except BaseException:  # don't leave a job running whose late answer the next call would misread
                _stop_workers(self._workers)
                raise
            while len(self._workers) > self.size:  # spares go when the call is done (a fork brings one back)
                self._workers.pop().stop()
        return results

    def _run(self, jobs, timeout: float, results: list) -> None:
        todo, retried = deque(range(len(jobs))), set()  # jobs not yet sent; jobs already given a second try
        stuck_after = STUCK_FRACTION * timeout
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
            now = time.monotonic()
            stuck = [w for w in self._workers if w.job is not None and now - w.sent_at >= stuck_after]
            if todo and stuck and len(self._workers) < (1 + MAX_SPARES_PER_WORKER) * self.size and all(
                    w.ready and w.job is not None for w in self._workers):
                # Every worker is busy and one is likely running out its time limit: a spare takes the
                # queue meanwhile, so distinct hard answers time out side by side, not one after another.
                self._workers.append(self._new_worker())
            waiting = [w for w in self._workers if w.waiting]
            wake = [w.deadline for w in waiting]
            if todo:  # also wake when a running job turns "stuck", to start a spare then
                wake += [w.sent_at + stuck_after for w in waiting if w.job is not None and w.sent_at + stuck_after > now]
            ready = wait([w.inbox for w in waiting], timeout=max(0.0, min(wake) - time.monotonic()))
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
                code = self._zygotes[0].proc.poll() if self._zygotes else None
                self._replace(w)
                if self._failed_starts > 2 * self.size:
                    raise WorkerStartError(
                        f"math-verify worker processes keep exiting during startup (zygote exit code {code}; the error is "
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
            w.ready, w.pid = True, value
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
        self._workers[self._workers.index(w)] = self._new_worker()

    def _forget(self) -> None:
        for w in self._workers:
            w.forget()
        for z in self._zygotes:
            z.forget()
        self._workers.clear()
        self._zygotes.clear()
        self._pid = os.getpid()

    def pids(self) -> list[int]:
        """The pids of the workers that have started."""
        return [w.pid for w in self._workers if w.pid is not None]

    def close(self) -> None:
        with self._lock:
            _stop_all(self._workers, self._zygotes)


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
