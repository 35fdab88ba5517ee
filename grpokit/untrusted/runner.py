"""The untrusted side of a caged worker: the process that runs a job's model text or code (a scorer on an answer, a
cell of the Python tool), started by its keeper (keeper.py) and holding nothing but its two pipes to that keeper.

It never holds the pool's pipes, the keeper's deadline, the cage's control socket or its cgroup folders: whatever a
job does here, the most it can write is a message to its keeper, which takes one reply per job, of the kind's type
and size, and only while the job's phase allows it (keeper.py says what it checks). Everything here after the first
job starts is the job's to change; the keeper trusts none of it.

Set-up, as root of the cage (or of its user namespace) before the first job: a session of its own; the keeper's
cgroups joined (every process it starts is counted there); a /proc of its own pid namespace (it sees itself and what
it starts, never another worker); every descriptor but its pipes closed; what it prints goes to /dev/null; then the
drop to an unprivileged uid without capabilities, rlimits (address space, processes, file size, open files, no core;
CPU per job), the seccomp filter, undumpable, and the audit hook below.

Messages are length-prefixed JSON (multiprocessing's framing):
    keeper -> runner   {"job": ..., "cpu_s": n, "n": number, ...}  (the pool's message, and the job's number)
    runner -> keeper   {"ready": [layers], "n": 0} once; per job, each with "n": the job's number: for a kind with
                       `prepare`, {"prepared": 1}, {"fail": why} (the kind refused the job's trusted part) or a final
                       reply; {"taint": why} (any number, during the job's own part); then one final reply:
                       {"result": value} or {"error": "Type: message"}

Between its reply and the next job, the signal handlers, the mask and the interval timers a job set are put back as
they were before the first job (a timer armed by one call never fires in the next); the keeper checks the handlers.

The audit hook: a scorer that evaluates the answer (sympy's `parse_expr`, `eval`) runs code the completion wrote.
Before any code compiled from text at run time executes, the hook looks at it; unless it only builds numbers and
symbols (what an arithmetic answer compiles to), it sends {"taint": ...} -- before that code runs, so nothing it does
can take the message back -- and the pool replaces the worker after the job: whatever the code changed in the
worker's memory cannot reach how a later completion is scored.
"""

from __future__ import annotations

import _signal
import dis
import json
import os
import resource
import select
import signal
import sys
from multiprocessing.connection import Connection

from grpokit.untrusted import child as layers

MAX_JOB_BYTES = 8 << 20  # a job (a completion, its problem's key) read by a worker at most; the pool refuses larger
# Names a code object compiled at run time may use and still not taint its worker: what sympy's `parse_expr` makes of
# an arithmetic answer (`Integer (1 )+Symbol ('x' )`; with evaluate=False, `Add(...)`), and its own
# `from sympy import *`. Loading or calling one of these builds a value; it changes nothing that outlives the job.
PLAIN_NAMES = frozenset({"Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow", "factorial", "sympy"})
# Instructions that change a namespace or an object: code holding one taints its worker whatever names it uses.
WRITES = ("STORE_NAME", "STORE_GLOBAL", "STORE_ATTR", "DELETE_NAME", "DELETE_GLOBAL", "DELETE_ATTR")
# Events that bring in code other than by compiling text (already watched as "exec"): unpickling a global, making a
# code or function object. (Not "marshal.loads": the import system reads every .pyc with it.)
TAINTING_EVENTS = ("pickle.find_class", "code.__new__", "function.__new__")


