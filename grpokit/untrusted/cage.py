"""The inside of the untrusted-work pool (`grpokit.untrusted.pool` starts it and says why and what holds).

Started as `python -I -c <bootstrap code> ROOT MODULE CONTROL_FD LIMITS` with this package loaded as modules of empty
`rewards`, `rewards._machinery` and `grpokit.untrusted` packages (their __init__s, the trainer's reward
registry, are not run). Standard library only, besides the sandbox's layers (`child`) and the kind's MODULE, which
defines `warm()` (imports and warms the library; run once, before any job) and `run(job, tell)` (one job;
`tell("build")` says trusted work outside the job's time starts, e.g. building its problem, and `tell("mark")` that
the job's own time starts now; a kind may mark without building, as a milestone) and may set `WATCH = False` (every
job is the model's code: no audit hook). Three kinds of process:

    bootstrap   enters new namespaces (network, pid, mount, ipc, uts; a user namespace too when not root), forks
                the zygote and waits for it. It dies with the pool's process (parent-death signal); when it exits,
                the zygote's pid namespace and everything in it are gone.
    zygote      pid 1 of that namespace; never runs a job. Zeroes System V shared memory, pivots into a new root
                (read-only binds of this python, its site-packages and the project's own `rewards` and `grpokit`; a
                private size-capped /tmp), imports and warms MODULE, then forks a worker per `spawn` on the control
                socket and kills one per `kill <id>`.
    worker      a keeper (the zygote's child: the worker's id, root, never runs a job) forks it as pid 1 of a pid
                namespace of its own, leading a session of its own, so it neither sees nor signals the zygote or
                another worker (a kind with `scratch` also gets a /tmp of its own). It drops to an unprivileged uid
                (nobody, as root) without capabilities, sets rlimits (address space, processes, file size, open
                files, no core; CPU per job), installs the sandbox's seccomp filter and makes itself undumpable, adds
                the audit hook (below), then serves jobs on its two pipes; after each job, before its reply, it kills
                whatever the job left running in its namespace. It dies with its keeper, and the keeper with the
                zygote.

Messages are length-prefixed JSON (never pickle: the pool must not unpickle what a caged process wrote):
    pool -> worker   {"job": ..., "cpu_s": n}
    worker -> pool   {"ready": id, "layers": [...]} once; per job {"build": 1}, {"mark": 1}, {"taint": why} (any
                     number, before the reply), then one of {"result": value}, {"error": "Type: message"} (the job raised),
                     {"fail": "message"} (the kind refused the job's trusted part: a data problem, not the answer's)

The audit hook: a scorer that evaluates the answer (sympy's `parse_expr`, `eval`) runs code the completion wrote.
Before any code compiled from text at run time executes, the hook looks at it; unless it only builds numbers and
symbols (what an arithmetic answer compiles to), it sends {"taint": ...} -- before that code runs, so nothing it does
can take the message back -- and the pool replaces the worker after the job: whatever the code changed in the
worker's memory cannot reach how a later completion is scored.
"""

from __future__ import annotations

import ctypes
import dis
import importlib
import json
import os
import resource
import select
import signal
import socket
import sys
from multiprocessing.connection import Connection

from grpokit.untrusted import child as layers
from grpokit.untrusted.pool import FRAME

REAP_EVERY_S = 0.5  # how often an idle zygote reaps the processes that have exited (zombies hold a pid each)
MAX_JOB_BYTES = 8 << 20  # a job (a completion, its problem's key) read by a worker at most
# Names a code object compiled at run time may use and still not taint its worker: what sympy's `parse_expr` makes of
# an arithmetic answer (`Integer (1 )+Symbol ('x' )`; with evaluate=False, `Add(...)`), and its own
# `from sympy import *`. Loading or calling one of these builds a value; it changes nothing that outlives the job.
PLAIN_NAMES = frozenset({"Integer", "Float", "Rational", "Symbol", "Add", "Mul", "Pow", "factorial", "sympy"})
# Instructions that change a namespace or an object: code holding one taints its worker whatever names it uses.
WRITES = ("STORE_NAME", "STORE_GLOBAL", "STORE_ATTR", "DELETE_NAME", "DELETE_GLOBAL", "DELETE_ATTR")
# Events that bring in code other than by compiling text (already watched as "exec"): unpickling a global, making a
# code or function object. (Not "marshal.loads": the import system reads every .pyc with it.)
TAINTING_EVENTS = ("pickle.find_class", "code.__new__", "function.__new__")


