"""The one home for untrusted work: a pool of caged workers that run a job each at a time, bounded.

What runs here: everything that reads a model's output with code we did not write -- reasoning-gym's scorers (several
`eval` the answer, or hand it to sympy's `parse_expr`, which does), math-verify, and the Python tool's cells. A `Kind`
names the module a worker imports (`grpokit.untrusted.task_job`, `math_job`, `python_job`); the pool is the same for
all. (code_tests' sandbox, `jobs`, runs a whole program per candidate instead, and shares this module's way of
starting and ending a process tree: process.py.)

Why processes: a thread cannot be stopped mid-call (a bignum power in sympy holds the GIL for minutes); a process can
be killed. Why a zygote: a worker past its time is killed and must be replaced, and a fresh Python importing sympy
or reasoning-gym takes 1-3 s of CPU; the zygote imports and warms the kind's module once and forks each worker on
request, warm, in milliseconds. Nothing is forked from the trainer's process (which holds torch's threads).

A worker is two processes (cage.py): its keeper (keeper.py), which holds the worker's pipes to this pool, its
deadline and its reply format and never runs a job, and its runner (runner.py), which runs the job's model text or
code and holds nothing but its pipes to the keeper. What holds for a job (a pool's `layers` names those that held on
this machine):
    time       the keeper's deadline: a job's trusted part (building its problem, parsing its gold) within the kind's
               PREPARE_S, then the job's own part within `timeout`, each timed by the keeper, never by the job; then
               killed. This pool kills a worker whose keeper has not answered GRACE_S past it; CPU time per job
               (3 x timeout + 1 s) is the kernel's backstop should both be gone
    replies    one per job, naming the job by the number its keeper gave it (random, new per job), of the kind's
               type and range (a score a finite number in [0, 1], a verdict, a cell's text), within the size bound,
               text made valid; anything else (a reply for another job included) ends the job "invalid", counted
               and logged. A
               job over the size bound (runner.MAX_JOB_BYTES) is refused before it is sent, counted, never resent
    quiet      a reply counts once the runner is back waiting in its read of its own job pipe (layer
               `job-pipe-checked`; the read of any pipe where the kernel does not show the call, `quiet-checked`),
               having sent nothing more, catching no signal it did not catch before its first job (it puts back the
               handlers and timers a job set): a thread or process it left running, code still running after a
               reply it sent itself, a second reply, a handler it kept, ends the worker ("ended" says why) and the
               next job gets a fresh one
    memory     the runner and every process it starts share a cgroup: the warm worker's resident size plus
               `memory_mb` + `file_mb` (layer `cgroup-memory`), `processes` + 1 tasks (`cgroup-pids`); and each
               process's address space at most the warm worker's plus `memory_mb` (a MemoryError past it). Where the
               cage cannot make cgroups (not root, no delegated v2 subtree) each process is bounded alone
    processes  each runner pid 1 of a pid namespace of its own, with a /proc of its own (`proc-own`): it sees and
               signals no other worker; what a job leaves is killed after it; nothing outlives the pool's process
               (parent-death signals, and the pid namespaces die with their pid 1)
    files      a new root: read-only binds of this python, its site-packages and the project's `grpokit`, nothing
               else of the host (no home, no /etc, no data); a private /tmp of `file_mb`
    network    a network namespace with a loopback that is down: no socket reaches anything
    identity   as root, the job runs as `nobody`; otherwise in a user namespace mapping the user, without capabilities;
               seccomp refuses new namespaces and memfd; the runner is undumpable
    its score  messages are length-prefixed JSON of bounded size (never pickle); a worker whose job ran code
               compiled from the answer's text is replaced after that job (runner.py's audit hook), so the code
               cannot change how a later completion is scored. Within its own job, a scorer that evaluates the answer
               lets the answer steer that one score: that is the scorer's own design (the task's partial credit, or
               none); it cannot stop the run, move its deadline or answer outside its kind's range.
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
from multiprocessing.connection import wait
from pathlib import Path

from grpokit.untrusted.groups import remove_cage_group
from grpokit.untrusted.process import end, sandbox_ids, start
from grpokit.untrusted.worker import STARTUP_TIMEOUT_S, Counts, Reply, _read, _Worker, encode, refusal

STUCK_FRACTION = 0.25  # a job past this share of its limit is likely to run it out: a spare takes the queue
MAX_SPARES_PER_WORKER = 1  # each stuck job holds a CPU until its limit
QUEUED = 2  # jobs handed to a worker at once: the one it runs and the next
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
                  "scratch": kind.scratch, "cgroup": f"grpokit-pool-{os.getpid()}-{os.urandom(4).hex()}",
                  "visible": _visible()}
        self.group = limits["cgroup"]  # the cage's cgroup (cage.py makes it where it may, and removes it)
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

    def spawn(self, fds: list[int], slot: int) -> None:
        """Ask for a worker on these two pipe ends, on the `slot`-th CPU this process may use (modulo their number);
        raises OSError when the cage is gone."""
        frame = f"spawn {slot}".encode().ljust(FRAME)
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
        remove_cage_group(self.group)  # gone already, unless the cage was killed before it could remove it

    def forget(self) -> None:
        """Close our end without touching the process (also used in a forked child)."""
        try:
            self.control.close()
        except OSError:
            pass


def _stop_all(workers: list, cages: list) -> None:
    while workers:
        workers.pop().stop()
    while cages:
        cages.pop().stop()


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
        if self._cages and not self._cages[0].alive():
            # Its workers are dying with it (parent-death signals): none takes another job, however briefly alive.
            _stop_all(self._workers, self._cages)
        while len(self._workers) < self.size:
            self._workers.append(self._new_worker(len(self._workers)))

    def _new_worker(self, slot: int) -> _Worker:
        """A worker forked warm from the cage, whose keeper and runner share the `slot`-th CPU (a worker's place in
        the pool: a replacement takes its place's): a job's hand-overs between them stay on one CPU, which on a
        2-core VM took a job's round trip from ~230 to ~155 us (bench/README.md, the cage's cost)."""
        for _ in range(2):  # a cage that died since it was last used is replaced once
            if not self._cages or not self._cages[0].alive():
                _stop_all([], self._cages)
                self._cages.append(_Cage(self.kind))
            try:
                return _Worker(self._cages[0], slot)
            except OSError:  # its socket is broken: the cage is dead or dying; the next pass starts another
                _stop_all([], self._cages)
        raise WorkerStartError(f"cannot start the {self.kind.what} processes: {self._said()}")

    def run(self, jobs: list, timeout: float) -> list[Reply]:
        replies: list = [None] * len(jobs)
        if not jobs:
            return replies
        payloads = [encode(job, timeout) for job in jobs]
        todo = []
        for i, payload in enumerate(payloads):
            replies[i] = refusal(payload, self.counts, self.kind.what)
            if replies[i] is None:
                todo.append(i)
        if not todo:
            return replies
        with self._lock:
            self._fill()
            try:
                self._run(payloads, todo, timeout, replies)
            except BaseException:  # don't leave a job running whose late answer the next call would misread
                _stop_all(self._workers, [])
                raise
            while len(self._workers) > self.size:  # spares go when the call is done (a fork brings one back)
                self._workers.pop().stop()
        return replies

    def _run(self, payloads: list, indices: list, timeout: float, replies: list) -> None:
        # Jobs not yet sent; jobs already given a second try; jobs handed to a second worker because the one holding
        # them was stuck on the job before (the first answer counts).
        todo, retried, copied = deque(indices), set(), set()
        stuck_after = STUCK_FRACTION * timeout
        while any(replies[i] is None for i in indices):
            self._dispatch(payloads, timeout, replies, todo, retried)
            now = time.monotonic()
            for w in self._workers:
                if len(w.queue) > 1 and now - w.clock >= stuck_after:  # a job waits behind one likely to time out
                    for j in list(w.queue)[1:]:
                        if j not in copied and replies[j] is None:
                            copied.add(j)
                            todo.appendleft(j)
            timed = [w for w in self._workers if w.job is not None and not w.building]
            stuck = [w for w in timed if now - w.clock >= stuck_after]
            if todo and stuck and len(self._workers) < (1 + MAX_SPARES_PER_WORKER) * self.size and all(
                    w.ready and w.job is not None for w in self._workers):
                # Every worker is busy and one is likely running out its time limit: a spare takes the queue
                # meanwhile, so distinct hard jobs time out side by side, not one after another.
                self._workers.append(self._new_worker(len(self._workers)))
            waiting = [w for w in self._workers if w.waiting]
            if not waiting:
                if todo:
                    continue
                raise WorkerStartError(f"the {self.kind.what} pool was closed while its jobs ran")
            wake = [w.deadline for w in waiting]
            # Also wake when a running job turns "stuck": to start a spare, or to hand on a job queued behind it.
            wake += [w.clock + stuck_after for w in waiting if w.job is not None and (todo or len(w.queue) > 1)
                     and w.clock + stuck_after > now]
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
                    _answer(replies, w.finish(), Reply("timeout", None, w.marked))  # its keeper did not answer in time
                    self.counts.timeouts += 1
                    self._replace(w, todo)
        for w in [w for w in self._workers if w.queue]:  # copies of jobs answered elsewhere: no late answer stays
            self._replace(w)

    def _dispatch(self, payloads: list, timeout: float, replies: list, todo: deque, retried: set) -> None:
        """Each ready worker gets a job, then (once all have started) a second to hold in its pipe: its keeper starts
        that one the moment the first is answered, without waiting for the pool's loop."""
        for depth in range(1, QUEUED + 1):
            if depth > 1 and not all(w.ready for w in self._workers):
                return
            for w in list(self._workers):
                if not (w.ready and len(w.queue) < depth and not w.spent):
                    continue
                i = _next(todo, replies)
                if i is None:
                    return
                try:
                    w.send(i, payloads[i], timeout)
                except OSError:  # it died while idle: the job gets one more try, never a third
                    self._retry_or_crash(i, replies, todo, retried, marked=False)
                    self._replace(w, todo)

    def _receive(self, w: _Worker, replies: list, todo: deque, retried: set, timeout: float) -> None:
        key, value, message = _read(w)
        if key is None:
            self._died(w, replies, todo, retried)
            return
        if key == "ready" and not w.ready and isinstance(value, int):
            self._started(w, value, message)
            return
        if key == "ended":  # between jobs its runner was found busy: its keeper took no next job and exits
            self.counts.note("ended", f"{self.kind.what}: a worker was ended between jobs: {str(value)[:200]}")
            self._replace(w, todo)  # the jobs handed to it never started
            return
        if w.job is None or not w.ready:  # cannot happen: a keeper speaks of the job it runs; never misfile it
            self._replace(w, todo)
            return
        reply = w.take(key, value, message, self.counts, self.kind.what)
        if reply is None:
            return
        i = w.finish()
        if reply.how == "crash":  # its process died: once more, unless its own part had begun
            self._retry_or_crash(i, replies, todo, retried, reply.marked or w.tainted)
        else:
            _answer(replies, i, reply)
        if w.spent:
            if w.tainted:  # the job ran code from its text: no later job is scored by this worker
                self.counts.replaced_after_code += 1
            self._replace(w, todo)

    def _retry_or_crash(self, i: int, replies: list, todo: deque, retried: set, marked: bool) -> None:
        """A job whose worker died: tried once more where it may have died from outside (before its own part began,
        the first time), else it ends "crash"."""
        if replies[i] is not None:  # a copy of it answered elsewhere
            return
        if not marked and i not in retried:
            retried.add(i)
            todo.appendleft(i)
        else:
            replies[i] = Reply("crash", None, marked)

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
                    self._retry_or_crash(v.finish(), replies, todo, retried, v.tainted)
                self._replace(v, todo)
            return
        if w.job is not None:  # its keeper died without a word: killed from outside
            self._retry_or_crash(w.finish(), replies, todo, retried, w.marked or w.tainted)
        self._replace(w, todo)

    def _started(self, w: _Worker, ident: int, message: dict) -> None:
        """A worker said it is ready: its id, and the layers that held for it."""
        w.ready, w.ident = True, ident
        self.layers = frozenset(l for l in message.get("layers", []) if isinstance(l, str))
        self._failed_starts = 0

    def _said(self) -> str:
        return (self._cages[0].said() if self._cages else "") or "nothing"

    def _replace(self, w: _Worker, todo: deque | None = None) -> None:
        """End `w` and start a warm fork in its place; the jobs still queued on it, never started, go back first."""
        if todo is not None:
            todo.extendleft(reversed(w.queue))
        w.queue.clear()
        w.stop()
        place = self._workers.index(w)
        self._workers[place] = self._new_worker(place)

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


def _next(todo: deque, replies: list) -> int | None:
    """The next job to send that has no answer yet (a copy may have answered it), or None."""
    while todo:
        i = todo.popleft()
        if replies[i] is None:
            return i
    return None


def _answer(replies: list, i: int, reply: Reply) -> None:
    """The first answer to a job counts (a copy of it may answer later)."""
    if replies[i] is None:
        replies[i] = reply


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
