"""The trusted side of a caged worker: the process that holds the worker's pipes to the pool and never runs a job.

The zygote (cage.py) forks a keeper per worker. The keeper forks the runner (runner.py: the process that runs the
job's model text or code) as pid 1 of a pid namespace of its own, in cgroups of its own, and talks to it over two
pipes of its own; the pool's pipes, the deadline and the reply format stay here, out of the runner's reach. Per job:

    deadline   the keeper's alone. A kind with a trusted part (`prepare`: building a reasoning-gym problem, parsing a
               gold) gets `PREPARE_S` seconds for it (the job's own limit where that is None), timed here; the job's
               own limit starts when the runner says the part is done, once. Past either, the runner is killed and
               the job ends "timeout". Nothing the runner sends moves a deadline.
    replies    one per job, read within the deadline and the size bound (REPLY_BYTES), each naming the job by the
               number the keeper gave it (random, new per job: a reply left over from an earlier job, or made for a
               later one, names another), and only what the phase allows: {"prepared"} or {"fail"} during the
               trusted part, {"taint"} during the job's own, then {"result"} -- checked by the kind's
               `check(job, value)` (its type, range and size; text made valid: no lone surrogates) -- or {"error"}.
               Anything else ends the job "invalid" and the runner with it.
    quiet      the runner must be back waiting for a job: one thread, no process of its own left, blocked in the read
               call on its own job pipe (the call and a descriptor of that very pipe, where the kernel shows them;
               else the wait channel of any pipe's read), catching no signal it did not catch before its first job
               (it puts back the handlers and timers a job set before replying), and nothing sent beyond its one
               reply (its pipe drained once it is back, and again before the next job). A Python-tool call's reply
               is sent only once it is (a runner still busy after IDLE_WAIT_S -- a thread left running, code that
               sent a reply of its own and ran on -- is killed, and the reply says so: "ended"); a scorer's runner
               is checked before its next job (a busy one is killed, the pool told "ended", and the job it would
               have run goes elsewhere).
    memory     the runner and everything it starts share one cgroup (where this machine lets the cage make them):
               at most the warm worker's resident size plus the kind's `memory_mb` and `file_mb`; `processes` + 1
               tasks. Without cgroups, each process is bounded alone (RLIMIT_AS) and the uid's count of processes.

To the pool: {"ready": id, "layers": [...]} once; per job, where its trusted part is slow (SLOW_PREPARE_S),
{"build": seconds} then {"mark": 1} (the pool's own backstop deadline follows them); then one final message:
{"result": v}, {"error": text} or {"fail": text} (each may carry "ended": why), {"timeout": 1}, {"crash": 1} or
{"invalid": why}, each with "marked" (whether the job's own part had begun) and, where the answer's code ran more
than numbers, "taint": what. Between jobs, {"ended": why} for a scorer's runner found busy: the keeper then exits.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import select
import signal
import struct
import time
from multiprocessing.connection import Connection

from grpokit.untrusted import child as layers
from grpokit.untrusted import runner
from grpokit.untrusted.groups import make_groups

STARTUP_TIMEOUT_S = 120.0  # importing nothing (the runner is forked warm), but a loaded 2-core box can be slow
SLOW_PREPARE_S = 0.05  # a job's trusted part past this is said to the pool, whose backstop deadline then allows for it
IDLE_WAIT_S = 3.0  # a runner that replied is back reading its pipe within microseconds; a loaded CI box, far longer
REPLY_BYTES = 2 << 20  # one message from a runner at most: room for the largest output a cell may return (python_job)
_SURROGATES = re.compile("[\ud800-\udfff]")


class _Late(Exception):
    """The deadline passed before the runner's message (or its reading of the job) was whole."""


class _Gone(Exception):
    """The runner's end of a pipe closed (it died), or it sent what no runner sends (not a message, too long)."""