def bootstrap(root: str, module: str, control_fd: int, limits: dict) -> None:
    """The process the pool starts: namespaces, then the zygote as their pid 1; exits when the zygote does."""
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != limits["parent"]:  # the pool's process died before the request took effect
        os._exit(0)
    entered = layers._unshare(limits["namespaces"])
    pid = os.fork()
    if pid == 0:
        try:
            zygote(root, module, control_fd, limits, entered)
        except BaseException:  # noqa: BLE001 - any failure here ends the cage; the pool reports its start failing
            import traceback

            traceback.print_exc()
        os._exit(70)
    os.close(control_fd)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(pid, signal.SIGKILL))
    os.waitpid(pid, 0)  # a pid namespace's pid 1 is reaped only once everything in it is gone
    os._exit(0)


def zygote(root: str, module: str, control_fd: int, limits: dict, entered: list) -> None:
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    uid, gid = (0, 0) if "userns" in entered else (limits["uid"], limits["gid"])
    if "ipc" in entered:
        layers._no_shared_memory()
        entered.append("noshm")
    if "mountns" in entered:
        entered += layers._new_root(limits["file_mb"], uid, gid, extra=tuple(limits["visible"]))
    os.chdir("/tmp" if "tmpfs" in entered else "/")
    layers._libc.prctl(layers.PR_SET_DUMPABLE, 0, 0, 0, 0)  # no worker (same uid) may read its memory
    kind = importlib.import_module(module)
    kind.warm()
    control = socket.socket(fileno=control_fd)
    keepers: set[int] = set()
    while True:
        _reap(keepers)
        if not select.select([control], [], [], REAP_EVERY_S)[0]:
            continue
        message, fds = _recv_frame(control)
        if message is None:  # the pool closed the socket, or its process died
            break
        command, _, arg = message.partition(" ")
        if command == "spawn" and len(fds) == 2:
            pid = os.fork()
            if pid == 0:
                control.close()
                code = 0
                try:
                    _keep(kind, fds, limits, entered, uid, gid)
                except BaseException:  # noqa: BLE001 - a forked child never returns into the zygote's loop
                    code = 1
                os._exit(code)
            keepers.add(pid)
        elif command == "kill" and arg.isdigit() and int(arg) in keepers:
            # Only an unreaped child is killed: its pid cannot have been reused by another process.
            os.kill(int(arg), signal.SIGKILL)
            os.waitpid(int(arg), 0)
            keepers.discard(int(arg))
        for fd in fds:
            os.close(fd)
    os._exit(0)  # pid 1 exits: the kernel kills every keeper and worker left in the namespace


def _recv_frame(control: socket.socket) -> tuple[str | None, list[int]]:
    try:
        data, fds, _, _ = socket.recv_fds(control, FRAME, 2)
        while data and len(data) < FRAME:
            more = control.recv(FRAME - len(data))
            if not more:
                data = b""
            data += more
    except OSError:
        return None, []
    return (data.decode().rstrip() if data else None), list(fds)


def _reap(keepers: set[int]) -> None:
    """Reap every child that has exited: keepers, and the workers of keepers killed before them (as pid 1 of its
    namespace, the zygote inherits them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if not pid:
            return
        keepers.discard(pid)


def _keep(kind, fds: list, limits: dict, entered: list, uid: int, gid: int) -> None:
    """The keeper: the worker's id, and its parent. Forks the worker as pid 1 of a pid namespace of its own (where
    the kernel allows one), then waits for it; dies with the zygote, and the worker with it."""
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the zygote is single-threaded: no race
    me = os.getpid()
    if limits.get("scratch") and "tmpfs" in entered:
        _own_tmp(limits["file_mb"], uid, gid)
    apart = "pid" in entered and layers._libc.unshare(layers.CLONE_NEWPID) == 0
    lifeline_r, lifeline_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(lifeline_w)
        _work(kind, fds, lifeline_r, me, limits, entered + (["pid-apart"] if apart else []), uid, gid)
        os._exit(0)
    for fd in fds:
        os.close(fd)
    os.close(lifeline_r)
    while True:
        try:
            os.waitpid(pid, 0)
            break
        except ChildProcessError:
            break
        except InterruptedError:
            continue
    os._exit(0)


def _own_tmp(file_mb: int, uid: int, gid: int) -> None:
    """A /tmp of the worker's own (a mount namespace of its own, a fresh tmpfs): a worker kept for one rollout
    neither reads nor leaves files for another's. A step that fails ends the keeper: no worker starts shared."""
    if layers._libc.unshare(layers.CLONE_NEWNS) != 0:
        raise OSError("sandbox set-up: a mount namespace for the worker's own /tmp")
    layers._mount("tmpfs", "/tmp", "tmpfs", layers.MS_NOSUID | layers.MS_NODEV, f"size={file_mb}m,mode=0700")
    os.chown("/tmp", uid, gid)
    os.chdir("/tmp")


