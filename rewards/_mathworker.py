"""What runs in the math-verify processes: the zygote, which imports math-verify once and forks warm
workers, and each worker's loop. The pool that drives them, and the protocol, are in `rewards._mathpool`.

A leaf: it imports nothing of ours (the zygote needs math-verify, and this file).
"""

from __future__ import annotations

import os
import signal
import socket
from multiprocessing.connection import Connection

FRAME = 32  # bytes per control frame: a stream socket may split or join sends, frames keep them apart


def _math_verify():
    import logging
    import warnings

    warnings.simplefilter("ignore")
    # math-verify warns that its own timeout is off: the pool enforces the limit by killing the worker.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import parse, verify

    return parse, verify


_WARM_UP = [  # (gold, prediction) pairs covering the kinds of answer math-verify builds differently
    ("$\\frac{1}{2}$", "\\boxed{\\sqrt{x}+0.5}"),
    ("\\boxed{(0,\\infty)}", "\\boxed{[0, 1)}"),
    ("\\boxed{\\{1,2\\}}", "\\boxed{\\{2,1\\}}"),
    ("\\boxed{\\pi}", "\\boxed{3.14}"),
    ("\\boxed{1 \\le x \\le 2}", "\\boxed{x=3}"),
    ("\\boxed{x^2+1}", "\\boxed{\\sin x}"),
    ("\\boxed{(1, 2)}", "\\boxed{\\text{(C)}}"),
]


def zygote(control_fd: int) -> None:
    """Import and warm math-verify once, then fork a worker per `spawn` until the pool hangs up."""
    import ctypes  # imported here, before any fork, for the workers' PR_SET_PDEATHSIG

    parse, verify = _math_verify()
    # The first parse builds the LaTeX parser (~0.2 s of CPU), and the first interval, set, pi or
    # inequality pulls in more of sympy (40-90 ms each, measured): done here once, every worker forked
    # later inherits it instead of paying it inside a job's time limit.
    for gold, pred in _WARM_UP:
        verify(parse(gold), parse(pred), timeout_seconds=None)
    control = socket.socket(fileno=control_fd)
    me = os.getpid()
    children: set[int] = set()
    while True:
        message, fds = _recv_frame(control)
        _reap(children)
        if message is None:  # the pool closed the socket, or its process died
            break
        command, _, arg = message.partition(" ")
        if command == "spawn" and len(fds) == 2:
            pid = os.fork()
            if pid == 0:
                control.close()
                _die_with(me, ctypes)
                code = 0
                try:
                    serve(*fds)
                except BaseException:  # noqa: BLE001 - a forked child must never return into the zygote's loop
                    code = 1
                os._exit(code)
            children.add(pid)
        elif command == "kill" and arg.isdigit() and int(arg) in children:
            # Only an unreaped child is killed: its pid cannot have been reused by another process.
            os.kill(int(arg), signal.SIGKILL)
            os.waitpid(int(arg), 0)
            children.discard(int(arg))
        for fd in fds:
            os.close(fd)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    os._exit(0)


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


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)


def _die_with(parent: int, ctypes) -> None:
    """Have the kernel SIGKILL this worker when `parent` (the zygote, single-threaded) exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the per-job CPU limit is the backstop
        pass
    if os.getppid() != parent:  # the zygote died before the request took effect
        os._exit(0)


def serve(read_fd: int, write_fd: int) -> None:
    """The worker's main loop: parse gold and prediction, verify gold first, answer; exit on EOF."""
    from functools import lru_cache

    parse, verify = _math_verify()
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)

    def parse_first(candidates: tuple) -> list:
        for candidate in candidates:
            parsed = parse(candidate, parsing_timeout=None)
            if parsed:
                return parsed
        return []

    parse_gold = lru_cache(maxsize=4096)(parse_first)  # a gold is checked against each completion of its group

    outbox.send(("ready", os.getpid()))
    while True:
        try:
            gold, pred, cpu_limit_s = inbox.recv()
        except (EOFError, OSError):  # the pool closed the pipe or died: nothing left to do
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
    """Make the kernel kill this worker if one job burns `seconds` more CPU: the backstop where the
    parent-death signal does not exist (a bignum power would otherwise spin on, orphaned)."""
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
