"""The inside of the untrusted-work pool (`grpokit.untrusted.pool` starts it and says why and what holds).

Started as `python -I -c <bootstrap code> ROOT MODULE CONTROL_FD LIMITS` with this package loaded as modules of empty
`grpokit` and `grpokit.untrusted` packages (their __init__s are not run). Standard library only, besides the sandbox's
layers (`child`) and the kind's MODULE, which defines `warm()` (imports and warms the library; run once, before any
job), `run(job)` (the job's own part: the model's text or code), `check(job, value)` (the keeper's check of a result:
its type, range and size) and may define `prepare(job)` (the job's trusted part, e.g. building its problem: True to
go on, False for a result of None without running; `Refused` for a job it cannot prepare) with `PREPARE_S` (its time
limit; None: the job's own), and `WATCH = False` (every job is the model's code: no audit hook). Four kinds of process:

    bootstrap   makes the cage's cgroups (where this machine lets it), enters new namespaces (network, pid, mount,
                ipc, uts; a user namespace too when not root), forks the zygote and waits for it, then removes the
                cgroups. The pool's process dying ends it (parent-death signal: it kills the zygote, removes the
                cgroups, exits); when it exits, the zygote's pid namespace and everything in it are gone.
    zygote      pid 1 of that namespace; never runs a job. Zeroes System V shared memory, pivots into a new root
                (read-only binds of this python, its site-packages and the project's own `grpokit`; a private
                size-capped /tmp), imports and warms MODULE, then forks a keeper per `spawn` on the control socket
                and kills one per `kill <id>`; removes a worker's cgroup once its keeper is gone.
    keeper      (keeper.py) the worker's trusted side: holds its pipes to the pool, its deadline and its reply
                format; never runs a job. Forks the runner and checks every message it sends.
    runner      (runner.py) the worker's untrusted side: runs the jobs, pid 1 of a pid namespace of its own with a
                /proc of its own, in its own cgroups, unprivileged, seccomp-filtered, its rlimits set; holds nothing
                but its two pipes to its keeper. It dies with its keeper, and the keeper with the zygote.
"""

from __future__ import annotations

import importlib
import os
import select
import signal
import socket

from grpokit.untrusted import child as layers
from grpokit.untrusted import keeper
from grpokit.untrusted.groups import drop_cage_group, sweep
from grpokit.untrusted.pool import FRAME

REAP_EVERY_S = 0.5  # how often an idle zygote reaps the processes that have exited (zombies hold a pid each)


def bootstrap(root: str, module: str, control_fd: int, limits: dict) -> None:
    """The process the pool starts: namespaces, then the zygote as their pid 1; exits when the zygote does, after
    removing the cage's cgroups -- also when the pool's process dies (its parent-death signal is SIGTERM, handled)."""
    zygote_pid: list[int] = []

    def stop(*_):
        if zygote_pid:
            os.kill(zygote_pid[0], signal.SIGKILL)  # its pid namespace goes with it; the waitpid below returns
        else:
            raise SystemExit  # before the zygote: only the cgroups to remove (below)

    signal.signal(signal.SIGTERM, stop)
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != limits["parent"]:  # the pool's process died before the request took effect
        os._exit(0)
    groups: list = []
    try:
        groups = _cage_groups(limits["cgroup"])
        entered = layers._unshare(limits["namespaces"])
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # until the zygote's pid is known
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
            try:
                zygote(root, module, control_fd, limits, entered, [(fd, v, c) for _, _, fd, v, c in groups])
            except BaseException:  # noqa: BLE001 - any failure here ends the cage; the pool reports its start failing
                import traceback

                traceback.print_exc()
            os._exit(70)
        zygote_pid.append(pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        os.close(control_fd)
        os.waitpid(pid, 0)  # a pid namespace's pid 1 is reaped only once everything in it is gone
    except SystemExit:
        pass
    finally:
        _remove_cage_groups(groups)
    os._exit(0)


def _cage_groups(name: str) -> list:
    """The cage's own cgroup in each hierarchy that limits memory or processes and that this process may write
    (root, or a delegated v2 subtree), made under this process's groups so every limit on the trainer still applies;
    each worker's group is made inside it by its keeper; `name` is the pool's choice (it removes the group too, should
    this process be killed before it can). `[(parent folder, name, folder, version, controllers)]`;
    [] where none can be made (then each process is bounded alone: pool.py)."""
    try:
        places = layers._cgroup_places()
    except (OSError, ValueError):
        return []
    made = []
    for parent, version, controllers in places:
        try:
            folder = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            os.mkdir(name, dir_fd=folder)
            inside = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        except OSError:
            os.close(folder)
            continue
        if version == "v2":  # its workers' groups get the controllers (cgroup v2 hands them down explicitly)
            try:
                layers._cgroup_write(inside, "cgroup.subtree_control", " ".join(f"+{c}" for c in controllers))
            except OSError:
                os.close(inside)
                os.rmdir(name, dir_fd=folder)
                os.close(folder)
                continue
        made.append((folder, name, inside, version, controllers))
    return made


def _remove_cage_groups(groups: list) -> None:
    """Once every process of the cage is gone: its workers' groups, then its own."""
    for folder, name, inside, _, _ in groups:
        drop_cage_group(folder, name, inside)


def zygote(root: str, module: str, control_fd: int, limits: dict, entered: list, groups: list) -> None:
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
        sweep(groups, keepers)
        if not select.select([control], [], [], REAP_EVERY_S)[0]:
            continue
        message, fds = _recv_frame(control)
        if message is None:  # the pool closed the socket, or its process died
            break
        command, _, arg = message.partition(" ")
        if command == "spawn" and len(fds) == 2 and arg.isdigit():
            pid = os.fork()
            if pid == 0:
                control.close()
                code = 0
                try:
                    keeper.keep(kind, fds, limits, entered, uid, gid, groups, int(arg))
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
