"""A caged worker kept for one sequence of jobs (the Python tool's rollout), beside the pool's workers that serve any
job (sandbox/pool.py: the cage, the limits and why they hold)."""

from __future__ import annotations

import itertools
import os
import time
from multiprocessing.connection import wait

from grpokit.untrusted.pool import Pool, WorkerStartError
from grpokit.untrusted.worker import STARTUP_TIMEOUT_S, Reply, _read, _Worker, encode, refusal


_SLOTS = itertools.count()  # the CPU each new session's worker takes, in turn
_SAID = ("timeout", "crash", "invalid")  # replies that themselves say their worker was ended


class Session:
    """One caged worker kept for a sequence of jobs that share its memory, as a notebook's cells share a kernel: a
    later job sees what earlier ones left in the worker (the Python tool: one session per rollout). The worker is
    forked warm from `pool`'s cage on the first job and serves nobody else; `close()` ends it.

    `run(job, timeout)` returns a `Reply` as `Pool.run` does. A job past its limit, one that kills its worker, one
    whose reply its kind does not give, or one that leaves something running after its reply ends "timeout", "crash",
    "invalid" or with `ended` set, and ends the worker with it; the next job starts a fresh one (`restarts` counts
    them). A job too big to send ends "refused" and leaves the worker as it was.
    Whatever interrupts a job from outside (a signal's exception) ends the worker before it propagates: no job is left
    running. A worker ended where no reply said so (interrupted from outside, or replaced after a reply that was
    otherwise whole) is said by the next reply's `fresh`: whatever replaced it, its caller hears of it."""

    def __init__(self, pool: Pool):
        self.pool = pool
        self._worker: _Worker | None = None
        self.jobs = self.restarts = 0
        self._unsaid = ""  # why the last worker was ended, until a reply says so

    def run(self, job, timeout: float) -> Reply:
        try:
            reply = self._run(job, timeout)
        except BaseException:
            self._end("the one before was stopped with the call before, from outside it")
            raise
        if self._worker is None and not self._unsaid and not (reply.how in _SAID or reply.ended):
            self._unsaid = "the one before was replaced after the call before"  # its job ran what taints a worker
        return reply

    def _run(self, job, timeout: float) -> Reply:
        payload = encode(job, timeout)
        refused = refusal(payload, self.pool.counts, self.pool.kind.what)
        if refused is not None:
            return refused
        fresh = ""
        if self._worker is None:
            with self.pool._lock:
                if os.getpid() != self.pool._pid:  # forked: the cage belongs to the parent
                    self.pool._forget()
                self._worker = self.pool._new_worker(next(_SLOTS))
            self.restarts += self.jobs > 0
            fresh, self._unsaid = self._unsaid, ""
        w = self._worker
        while not w.ready:
            if not wait([w.inbox], timeout=max(0.0, w.deadline - time.monotonic())):
                self.close()
                raise WorkerStartError(f"a {self.pool.kind.what} process did not start within {STARTUP_TIMEOUT_S:.0f} "
                                       f"s; check that `python -c '{self.pool.kind.check}'` works in this environment")
            key, value, message = _read(w)
            if key != "ready" or not isinstance(value, int):
                said = self.pool._said()
                self.close()
                raise WorkerStartError(f"a {self.pool.kind.what} process exited during startup; it said: {said}")
            self.pool._started(w, value, message)
        self.jobs += 1
        try:
            w.send(0, payload, timeout)
        except OSError:  # it died while idle
            self.close()
            return Reply("crash", None, False)
        while True:
            if not wait([w.inbox], timeout=max(0.0, w.deadline - time.monotonic())):
                self.pool.counts.timeouts += 1  # its keeper did not answer in time
                self.close()
                return Reply("timeout", None, w.marked)
            key, value, message = _read(w)
            if key is None:  # its keeper died: killed from outside
                self.close()
                return Reply("crash", None, w.marked)
            reply = w.take(key, value, message, self.pool.counts, self.pool.kind.what)
            if reply is not None:
                w.finish()
                if w.spent:
                    self.close()
                reply.fresh = fresh
                return reply

    def close(self) -> None:
        """End the worker (and whatever it started); the next job starts a fresh one. What a sequence of jobs does
        at its end (a rollout's end): nothing of it is said to a later job."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._unsaid = ""

    def _end(self, why: str) -> None:
        """End the worker mid-sequence: the next reply says `why` (once a worker had run a job for it)."""
        if self._worker is not None or self.jobs:
            self.close()
            self._unsaid = why

    def ident(self) -> int | None:
        """The id of the worker now kept (its keeper's pid in the cage), None before the first job or after close."""
        return self._worker.ident if self._worker is not None else None
