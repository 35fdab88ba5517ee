"""The one home for untrusted work: a pool of caged worker processes that run a job each at a time, bounded.

What runs here: everything that reads a model's output with code we did not write -- reasoning-gym's scorers (several
`eval` the answer, or hand it to sympy's `parse_expr`, which does) and math-verify. A `Kind` names the module a worker
imports (`sandbox.task_job`, `sandbox.math_job`, in `rewards._machinery`); the pool is the same for both.
(code_tests' sandbox, `sandbox.jobs`, runs a whole program per candidate instead, and shares this module's way of
starting and ending a process tree: sandbox/process.py.)

Why processes: a thread cannot be stopped mid-call (a bignum power in sympy holds the GIL for minutes); a process can
be killed. Why a zygote: a worker past its time is killed and must be replaced, and a fresh Python importing sympy
or reasoning-gym takes 1-3 s of CPU; the zygote imports and warms the kind's module once and forks each worker on
request, warm, in milliseconds. Nothing is forked from the trainer's process (which holds torch's threads).

What holds for a job (sandbox/cage.py builds it; a pool's `layers` names those that held on this machine):
    time       wall time per job from the moment the worker takes it, less what it announces as trusted work (building
               the problem: not the answer's time; bounded by BUILD_TIMEOUT_S), then killed; CPU time per job
               (3 x timeout + 1 s) as the kernel's backstop should the pool die mid-job
    memory     the worker's address space at start plus `memory_mb` (a MemoryError in the job past it)
    processes  `processes` at most (a fork bomb gets EAGAIN), each worker in a pid namespace of its own whose
               leftovers are killed after every job; nothing outlives the pool's process (parent-death signals, and
               the pid namespaces die with their pid 1)
    files      a new root: read-only binds of this python, its site-packages and the project's `rewards` and
               `grpokit`, nothing else of the host (no home, no /etc, no data); a private /tmp of `file_mb`
    network    a network namespace with a loopback that is down: no socket reaches anything
    identity   as root, the job runs as `nobody`; otherwise in a user namespace mapping the user, without capabilities;
               seccomp refuses new namespaces and memfd; the worker is undumpable
    its score  messages are length-prefixed JSON of bounded size (never pickle); a worker whose job ran code
               compiled from the answer's text is replaced after that job (cage.py's audit hook), so the code cannot
               change how a later completion is scored. Within its own job, a scorer that evaluates the answer lets the
               answer steer that one score: that is the scorer's own design (the task's partial credit, or none).
"""

from __future__ import annotations

import json
import os
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from grpokit.untrusted.process import end, sandbox_ids, start

STARTUP_TIMEOUT_S = 120.0  # importing sympy or reasoning-gym on a loaded 2-core box takes seconds, not minutes
BUILD_TIMEOUT_S = 300.0  # for the trusted part a worker announces (building a problem; bounded at --check)
STUCK_FRACTION = 0.25  # a job past this share of its limit is likely to run it out: a spare takes the queue
MAX_SPARES_PER_WORKER = 1  # each stuck job holds a CPU until its limit
MAX_REPLY_BYTES = 64 << 10  # one message from a worker at most; a longer one ends the worker
FRAME = 32  # bytes per control frame to the zygote: a stream socket may split or join sends, frames keep them apart
ROOT = str(Path(__file__).resolve().parents[2])
_BOOTSTRAP = (
    "import sys, json; sys.path.insert(0, sys.argv[1]); "
    "[sys.modules.setdefault(n, type(sys)(n)).__dict__.setdefault('__path__', [p]) for n, p in "
    "(('grpokit', sys.argv[1] + '/grpokit'), ('grpokit.untrusted', sys.argv[1] + '/grpokit/untrusted'))]; "
    "from grpokit.untrusted.cage import bootstrap; "
    "bootstrap(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))"
)


class WorkerStartError(RuntimeError):
    """A worker process could not start (the message ends with what the cage printed)."""


@dataclass(frozen=True)
class Kind:
    """What a pool's workers run: `module` (imported and warmed once in the cage, see cage.py) and its limits."""

    module: str                  # "grpokit.untrusted.task_job"
    what: str                    # how messages name the work: "task scorer"
    check: str                   # the import a user can try when workers do not start
    memory_mb: int = 1024        # address space a job may add to the warm worker's
    processes: int = 16          # RLIMIT_NPROC of a worker
    file_mb: int = 16            # largest file, and the size of the cage's /tmp
    namespaces: bool = True      # False skips them: what a machine refusing `unshare` gets (to test that case)
    scratch: bool = False        # each worker gets a /tmp of its own (kept workers: one rollout's files stay its own)