def _work(kind, fds: list, lifeline: int, ident: int, limits: dict, entered: list, uid: int, gid: int) -> None:
    # A session (and process group) of its own: kill(0) reaches the sender's whole group, whatever pid namespace its
    # members are in, and every worker runs as the same user -- sharing the cage's group, one job could kill another.
    os.setsid()
    layers._close_fds((*fds, lifeline))
    devnull = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):  # what a job prints reaches no terminal and no log
        os.dup2(devnull, fd)
    os.close(devnull)
    dropped = layers._drop_privileges(uid, gid, "userns" in entered)
    # Set after the uid change, which clears it: this worker dies with its keeper. The keeper may have died before:
    # then the lifeline reads end-of-file, and this worker goes too.
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if select.select([lifeline], [], [], 0)[0]:
        os._exit(0)
    _limit(limits)
    layers._seccomp()
    layers._libc.prctl(layers.PR_SET_DUMPABLE, 0, 0, 0, 0)
    inbox, outbox = Connection(fds[0], writable=False), Connection(fds[1], readable=False)
    watch = _Watch(outbox)
    if getattr(kind, "WATCH", True):  # a kind whose every job is the model's code has nothing to report
        sys.addaudithook(watch)
    send = lambda message: outbox.send_bytes(json.dumps(message).encode())  # noqa: E731
    send({"ready": ident, "layers": sorted(set(entered + dropped + ["nomemfd"]))})
    pid_one = "pid-apart" in entered

    def tell(what: str) -> None:
        if what in ("build", "mark"):
            watch.on = what == "mark"  # trusted work (the row's own problem) is not watched; the answer's part is
            send({what: 1})

    while True:
        try:
            message = json.loads(inbox.recv_bytes(MAX_JOB_BYTES))
        except (EOFError, OSError, ValueError):
            return
        _limit_cpu(int(message["cpu_s"]))
        watch.on = True
        try:
            reply = {"result": kind.run(message["job"], tell)}
        except getattr(kind, "Refused", ()) as err:
            reply = {"fail": str(err)[:2000]}
        except BaseException as err:  # noqa: BLE001 - whatever the job raised (SystemExit included) is its reply
            reply = {"error": _shown(err)}
        watch.on = False
        if pid_one:  # before the reply: once the pool reads it, nothing the job started runs any more
            _end_leftovers()
        try:
            send(reply)
        except (TypeError, ValueError):  # a result JSON cannot carry
            send({"error": f"TypeError: the job returned {type(reply.get('result')).__name__}"})


def _shown(err: BaseException) -> str:
    try:
        return f"{type(err).__name__}: {err}"[:500]
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        return type(err).__name__


def _limit(limits: dict) -> None:
    """Hard limits for the worker's whole life (only lowering is allowed afterwards); CPU is set per job."""
    usage = _vm_size()
    for which, value in ((resource.RLIMIT_AS, usage + (limits["memory_mb"] << 20)),
                         (resource.RLIMIT_NPROC, limits["processes"]),
                         (resource.RLIMIT_FSIZE, limits["file_mb"] << 20),
                         (resource.RLIMIT_NOFILE, 64),
                         (resource.RLIMIT_MSGQUEUE, 0),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too big a file is an OSError in the job, not a kill


def _vm_size() -> int:
    """This process's address space now, in bytes: the memory limit is this much plus the job's allowance."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _limit_cpu(seconds: int) -> None:
    """The kernel kills this worker if one job burns `seconds` more CPU: the backstop should the pool that kills it at
    its wall-time limit be gone."""
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


class _Watch:
    """The audit hook (see the module docstring): reports code compiled from text that does more than build numbers."""

    def __init__(self, outbox: Connection):
        self.outbox, self.on, self.busy = outbox, False, False

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
                self.outbox.send_bytes(json.dumps({"taint": why[:200]}).encode())
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