def valid_text(text: str, most: int | None = None) -> str:
    """`text` as the model and the tokenizer can take it: lone surrogates (undecodable bytes a program printed,
    escaped by Python) become U+FFFD; cut to `most` characters when given.

    >>> valid_text("ok \\udcff"), valid_text("abcdef", 3)
    ('ok \\ufffd', 'abc')
    """
    return _SURROGATES.sub("\ufffd", text if most is None else text[:most])


def score(value, low: float = 0.0, high: float = 1.0) -> float:
    """`value` as a score: a finite number within [low, high] (not a bool); ValueError naming what it was."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"a score must be a finite number, got {type(value).__name__} {str(value)[:40]}")
    if not low <= value <= high:
        raise ValueError(f"a score must be within [{low:g}, {high:g}], got {value!r}")
    return float(value)


def keep(kind, fds: list, limits: dict, entered: list, uid: int, gid: int, cage_groups: list, slot: int) -> None:
    """The keeper's life: set up, fork the runner, serve the pool's jobs; when it ends, the runner ends with it. The
    keeper and its runner share the `slot`-th CPU this process may use: each hand-over between them stays on it."""
    layers._libc.prctl(layers.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the zygote is single-threaded: no race
    me = os.getpid()
    if getattr(kind, "WATCH", True):  # not for a tool's runner: its keeper waits for it to be back after a reply
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[slot % len(cpus)]})
    if limits.get("scratch") and "tmpfs" in entered:
        _own_tmp(limits["file_mb"], uid, gid)
    apart = "pid" in entered and layers._libc.unshare(layers.CLONE_NEWPID) == 0
    groups = make_groups(cage_groups, limits, me)
    job_r, job_w = os.pipe()
    reply_r, reply_w = os.pipe()
    lifeline_r, lifeline_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (job_w, reply_r, lifeline_w):
            os.close(fd)
        code = 0
        try:
            runner.serve(kind, (job_r, reply_w), lifeline_r, groups, limits,
                         entered + (["pid-apart"] if apart else []), uid, gid)
        except BaseException:  # noqa: BLE001 - a set-up step that failed: the keeper sees the pipe close
            code = 1
        os._exit(code)
    for fd in (job_r, reply_w, lifeline_r):
        os.close(fd)
    try:
        _Keeper(kind, pid, fds, _Line(job_w, reply_r), me).serve()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                os.waitpid(pid, 0)
                break
            except ChildProcessError:
                break
            except InterruptedError:
                continue
    os._exit(0)


class _Keeper:
    def __init__(self, kind, pid: int, fds: list, line: "_Line", ident: int):
        self.kind, self.pid, self.line, self.ident = kind, pid, line, ident
        self.inbox, self.outbox = Connection(fds[0], writable=False), Connection(fds[1], readable=False)
        self.prepares = hasattr(kind, "prepare")
        # A kind whose every job is the model's code (the Python tool) is checked quiet before its reply is sent: the
        # model reads nothing from a call still running. A scorer's runner is checked before its next job: its code
        # is a library's (an answer that runs more is seen first and ends the worker), and the check waits for the
        # runner to free what the job built (math-verify: ~1 ms) off the reply's path.
        self.eager = not getattr(kind, "WATCH", True)
        self.wchan = False  # whether this machine shows a waiting runner's wait channel (checked at start)

    def tell(self, message: dict) -> None:
        self.outbox.send_bytes(json.dumps(message).encode())

    def serve(self) -> None:
        try:
            hello = _reply(self.line.recv(REPLY_BYTES, time.monotonic() + STARTUP_TIMEOUT_S), 0)
        except (_Late, _Gone):
            return  # the pool sees our pipe close: the worker did not start
        if hello is None or hello[0] != "ready" or not isinstance(hello[1], list):
            return
        held = {str(layer) for layer in hello[1]}
        # Read again for every reply (a /proc file is made anew at each read from its start): opened once.
        self.proc = {}
        for name, path in (("stat", "stat"), ("wchan", "wchan"), ("children", f"task/{self.pid}/children"),
                           ("syscall", "syscall"), ("status", "status")):
            try:
                self.proc[name] = os.open(f"/proc/{self.pid}/{path}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                pass
        # Whether this machine shows the runner's wait channel: it is on its way to read its first job.
        deadline = time.monotonic() + IDLE_WAIT_S
        while self.wait_channel() and not _waiting(self.wait_channel()) and time.monotonic() < deadline:
            time.sleep(50e-6)
        self.wchan = _waiting(self.wait_channel())
        if self.wchan:
            held.add("quiet-checked")
        # As it waits for its first job (nothing of a job's has run): the read call it waits in, on its job pipe, and
        # the signals it catches. Each is checked after every job where this machine shows it.
        self.caught = self.handlers()
        self.read_call = self.syscall()[0] if self.wchan else None
        if self.read_call is not None and not self.reading_job():
            self.read_call = None
        if self.read_call is not None:
            held.add("job-pipe-checked")
        self.tell({"ready": self.ident, "layers": sorted(held)})
        while True:
            try:
                raw = self.inbox.recv_bytes(runner.MAX_JOB_BYTES + 4096)
            except (EOFError, OSError):
                return
            message = json.loads(raw)
            spoke = self.line.pending()
            if spoke:  # it sent something while waiting for this job: that job never started here
                self.tell({"ended": spoke})
                return
            number = int.from_bytes(os.urandom(8), "big") >> 1  # JSON's and the runner's int alike
            raw = raw[:-1] + b', "n": %d}' % number  # the pool's JSON object (worker.encode), one key more
            final = self.one(raw, message["job"], float(message["timeout"]), number)
            self.tell(final)
            if not (ANSWERED & set(final)) or "ended" in final or "taint" in final:
                return  # the runner is gone or not to be trusted with another job: the pool replaces this worker
            if not self.eager:  # a scorer: quiet before its next job, not before its reply (it may free a large heap)
                busy = self.left_running()
                if busy:
                    self.tell({"ended": busy})  # before reading the next job: that one never started here
                    return

    def one(self, raw: bytes, job, timeout: float, number: int) -> dict:
        """One job, from handing it to the runner to the message for the pool: how it ended, whether its own part
        had begun ("marked"), what the answer's code ran ("taint"), and why the runner was ended after it ("ended")."""
        now = time.monotonic()
        if self.prepares:
            cap = getattr(self.kind, "PREPARE_S", None) or timeout
            phase, deadline = "prepare", now + cap
        else:
            phase, deadline = "run", now + timeout
        final, phase, taint = self.exchange(raw, job, timeout, phase, deadline, now, number)
        if self.eager and ANSWERED & set(final):
            busy = self.left_running()
            if busy:
                final["ended"] = busy
        final["marked"] = phase == "run"
        if taint:
            final["taint"] = taint
        return final

    def exchange(self, raw: bytes, job, timeout: float, phase: str, deadline: float, start: float, number: int):
        """Hand the job over and read the runner's messages until its one reply: (final message, the phase it ended
        in, the first thing the answer's code ran)."""
        told, taint = False, ""  # whether the pool heard of a slow trusted part
        try:
            self.line.send(raw, deadline)
            while True:
                # A trusted part that takes a while is said to the pool (its backstop deadline follows), once.
                soon = start + SLOW_PREPARE_S if phase == "prepare" and not told else deadline
                try:
                    got = _reply(self.line.recv(REPLY_BYTES, min(soon, deadline)), number)
                except _Late:
                    if time.monotonic() >= deadline:
                        raise
                    self.tell({"build": deadline - start})
                    told = True
                    continue
                if got is None:
                    return {"invalid": "a message that is not one JSON object of its job's number and one key"}, \
                        phase, taint
                key, value = got
                if key == "n":
                    return {"invalid": "a message naming another job (not the number this job was given)"}, phase, taint
                if key == "taint" and phase == "run":
                    taint = taint or valid_text(str(value), 200)
                elif key == "prepared" and phase == "prepare":
                    phase, deadline = "run", time.monotonic() + timeout
                    if told:
                        self.tell({"mark": 1})
                elif key == "fail" and phase == "prepare":
                    return {"fail": valid_text(str(value), 2000)}, phase, taint
                elif key == "result":
                    try:
                        return {"result": self.kind.check(job, value)}, phase, taint
                    except ValueError as why:
                        return {"invalid": f"the job's result: {why}"}, phase, taint
                elif key == "error" and isinstance(value, str):
                    return {"error": valid_text(value, 500)}, phase, taint
                else:
                    return ({"invalid": f"a message no job sends while {_PHASES[phase]}: {valid_text(key, 40)!r}"},
                            phase, taint)
        except _Late:
            return {"timeout": 1}, phase, taint
        except _Gone:
            return {"crash": 1}, phase, taint

    def left_running(self) -> str:
        """Why the runner is not back waiting for its next job ("" when it is), after up to IDLE_WAIT_S."""
        start, pause = time.monotonic(), 20e-6
        why = self.busy()
        if why:  # the runner has replied and is on its way to read, on this same CPU: let it run there first
            os.sched_yield()
            why = self.busy()
        while why and time.monotonic() - start < IDLE_WAIT_S:
            # Still not back: sleep (never spin, which would hold the CPU it needs); a runner that stays busy is
            # looked at less and less often.
            time.sleep(pause)
            pause = min(2 * pause, 0.01)
            why = self.busy()
        # Back and quiet, it has sent all it will: anything in its pipe beyond the one reply was sent out of turn.
        return why or self.line.pending()

    def wait_channel(self) -> str:
        """Where in the kernel the runner waits ("" where this machine does not show it, or it is gone)."""
        try:
            return os.pread(self.proc["wchan"], 256, 0).decode(errors="replace")
        except (OSError, KeyError):
            return ""

    def busy(self) -> str:
        try:
            fields = os.pread(self.proc["stat"], 4096, 0).rpartition(b")")[2].split()
            state, threads = fields[0], int(fields[17])
            if threads > 1:
                return f"it left {threads - 1} thread(s) running"
            if state != b"S" or (self.wchan and not _waiting(self.wait_channel())):
                return "its code was still running after its reply"
            if self.read_call is not None and not self.reading_job():
                return "it was waiting on something other than its job pipe after its reply"
            children = os.pread(self.proc["children"], 4096, 0).split()
        except (OSError, ValueError, IndexError, KeyError):
            return "it is gone"
        if children:
            return f"it left {len(children)} process(es) running"
        if self.handlers() != self.caught:
            return "it left a signal handler set"
        return ""

    def syscall(self) -> list:
        """The system call the runner is in and its arguments, as the kernel shows them ([] where it does not)."""
        try:
            return os.pread(self.proc["syscall"], 512, 0).split()
        except (OSError, KeyError):
            return []

    def reading_job(self) -> bool:
        """Whether the runner is in the read call it waits for jobs in, on a descriptor of its own job pipe (a job
        cannot stand in for it: a pipe of its own, even under the job pipe's number, is another pipe)."""
        call = self.syscall()
        if len(call) < 2 or call[0] != self.read_call:
            return False
        try:
            return os.readlink(f"/proc/{self.pid}/fd/{int(call[1], 16)}") == self.line.out_link
        except (OSError, ValueError):
            return False

    def handlers(self) -> bytes:
        """The signals the runner catches (a handler of its own runs on them), as the kernel shows them."""
        try:
            status = os.pread(self.proc["status"], 8192, 0)
        except (OSError, KeyError):
            return b""
        start = status.find(b"SigCgt:")
        return status[start:status.find(b"\n", start)] if start >= 0 else b""