def serve(kind, pipes: tuple, lifeline: int, groups: list, limits: dict, entered: list, uid: int, gid: int) -> None:
    """Set up as the module docstring says, then serve jobs until the keeper closes the pipe."""
    held = _set_up(pipes, lifeline, groups, limits, entered, uid, gid)
    inbox, outbox = Connection(pipes[0], writable=False), Connection(pipes[1], readable=False)
    watch = _Watch(outbox)
    if getattr(kind, "WATCH", True):  # a kind whose every job is the model's code has nothing to report
        sys.addaudithook(watch)
    send = lambda message: outbox.send_bytes(json.dumps({**message, "n": watch.number}).encode())  # noqa: E731
    signals = _Signals()
    send({"ready": sorted(set(held + ["nomemfd"]))})
    pid_one = "pid-apart" in entered
    while True:
        try:
            message = json.loads(inbox.recv_bytes(MAX_JOB_BYTES))
        except (EOFError, OSError, ValueError):
            return
        watch.number = message["n"]
        _limit_cpu(int(message["cpu_s"]))
        reply = _one(kind, message["job"], watch, send)
        signals.restore()  # before the reply: once the keeper reads it, the next job may come
        if pid_one:  # before the reply: once the keeper reads it, nothing the job started may run (it checks)
            _end_leftovers()
        try:
            send(reply)
        except (TypeError, ValueError):  # a result JSON cannot carry
            send({"error": f"TypeError: the job returned {type(reply.get('result')).__name__}"})


def _set_up(pipes: tuple, lifeline: int, groups: list, limits: dict, entered: list, uid: int, gid: int) -> list:
    """Everything before the first job, as root of the cage (or of its user namespace); the layers that hold."""
    # A session (and process group) of its own: kill(0) reaches the sender's whole group, whatever pid namespace its
    # members are in, and every worker runs as the same user.
    os.setsid()
    warm = _vm_size()  # before its own /proc, which may be an empty one
    held = list(entered)
    held += layers._cgroups_join(groups)  # first: every process the job starts is counted in them
    if "pid-apart" in entered:
        held += _own_proc()
    layers._close_fds((*pipes, lifeline))
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # what a job prints reaches no terminal and no log
        os.dup2(devnull, fd)
    os.close(devnull)
    held += layers._drop_privileges(uid, gid, "userns" in entered)
    # Set after the uid change, which clears it: this runner dies with its keeper. The keeper may have died before:
    # then the lifeline reads end-of-file, and this runner goes too.
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(0)
    _limit(limits, warm)
    layers._seccomp()
    layers._libc.prctl(layers.PR_SET_DUMPABLE, 0, 0, 0, 0)
    return held


def _one(kind, job, watch: "_Watch", send) -> dict:
    """One job's reply: its trusted part first where the kind has one (said done with {"prepared"}), then its own."""
    prepare = getattr(kind, "prepare", None)
    if prepare is not None:  # the job's trusted part (its problem, its gold): not watched, timed apart by the keeper
        try:
            if not prepare(job):
                return {"result": None}
        except getattr(kind, "Refused", ()) as err:
            return {"fail": str(err)[:2000]}
        except BaseException as err:  # noqa: BLE001 - whatever it raised is the job's reply
            return {"error": _shown(err)}
        send({"prepared": 1})
    watch.on = True
    try:
        return {"result": kind.run(job)}
    except BaseException as err:  # noqa: BLE001 - whatever the job raised (SystemExit included) is its reply
        return {"error": _shown(err)}
    finally:
        watch.on = False


def _own_proc() -> list:
    """A /proc showing this runner's pid namespace only (it is that namespace's pid 1): no other worker's processes,
    names or sizes. Where the kernel refuses a new proc mount, an empty /proc instead."""
    if layers._libc.unshare(layers.CLONE_NEWNS) != 0:
        return []
    flags = layers.MS_NOSUID | layers.MS_NODEV | layers.MS_NOEXEC
    try:
        layers._mount("proc", "/proc", "proc", flags)
    except OSError:
        layers._mount("tmpfs", "/proc", "tmpfs", flags | layers.MS_RDONLY, "size=4k,mode=0555")
        return ["proc-hidden"]
    # Its /sys read-only again, as the cage's is (the new mount hid that bind).
    layers._mount("/proc/sys", "/proc/sys", None, layers.MS_BIND)
    layers._mount(None, "/proc/sys", None, layers.MS_REMOUNT | layers.MS_BIND | layers.MS_RDONLY | flags)
    return ["proc-own"]