@dataclass
class Reply:
    """How one job ended: `how` is "result" (`value` is the kind's result), "error" (the job raised: `value` says
    what), "fail" (the kind refused the job's trusted part, e.g. a problem it cannot build: `value` says why),
    "timeout" or "crash"; `marked` tells whether the worker had marked the job before it ended."""

    how: str
    value: object = None
    marked: bool = False


def _visible() -> list[str]:
    """The host folders a worker sees, read-only, besides this python and the system's libraries: the venv (its
    site-packages) and the project's `rewards` and `grpokit` -- not the project's other files, nor the folder of
    the script that started the trainer."""
    shown = {os.path.realpath(p) for p in (sys.prefix, *site.getsitepackages()) if os.path.isdir(p)}
    shown.add(os.path.join(ROOT, "grpokit"))
    return sorted(p for p in shown if not any(p.startswith(q + "/") for q in shown))


class _Cage:
    """The pool's end of the cage's bootstrap process and its zygote (cage.py)."""

    def __init__(self, kind: Kind):
        mine, theirs = socket.socketpair()
        uid, gid = sandbox_ids() if os.geteuid() == 0 else (os.geteuid(), os.getegid())
        limits = {"parent": os.getpid(), "namespaces": kind.namespaces, "uid": uid, "gid": gid,
                  "memory_mb": kind.memory_mb, "processes": kind.processes, "file_mb": kind.file_mb,
                  "scratch": kind.scratch,
                  "visible": _visible()}
        # What the cage prints (a library's import noise; why it failed to start) goes to a file of its own, shown
        # when the workers do not start; what a job prints goes nowhere (cage.py).
        self.log = tempfile.TemporaryFile()
        try:
            self.proc = start([sys.executable, "-I", "-c", _BOOTSTRAP, ROOT, kind.module, str(theirs.fileno()),
                               json.dumps(limits)], pass_fds=(theirs.fileno(),), stdout=subprocess.DEVNULL,
                              stderr=self.log)
        finally:
            theirs.close()
        self.control = mine

    def said(self) -> str:
        """The end of what the cage printed."""
        try:
            self.log.seek(0, os.SEEK_END)
            self.log.seek(max(0, self.log.tell() - 1500))
            return self.log.read().decode(errors="replace").strip()
        except (OSError, ValueError):
            return ""

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, fds: list[int]) -> None:
        """Ask for a worker on these two pipe ends; raises OSError when the cage is gone."""
        frame = b"spawn".ljust(FRAME)
        sent = socket.send_fds(self.control, [frame], fds)
        if sent < FRAME:
            self.control.sendall(frame[sent:])

    def kill(self, ident: int) -> None:
        try:
            self.control.sendall(f"kill {ident}".encode().ljust(FRAME))
        except OSError:  # the cage is gone, and its workers with it
            pass

    def stop(self) -> None:
        self.forget()  # end of file: the zygote exits, and its pid namespace with it
        end(self.proc, stop=False, timeout=2)
        self.log.close()

    def forget(self) -> None:
        """Close our end without touching the process (also used in a forked child)."""
        try:
            self.control.close()
        except OSError:
            pass


class _Worker:
    def __init__(self, cage: _Cage):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            cage.spawn([to_child_r, from_child_w])
        except OSError:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.cage = cage
        self.ident: int | None = None  # known once the worker says it is ready
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self.ready = False
        self.deadline = time.monotonic() + STARTUP_TIMEOUT_S
        self.job: int | None = None
        self.marked = self.tainted = self.building = False
        self.clock = 0.0

    @property
    def waiting(self) -> bool:
        return not self.ready or self.job is not None

    def send(self, index: int, job, timeout: float) -> None:
        self.outbox.send_bytes(json.dumps({"job": job, "cpu_s": max(2, int(3 * timeout) + 1)}).encode())
        self.job, self.marked, self.building = index, False, False
        self.clock = time.monotonic()
        self.deadline = self.clock + timeout

    def stop(self) -> None:
        # Closing our pipe ends first means no late answer can be read; a worker not yet forked finds them closed
        # when it says "ready", and exits.
        self.forget()
        if self.ident is not None:
            self.cage.kill(self.ident)

    def forget(self) -> None:
        """Close our pipe ends without touching the process (used in a forked child)."""
        for conn in (self.outbox, self.inbox):
            try:
                conn.close()
            except OSError:
                pass


def _stop_all(workers: list, cages: list) -> None:
    while workers:
        workers.pop().stop()
    while cages:
        cages.pop().stop()


@dataclass
class Counts:
    """What the pool did since it started, for reports: jobs past their limit, jobs whose worker was replaced
    because the job ran code compiled from its text."""

    timeouts: int = 0
    replaced_after_code: int = 0
    last_code: str = ""  # what the last such job ran, as the worker's audit hook saw it


