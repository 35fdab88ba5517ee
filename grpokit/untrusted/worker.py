"""The pool's end of one caged worker (pool.py keeps the workers; cage.py and keeper.py are their inside): its pipes,
the jobs handed to it (the one it runs and the next, waiting in its pipe), the backstop deadline, and what each
message its keeper sends means. How a job ended is a `Reply`; what went wrong across jobs is counted in `Counts`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection

from grpokit.untrusted.keeper import REPLY_BYTES
from grpokit.untrusted.runner import MAX_JOB_BYTES

STARTUP_TIMEOUT_S = 120.0  # importing sympy or reasoning-gym on a loaded 2-core box takes seconds, not minutes
# Past the keeper's deadline, the keeper's own answer ("timeout") is overdue: the worker is killed. Above the keeper's
# IDLE_WAIT_S: a queued job starts only once the runner is found quiet after the one before.
GRACE_S = 5.0
FINAL = ("result", "error", "fail", "timeout", "crash", "invalid")  # how a keeper's message on a job ends it
MAX_REPLY_BYTES = REPLY_BYTES + 4096  # one message from a keeper at most: a runner's, checked, and what it adds
_LOG = logging.getLogger("grpokit.untrusted")


@dataclass
class Reply:
    """How one job ended: `how` is "result" (`value` is the kind's result, checked), "error" (the job raised: `value`
    says what), "fail" (the kind refused the job's trusted part, e.g. a problem it cannot build: `value` says why),
    "timeout", "crash", "invalid" (the job's reply was not one its kind gives: `value` says why) or "refused" (too big
    to send: `value` says so); `marked` tells whether the job's own part had started; `ended` is why its worker was
    ended after a reply ("" when it was not: it left a thread or process running, or ran on after replying); `fresh`
    is why the job ran in a worker started anew, where no earlier reply said so (a `Session`'s: its earlier jobs'
    state is gone)."""

    how: str
    value: object = None
    marked: bool = False
    ended: str = ""
    fresh: str = ""


class _Worker:
    def __init__(self, cage: _Cage, slot: int):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            cage.spawn([to_child_r, from_child_w], slot)
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
        self.queue: deque = deque()  # the jobs handed to it, in order: the first runs, the next waits in the pipe
        self.marked = self.tainted = self.building = self.spent = False
        self.clock = self.timeout = 0.0

    @property
    def job(self) -> int | None:
        """The job it is running now (its keeper takes the next only once this one's reply is sent)."""
        return self.queue[0] if self.queue else None

    @property
    def waiting(self) -> bool:
        return not self.ready or bool(self.queue)

    def send(self, index: int, payload: bytes, timeout: float) -> None:
        """Hand it a job encoded by `encode` (raises OSError when the worker is gone)."""
        self.outbox.send_bytes(payload)
        self.queue.append(index)
        self.timeout = timeout
        if len(self.queue) == 1:
            self._begin()

    def _begin(self) -> None:
        """The first job in the queue starts now: a slow trusted part is said ("build") and so is its end ("mark");
        until then the pool allows the job's own limit, past which its keeper will have answered."""
        self.marked = self.building = False
        self.clock = time.monotonic()
        self.deadline = self.clock + self.timeout + GRACE_S

    def finish(self) -> int:
        """The running job has ended: its index; the next in the queue starts."""
        index = self.queue.popleft()
        if self.queue:
            self._begin()
        return index

    def take(self, key: str, value, message: dict, counts: "Counts", what: str) -> "Reply | None":
        """What a keeper's message during a job means: None while the job goes on (a slow trusted part began, or
        ended), else how the job ended. `spent` is set when the worker is not to take another."""
        now = time.monotonic()
        if key == "build" and not self.marked and _seconds(value):  # a slow trusted part: the keeper's cap on it
            self.building, self.deadline = True, now + value + GRACE_S
            return None
        if key == "mark" and self.building:  # the job's own time starts now
            self.marked, self.building, self.clock = True, False, now
            self.deadline = now + self.timeout + GRACE_S
            return None
        self.spent = True  # unless a reply below says otherwise
        if key not in FINAL:
            counts.note("crashes", f"{what}: a worker sent what no keeper sends")
            return Reply("crash", None, self.marked)
        self.marked = self.marked or message.get("marked") is True
        if message.get("taint"):  # what the answer's code ran, seen before it ran (runner.py's audit hook)
            counts.last_code = str(message["taint"])[:200]
            self.tainted = True
        if key in ("result", "error", "fail"):
            ended = str(message.get("ended") or "")[:200]
            if ended:
                counts.note("ended", f"{what}: a job's worker was ended after its reply: {ended}")
            self.spent = bool(ended) or self.tainted
            return Reply(key, value, self.marked, ended)
        if key == "timeout":
            counts.timeouts += 1
            return Reply("timeout", None, self.marked)
        if key == "invalid":
            counts.note("invalid", f"{what}: a job's reply was not one its kind gives ({str(value)[:200]}): "
                                   "the job failed, its worker was replaced")
            return Reply("invalid", str(value)[:300], self.marked)
        counts.note("crashes", f"{what}: a job's process died mid-job")
        return Reply("crash", None, self.marked)

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


@dataclass
class Counts:
    """What the pool did since it started, for reports: jobs past their limit, jobs whose worker was replaced
    because the job ran code compiled from its text, jobs refused as too big to send, replies their kind does not
    give, workers ended after a reply (something left running), jobs whose process died. Each but the first two is
    also logged (`grpokit.untrusted`, a warning: the first few, then every 10th, 100th, ...)."""

    timeouts: int = 0
    replaced_after_code: int = 0
    last_code: str = ""  # what the last such job ran, as the worker's audit hook saw it
    refused: int = 0
    invalid: int = 0
    ended: int = 0
    crashes: int = 0

    def note(self, event: str, line: str) -> None:
        seen = getattr(self, event) + 1
        setattr(self, event, seen)
        if seen <= 3 or _power_of_ten(seen):
            _LOG.warning("%s (%d so far)", line, seen)


def _power_of_ten(n: int) -> bool:
    return n >= 10 and str(n).strip("0") == "1"


def _seconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e6


def encode(job, timeout: float) -> bytes:
    """A job as a worker reads it: the job, its time limit, and the CPU backstop the runner sets for it."""
    return json.dumps({"job": job, "timeout": timeout, "cpu_s": max(2, int(3 * timeout) + 1)}).encode()


def refusal(payload: bytes, counts: Counts, what: str) -> "Reply | None":
    """A job too big for a worker to read, refused before it is sent (never resent); None when it fits."""
    if len(payload) <= MAX_JOB_BYTES:
        return None
    counts.note("refused", f"{what}: a job of {len(payload)} bytes was refused, over the {MAX_JOB_BYTES >> 20} MiB "
                           "a worker reads")
    return Reply("refused", f"the job is {len(payload)} bytes, over the {MAX_JOB_BYTES >> 20} MiB a worker reads")


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