_PHASES = {"prepare": "its trusted part runs", "run": "it runs"}
ANSWERED = {"result", "error", "fail"}  # a job's replies after which its runner may take another


def _reply(data: bytes, number: int):
    """(key, value) of a runner's message for the job given `number` (0: before any job): one JSON object holding
    "n", that number, and one key more; ("n", the number it named) for a message naming another; else None."""
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(message, dict) or len(message) != 2 or "n" not in message:
        return None
    named = message.pop("n")
    if type(named) is not int or named != number:
        return "n", named
    return next(iter(message.items()))


def _waiting(wchan: str) -> bool:
    """Whether a wait channel is a pipe's read: the runner blocked on its next job (`anon_pipe_read` on Linux 6.x,
    `pipe_read` before)."""
    return wchan.endswith("pipe_read")


class _Line:
    """The keeper's ends of the runner's pipes, every read and write bounded by a deadline: a runner that stops
    reading its job, or sends half a message, cannot hold the keeper past it. multiprocessing's framing (a 4-byte
    big-endian length), which the runner's `Connection` reads and writes."""

    def __init__(self, out_fd: int, in_fd: int):
        self.out_fd, self.in_fd, self.buffer = out_fd, in_fd, bytearray()
        self.out_link = os.readlink(f"/proc/self/fd/{out_fd}")  # "pipe:[inode]": both ends of a pipe show one
        os.set_blocking(out_fd, False)
        os.set_blocking(in_fd, False)

    def pending(self) -> str:
        """Why the runner's pipe is not empty now ("" when it is): something sent and not read, or its end closed."""
        if self.buffer or select.select([self.in_fd], [], [], 0)[0]:
            return "it sent more than its reply, or out of turn"
        return ""

    def send(self, payload: bytes, deadline: float) -> None:
        view = memoryview(struct.pack("!i", len(payload)) + payload)
        while view:
            try:
                view = view[os.write(self.out_fd, view[:1 << 16]):]
            except BlockingIOError:
                self._wait([], [self.out_fd], deadline)
                continue
            except OSError as err:
                if err.errno in (errno.EPIPE, errno.EBADF):
                    raise _Gone from None
                raise

    def recv(self, most: int, deadline: float) -> bytes:
        size = struct.unpack("!i", self._exactly(4, deadline))[0]
        if not 0 <= size <= most:
            raise _Gone
        return self._exactly(size, deadline)

    def _exactly(self, n: int, deadline: float) -> bytes:
        while len(self.buffer) < n:
            try:
                chunk = os.read(self.in_fd, max(1 << 16, n - len(self.buffer)))
            except BlockingIOError:
                self._wait([self.in_fd], [], deadline)
                continue
            if not chunk:
                raise _Gone
            self.buffer += chunk
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        return out

    @staticmethod
    def _wait(readers: list, writers: list, deadline: float) -> None:
        """Until a descriptor is ready; _Late past the deadline (each read or write is tried first, then waited for:
        a reply that is there already costs no wait)."""
        left = deadline - time.monotonic()
        if left <= 0 or not any(select.select(readers, writers, [], left)[:2]):
            raise _Late


def _own_tmp(file_mb: int, uid: int, gid: int) -> None:
    """A /tmp of the worker's own (a mount namespace of its own, a fresh tmpfs): a worker kept for one rollout
    neither reads nor leaves files for another's. A step that fails ends the keeper: no worker starts shared."""
    if layers._libc.unshare(layers.CLONE_NEWNS) != 0:
        raise OSError("sandbox set-up: a mount namespace for the worker's own /tmp")
    layers._mount("tmpfs", "/tmp", "tmpfs", layers.MS_NOSUID | layers.MS_NODEV, f"size={file_mb}m,mode=0700")
    os.chown("/tmp", uid, gid)
    os.chdir("/tmp")