class Pool:
    """`size` caged workers of one `Kind`; `run(jobs, timeout)` runs the jobs in parallel, a `Reply` each.

    A worker past a job's limit is killed and replaced by a warm fork; its job ends "timeout". While every worker is
    busy and one has used a quarter of its time, a spare (up to `size` of them) takes the queue; spares stop when
    the call returns. A worker that dies on a job ends it "crash" (a job it died on before marking gets one more
    try: it may have died from outside). Workers start on first use and stop when the pool is collected or the
    interpreter exits.
    """

    def __init__(self, kind: Kind, size: int = 2):
        self.kind, self.size = kind, size
        self._workers: list[_Worker] = []
        self._cages: list[_Cage] = []  # the current one; a list so the finalizer sees a replacement
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._failed_starts = 0
        self.layers: frozenset = frozenset()  # what held for the last worker that started
        self.counts = Counts()
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._cages)  # also runs at exit
        _POOLS.add(self)

    def start(self) -> None:
        """Start the missing workers without waiting for them."""
        with self._lock:
            self._fill()

    def _fill(self) -> None:
        if os.getpid() != self._pid:  # forked: the workers belong to the parent
            self._forget()
        while len(self._workers) < self.size:
            self._workers.append(self._new_worker())

    def _new_worker(self) -> _Worker:
        for _ in range(2):  # a cage that died since it was last used is replaced once
            if not self._cages or not self._cages[0].alive():
                _stop_all([], self._cages)
                self._cages.append(_Cage(self.kind))
            try:
                return _Worker(self._cages[0])
            except OSError:  # its socket is broken: the cage is dead or dying; the next pass starts another
                _stop_all([], self._cages)
        raise WorkerStartError(f"cannot start the {self.kind.what} processes: {self._said()}")

    def run(self, jobs: list, timeout: float) -> list[Reply]:
        replies: list = [None] * len(jobs)
        if not jobs:
            return replies
        with self._lock:
            self._fill()
            try:
                self._run(jobs, timeout, replies)
            except BaseException:  # don't leave a job running whose late answer the next call would misread
                _stop_all(self._workers, [])
                raise
            while len(self._workers) > self.size:  # spares go when the call is done (a fork brings one back)
                self._workers.pop().stop()
        return replies

    def _run(self, jobs: list, timeout: float, replies: list) -> None:
        todo, retried = deque(range(len(jobs))), set()  # jobs not yet sent; jobs already given a second try
        stuck_after = STUCK_FRACTION * timeout
        while todo or any(w.job is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.job is None and todo:
                    i = todo.popleft()
                    try:
                        w.send(i, jobs[i], timeout)
                    except OSError:  # it died while idle: replace it and give the job to another
                        todo.appendleft(i)
                        w.job = None
                        self._replace(w)
            now = time.monotonic()
            timed = [w for w in self._workers if w.job is not None and not w.building]
            stuck = [w for w in timed if now - w.clock >= stuck_after]
            if todo and stuck and len(self._workers) < (1 + MAX_SPARES_PER_WORKER) * self.size and all(
                    w.ready and w.job is not None for w in self._workers):
                # Every worker is busy and one is likely running out its time limit: a spare takes the queue
                # meanwhile, so distinct hard jobs time out side by side, not one after another.
                self._workers.append(self._new_worker())
            waiting = [w for w in self._workers if w.waiting]
            wake = [w.deadline for w in waiting]
            if todo:  # also wake when a running job turns "stuck", to start a spare then
                wake += [w.clock + stuck_after for w in timed if w.clock + stuck_after > now]
            ready = wait([w.inbox for w in waiting], timeout=max(0.0, min(wake) - time.monotonic()))
            for w in waiting:
                if w.inbox in ready and w in self._workers:  # not one replaced meanwhile (its whole cage died)
                    self._receive(w, replies, todo, retried, timeout)
            now = time.monotonic()
            for w in waiting:
                if w in self._workers and w.waiting and w.deadline <= now:
                    if not w.ready:
                        self._replace(w)
                        raise WorkerStartError(
                            f"a {self.kind.what} process did not start within {STARTUP_TIMEOUT_S:.0f} s; check that "
                            f"`python -c '{self.kind.check}'` works in this environment; it said: {self._said()}")
                    replies[w.job] = Reply("timeout", None, w.marked)
                    self.counts.timeouts += 1
                    self._replace(w)

    def _receive(self, w: _Worker, replies: list, todo: deque, retried: set, timeout: float) -> None:
        key, value, message = _read(w)
        if key is None:
            self._died(w, replies, todo, retried)
            return
        if key == "ready" and not w.ready and isinstance(value, int):
            self._started(w, value, message)
            return
        if w.job is None or not w.ready:  # cannot happen with one job in flight; never misfile it
            self._replace(w)
            return
        if key == "taint":
            if not w.tainted:  # the first thing it ran says most
                self.counts.last_code = str(value)[:200]
            w.tainted = True
        elif key == "build":  # trusted work (its problem) before the job's own: not charged to its limit
            w.building, w.deadline = True, time.monotonic() + BUILD_TIMEOUT_S
        elif key == "mark":
            w.marked = True
            if w.building:  # the job's own time starts now
                w.building, w.clock = False, time.monotonic()
                w.deadline = w.clock + timeout
        elif key in ("result", "error", "fail"):
            replies[w.job] = Reply(key, value, w.marked)
            w.job = None
            if w.tainted:  # the job ran code from its text: no later job is scored by this worker
                self.counts.replaced_after_code += 1
                self._replace(w)
        else:  # not a message a worker sends: whatever sent it cannot be trusted to score
            self._died(w, replies, todo, retried)

    def _died(self, w: _Worker, replies: list, todo: deque, retried: set) -> None:
        if not w.ready:
            # One start can die for outside reasons (killed, OOM); a broken environment kills them all.
            self._failed_starts += 1
            code, said = (self._cages[0].proc.poll(), self._said()) if self._cages else (None, "")
            self._replace(w)
            if self._failed_starts > 2 * self.size:
                raise WorkerStartError(
                    f"{self.kind.what} processes keep exiting during startup (cage exit code {code}); check that "
                    f"`python -c '{self.kind.check}'` works in this environment; it said: {said}") from None
            return
        if not w.cage.alive():  # the whole cage died (killed from outside): every job in it starts again elsewhere
            for v in [v for v in self._workers if v.cage is w.cage]:
                if v.job is not None:
                    todo.appendleft(v.job)
                    v.job = None
                self._replace(v)
            return
        if w.job is not None and not w.marked and not w.tainted and w.job not in retried:
            # No word at all: it may have died before reading the job (killed from outside), so the job gets
            # one more try; a job that crashes its worker crashes it twice.
            retried.add(w.job)
            todo.appendleft(w.job)
        elif w.job is not None:
            replies[w.job] = Reply("crash", None, w.marked)
        self._replace(w)

    def _started(self, w: _Worker, ident: int, message: dict) -> None:
        """A worker said it is ready: its id, and the layers that held for it."""
        w.ready, w.ident = True, ident
        self.layers = frozenset(l for l in message.get("layers", []) if isinstance(l, str))
        self._failed_starts = 0

    def _said(self) -> str:
        return (self._cages[0].said() if self._cages else "") or "nothing"

    def _replace(self, w: _Worker) -> None:
        w.stop()
        self._workers[self._workers.index(w)] = self._new_worker()

    def _forget(self) -> None:
        for w in self._workers:
            w.forget()
        for c in self._cages:
            c.forget()
        self._workers.clear()
        self._cages.clear()
        self._pid = os.getpid()

    def idents(self) -> list[int]:
        """The ids of the workers that have started (their keepers' pids in the cage)."""
        return [w.ident for w in self._workers if w.ident is not None]

    def close(self) -> None:
        with self._lock:
            _stop_all(self._workers, self._cages)


def _read(w: _Worker) -> tuple:
    """One message from a worker: (key, value, message), or (None, None, None) when it died or sent what no worker
    sends (not JSON, not a one-key object, too long)."""
    try:
        message = json.loads(w.inbox.recv_bytes(MAX_REPLY_BYTES))
    except (EOFError, OSError, ValueError, TypeError):
        return None, None, None
    if not isinstance(message, dict) or not message:
        return None, None, None
    key = next(iter(message))
    return key, message[key], message


_POOLS: "weakref.WeakSet[Pool]" = weakref.WeakSet()
_shared: dict = {}
_shared_lock = threading.Lock()


def shared(kind: Kind, min_size: int) -> Pool:
    """The process-wide pool of `kind`, grown to at least `min_size` workers (every reward of that kind shares it)."""
    with _shared_lock:
        if kind not in _shared:
            _shared[kind] = Pool(kind, min_size)
        pool = _shared[kind]
        pool.size = max(pool.size, min_size)
        return pool


def _after_fork_in_child() -> None:
    # A forked child (e.g. a DataLoader worker) must not use or kill the parent's workers.
    for pool in list(_POOLS):
        pool._lock = threading.Lock()  # another thread may have held it at the fork
        pool._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