def _shown(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"[:500]
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        return type(err).__name__


def _limit(limits: dict, usage: int) -> None:
    """Hard limits for the runner's whole life (only lowering is allowed afterwards); CPU is set per job. `usage`: its
    address space when it started. Each within the hard limit it inherited (a cluster's `ulimit -v`), never above."""
    for which, value in ((resource.RLIMIT_AS, usage + (limits["memory_mb"] << 20)),
                         (resource.RLIMIT_NPROC, limits["processes"]),
                         (resource.RLIMIT_FSIZE, limits["file_mb"] << 20),
                         (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_MSGQUEUE, 0),
                         (resource.RLIMIT_CORE, 0)):
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too big a file is an OSError in the job, not a kill


def _vm_size() -> int:
    """This process's address space now, in bytes: the memory limit is this much plus the job's allowance."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _limit_cpu(seconds: int) -> None:
    """The kernel kills this runner if one job burns `seconds` more CPU: the backstop should the keeper that kills it
    at its wall-time limit be gone."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime) + seconds
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _end_leftovers() -> None:
    """As pid 1 of its namespace: kill everything the job started (a fork, a daemon that left its group) and reap it."""
    try:
        os.kill(-1, signal.SIGKILL)  # from pid 1: every process of the namespace but itself
    except ProcessLookupError:
        return
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


class _Signals:
    """The runner's signal handlers, mask and interval timers as they were before its first job, put back after each
    job. What a job set outside Python's `signal` module the keeper sees (the handlers the kernel shows) and ends.
    Read through `_signal`, the C module under `signal`: its wrappers make an enum of every handler (~200 us a job
    for the 64 signals, against ~6 us)."""

    TIMERS = (signal.ITIMER_REAL, signal.ITIMER_VIRTUAL, signal.ITIMER_PROF)

    def __init__(self):
        self.handlers = {sig: _signal.getsignal(sig) for sig in _signal.valid_signals()}
        self.mask = _signal.pthread_sigmask(_signal.SIG_BLOCK, [])

    def restore(self) -> None:
        for timer in self.TIMERS:
            _signal.setitimer(timer, 0)
        for sig, handler in self.handlers.items():
            if handler is not None and _signal.getsignal(sig) != handler:
                try:
                    _signal.signal(sig, handler)
                except (OSError, ValueError):  # one Python cannot set: the keeper's check ends the runner
                    pass
        _signal.pthread_sigmask(_signal.SIG_SETMASK, self.mask)


class _Watch:
    """The audit hook (see the module docstring): reports code compiled from text that does more than build numbers."""

    def __init__(self, outbox: Connection):
        self.outbox, self.on, self.busy = outbox, False, False
        self.number = 0  # the job it runs: every message names it

    def __call__(self, event: str, args: tuple) -> None:
        if not self.on or self.busy:
            return
        if event == "exec":
            why = _runs_more_than_numbers(args[0])
        elif event in TAINTING_EVENTS:
            why = event
        else:
            return
        if why:
            self.busy = True
            try:
                self.outbox.send_bytes(json.dumps({"taint": why[:200], "n": self.number}).encode())
            finally:
                self.busy = False


def _runs_more_than_numbers(code) -> str | None:
    """Why running `code` may change the worker (a name it uses beyond numbers and symbols), or None. Code from a
    module's own file is the library's, not text compiled at run time."""
    if not hasattr(code, "co_names"):
        return "exec of a non-code object"
    if code.co_filename.endswith(".py") and os.path.isabs(code.co_filename):
        return None
    stack = [code]
    while stack:
        current = stack.pop()
        extra = set(current.co_names) - PLAIN_NAMES
        if extra:
            return f"code compiled at run time uses {', '.join(sorted(extra)[:5])}"
        writes = {i.opname for i in dis.get_instructions(current) if i.opname in WRITES}
        if writes:
            return f"code compiled at run time writes ({', '.join(sorted(writes))})"
        stack += [c for c in current.co_consts if hasattr(c, "co_names")]
    return None
