"""Making a reasoning-gym source's problems, bounded: in a child process with a time and a memory limit.

A task's config can ask for problems that never finish (chain_sum with 10^8 terms, game_of_life with 10^6 steps) or
that fill the machine's memory (a 10^5 x 10^5 grid), and the task accepts it: its `validate()` states ranges, not
costs. So the problems are made in a fresh `python -c` process (nothing is forked from a process that may hold
torch's threads) whose address space is capped at `MEMORY_BYTES` (or a lower hard limit it inherits, `ulimit -v`:
never raised) and which this process kills past either time
bound: `PROBLEM_S` for any one problem, `TOTAL_S` for all of them (training and held-out together, refused early
once the pace of the first `PACE_AFTER_S` seconds shows the whole set would take longer). Past a bound, `Expensive`
says which bound, at which problem, and the config keys set furthest above their defaults: the ones that make it
expensive. The child's start (importing reasoning-gym, ~4 s) is not charged to the bounds.

A leaf beside `grpokit.prompts.tasks`, which imports it: this module imports nothing of grpokit's but itself in the child.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings
import weakref
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path

PROBLEM_S = 60.0  # knight_swap, the slowest task at its defaults, took up to 12 s for one problem on 2 loaded cores
TOTAL_S = 600.0  # --check and every run generate the whole set first: ten minutes is as long as a user should wait
PACE_AFTER_S = 10.0  # the pace is judged once this much of the set's time has passed (past the first slow builds)
MEMORY_BYTES = 4 * 2**30  # address space of the child; the tasks at their defaults peak under 200 MB
# One problem as a row keeps it (question and pickled entry): it travels with every completion to the scorer's cage,
# whose job bound is 8 MiB (grpokit/untrusted/runner.py); the tasks at their defaults make a few KB.
ROW_BYTES = 1 << 20
STARTUP_S = 120.0  # importing reasoning-gym on a loaded 2-core box takes seconds, not minutes
BATCH_S = 0.25  # the child sends what it made at least this often, so the parent's clock stays per problem
_ROOT = str(Path(__file__).resolve().parent.parent)
_CODE = ("import sys; sys.path.insert(0, sys.argv[1]); from grpokit.taskgen import serve; "
         "serve(int(sys.argv[2]), int(sys.argv[3]))")


def registry() -> dict:
    """reasoning-gym's tasks: name -> (dataset class, config dataclass)."""
    with warnings.catch_warnings():  # a dependency of reasoning-gym (cellpylib) has `is` literals Python warns about
        warnings.simplefilter("ignore", SyntaxWarning)
        from reasoning_gym.factory import DATASETS
    return DATASETS


def build(source: dict):
    """The reasoning-gym dataset `source` names ({tasks, size, seed}): the task itself, or a `composite` of the mix.
    Unbounded: `produce` is the bounded way to make a whole set.

    >>> build({"tasks": [{"name": "chain_sum", "weight": 1.0, "config": {}}], "size": 2, "seed": 1})[0]["answer"]
    '-4'
    """
    import reasoning_gym

    registry()
    tasks = source["tasks"]
    if len(tasks) == 1:
        return reasoning_gym.create_dataset(tasks[0]["name"], size=source["size"], seed=source["seed"], **tasks[0]["config"])
    from reasoning_gym.composite import DatasetSpec

    specs = [DatasetSpec(t["name"], t["weight"], dict(t["config"])) for t in tasks]
    return reasoning_gym.create_dataset("composite", size=source["size"], seed=source["seed"], datasets=specs)


def row(entry: dict, default_task: str) -> tuple:
    """What a source keeps of a reasoning-gym entry: (question, answer as text or None, the task that made it, the
    whole entry pickled as base64 text). The entry travels with the row to the scorer's cage, which unpickles it
    there: a problem rebuilt in another process can be another problem (polynomial_multiplication iterates a set of
    sympy terms, whose order follows object addresses), so the problem scored is the one made here, the one shown."""
    answer = entry.get("answer")
    return (entry["question"], None if answer is None else str(answer),
            entry.get("metadata", {}).get("source_dataset", default_task),
            base64.b64encode(pickle.dumps(entry, protocol=4)).decode("ascii"))


class Expensive(Exception):
    """A part could not be made within a bound. `bound`: "problem", "total", "memory" or "row"; `part` and `index`: where;
    `what`: the sentence that says it."""

    def __init__(self, bound: str, part: int, index: int, what: str):
        super().__init__(what)
        self.bound, self.part, self.index, self.what = bound, part, index, what


class Failed(Exception):
    """The task raised while making a problem: `part`, `index`, and the task's own "Type: message"."""

    def __init__(self, part: int, index: int, shown: str):
        super().__init__(shown)
        self.part, self.index, self.shown = part, index, shown


class Died(Exception):
    """The child making the problems died mid-part, without saying why: `part`, `index`, and what is known of it
    (its exit status, the last line it printed), never a guess at the cause."""

    def __init__(self, part: int, index: int, what: str):
        super().__init__(what)
        self.part, self.index, self.what = part, index, what


def memory_bound() -> int:
    """The child's address-space bound: MEMORY_BYTES, or this process's hard limit (`ulimit -v`, which the child
    inherits and no process may raise) where that is lower."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    return MEMORY_BYTES if hard == resource.RLIM_INFINITY else min(MEMORY_BYTES, hard)


def bounds() -> str:
    """The bounds in words, as messages and docs state them."""
    memory = memory_bound()
    held = "" if memory == MEMORY_BYTES else (f" (this process's hard address-space limit, `ulimit -v`; grpokit's own "
                                              f"bound is {_gib(MEMORY_BYTES)})")
    return (f"each problem within {PROBLEM_S:.0f} s and {_kib(ROW_BYTES)}, all of them (size + eval_size) "
            f"within {TOTAL_S / 60:.0f} min, in {_gib(memory)} of memory{held}")


def _kib(n: int) -> str:
    """Bytes as messages say a problem's size: '1 MiB', '100 KiB'."""
    return f"{n / 2**20:g} MiB" if n >= 2**20 else f"{n / 2**10:g} KiB"


def _gib(n: int) -> str:
    """Bytes in GiB as messages say them: '4 GiB', '5.6 GiB'."""
    return f"{n / 2**30:.1f}".removesuffix(".0") + " GiB"


class Producer:
    """A child process that imports reasoning-gym at once, then makes the parts `collect` sends it ({tasks, size,
    seed} each) within the bounds. Started early (`warm`), its import (~4 s) overlaps the caller's own work; one never
    used is stopped when Python collects it, or at exit, and ends by itself when this process goes."""

    def __init__(self):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # one thread each for numpy's libraries: a pool of threads reserves address space the memory bound would count
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        # What it prints is not shown: what it has to say comes over the pipe, never as a traceback. Its stderr is
        # kept, for its last line should it die without a word.
        self.log = tempfile.TemporaryFile()
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", _CODE, _ROOT, str(to_child_r), str(from_child_w)],
                                         pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.inbox = Connection(from_child_r, writable=False)
        self._finalizer = weakref.finalize(self, _stop, self.proc, self.outbox, self.inbox)

    def collect(self, parts: list[dict]) -> list[list[tuple]]:
        """The rows (`row`) of each part. Raises `Expensive` past a bound, `Failed` when the task raises,
        RuntimeError when the child cannot start."""
        try:
            try:
                self.outbox.send((parts, memory_bound(), int(STARTUP_S + TOTAL_S) + 60, ROW_BYTES))
            except OSError:  # it died before it was asked: said as a start that failed, below
                pass
            return _collect(self.inbox, self.proc, parts, self.last_words)
        finally:
            self._finalizer()
            self.log.close()

    def last_words(self) -> str:
        """The last line the child printed to stderr, or ""."""
        try:
            self.log.seek(0, os.SEEK_END)
            self.log.seek(max(0, self.log.tell() - 2000))
            lines = self.log.read().decode(errors="replace").strip().splitlines()
        except (OSError, ValueError):
            return ""
        return lines[-1].strip()[:300] if lines else ""


def _stop(proc, outbox: Connection, inbox: Connection) -> None:
    for conn in (outbox, inbox):
        conn.close()
    if proc.poll() is None:
        proc.kill()
    proc.wait()


_WARM: list[Producer] = []  # at most one producer started ahead of need


def warm() -> None:
    """Start a producer now, so that its import of reasoning-gym runs beside the caller's own work (the recipe's
    validation, which imports reasoning-gym too, and the tokenizer's loading); `produce` takes it."""
    if not _WARM:
        _WARM.append(Producer())


def produce(parts: list[dict]) -> list[list[tuple]]:
    """The rows of each part, made in a bounded child process: the warm producer, or a new one."""
    return (_WARM.pop() if _WARM else Producer()).collect(parts)


def ended(code: int | None, said: str) -> str:
    """How a process ended, as facts: 'exit code 3' or 'killed by SIGKILL', then the last line it printed.

    >>> ended(-9, ""), ended(1, "MemoryError")
    ('killed by SIGKILL', "exit code 1; the last line it printed: 'MemoryError'")
    """
    import signal

    if code is not None and code < 0:
        try:
            how = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exit code {code}"
    return how + (f"; the last line it printed: {said!r}" if said else "")


def _collect(inbox: Connection, proc, parts: list[dict], said=lambda: "") -> list[list[tuple]]:
    rows: list[list[tuple]] = [[] for _ in parts]
    total = sum(p["size"] for p in parts)
    deadline = time.monotonic() + STARTUP_S
    start = last = None
    while True:
        now = time.monotonic()
        if start is not None:
            deadline = min(last + PROBLEM_S, start + TOTAL_S)
        if not inbox.poll(max(0.0, deadline - now)):
            if start is None:
                raise RuntimeError(f"the process making reasoning-gym's problems did not start within {STARTUP_S:.0f} s")
            part, index = _where(rows, parts)
            if last + PROBLEM_S <= start + TOTAL_S:
                raise Expensive("problem", part, index, f"made no problem in {PROBLEM_S:.0f} s")
            raise Expensive("total", part, index, f"did not make its {total:,} problems in {TOTAL_S / 60:.0f} min "
                            f"({sum(map(len, rows)):,} made)")
        try:
            message = inbox.recv()
        except (EOFError, OSError):
            how = ended(proc.wait(), said())
            part, index = _where(rows, parts)
            if start is None:
                raise RuntimeError(f"the process making reasoning-gym's problems exited at start ({how}); "
                                   "check that `python -c 'import reasoning_gym'` works in this environment") from None
            raise Died(part, index, how) from None
        kind = message[0]
        if kind == "ready":
            start = last = time.monotonic()
        elif kind == "rows":
            rows[message[1]].extend(message[2])
            last = time.monotonic()
            made, elapsed = sum(map(len, rows)), last - start
            if elapsed >= PACE_AFTER_S and made < total and elapsed * total / made > TOTAL_S:
                part, index = _where(rows, parts)
                raise Expensive("total", part, index, f"made {made:,} problems in {elapsed:.0f} s ({elapsed / made:.2f} s "
                                f"each): all {total:,} would take ~{elapsed * total / made / 60:.0f} min, past "
                                f"{TOTAL_S / 60:.0f} min")
        elif kind == "big":
            raise Expensive("row", message[1], message[2], f"made a problem of {message[3]:,} bytes, over the "
                            f"{_kib(ROW_BYTES)} one problem may hold (it travels with every completion to the scorer)")
        elif kind == "memory":
            raise Expensive("memory", message[1], message[2], f"needed more than {_gib(message[3])} of memory")
        elif kind == "error":
            raise Failed(message[1], message[2], message[3])
        elif kind == "done":
            return rows


def _where(rows: list[list], parts: list[dict]) -> tuple[int, int]:
    """(part, index) of the problem being made: the first part not yet whole, and how many of it are made."""
    for i, (made, part) in enumerate(zip(rows, parts)):
        if len(made) < part["size"]:
            return i, len(made)
    return len(parts) - 1, parts[-1]["size"]


def serve(read_fd: int, write_fd: int) -> None:
    """The child: import reasoning-gym, say ready, wait for the parts, cap its memory and CPU, make every part's
    problems in batches, say done. Ends when its parent goes (a closed pipe), or by the kernel's CPU limit should the
    parent be killed mid-problem."""
    import resource

    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    warnings.simplefilter("ignore")
    registry()
    outbox.send(("ready",))
    try:
        parts, memory_bytes, cpu_s, row_bytes = inbox.recv()
    except (EOFError, OSError):  # warmed, never used
        return
    # Soft limits within the hard ones it inherited (a cluster's `ulimit -v`): a hard limit is never raised.
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    memory_bytes = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, hard))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(usage.ru_utime + usage.ru_stime) + cpu_s
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu if hard == resource.RLIM_INFINITY else min(cpu, hard), hard))
    for p, part in enumerate(parts):
        i, batch, sent = 0, [], time.monotonic()
        try:
            ds = build(part)
            for i in range(part["size"]):
                made = row(ds[i], part["tasks"][0]["name"])
                size = len(made[0]) + len(made[3])
                if size > row_bytes:
                    outbox.send(("big", p, i, size))
                    return
                batch.append(made)
                if time.monotonic() - sent >= BATCH_S or len(batch) >= 1000:
                    outbox.send(("rows", p, batch))
                    batch, sent = [], time.monotonic()
        except MemoryError:
            batch = None
            outbox.send(("memory", p, i, memory_bytes))
            return
        except Exception as err:  # noqa: BLE001 - a config the task accepted but cannot generate from: said by the parent
            outbox.send(("error", p, i, f"{type(err).__name__}: {str(err)[:200]}"))
            return
        if batch:
            outbox.send(("rows", p, batch))
    outbox.send(("done",))


def expensive_keys(tasks: list[dict]) -> list[tuple[str, int, str, float]]:
    """The numeric config keys set above their task's default, furthest first: (task, its position, key, times its
    default). The cost of a task grows with such a key (terms, steps, grid sides), so the first is the one to blame.

    >>> expensive_keys([{"name": "chain_sum", "config": {"max_terms": 600, "min_digits": 1}}])
    [('chain_sum', 0, 'max_terms', 100.0)]
    """
    known, found = registry(), []
    for position, task in enumerate(tasks):
        defaults = {f.name: f.default for f in fields(known[task["name"]][1])}
        for key, value in task.get("config", {}).items():
            default = defaults.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or isinstance(default, bool) \
                    or not isinstance(default, (int, float)):
                continue
            times = value / default if default > 0 else float(value)
            if times > 1:
                found.append((task["name"], position, key, float(times)))
    return sorted(found, key=lambda k: -k[3])


@dataclass(frozen=True)
class Blame:
    path: str  # the key path a message names
    value: object
    why: str  # what makes it expensive, in words


def blame(tasks: list[dict], bound: str, key: str) -> Blame:
    """What a refusal past `bound` names under the source `key`: the config key furthest above its default, else (all
    at defaults) the size when the whole set is too slow, else the task's config itself."""
    found = expensive_keys(tasks)
    if found:
        name, position, config_key, times = found[0]
        others = ", ".join(f"{n}.{k}" if len(tasks) > 1 else k for n, _, k, _ in found[1:4])
        default = {f.name: f.default for f in fields(registry()[name][1])}[config_key]
        return Blame(f"{key}.tasks[{position}].config.{config_key}", tasks[position]["config"][config_key],
                     f"{config_key} is {times:,.0f}x its default ({default}), the value that makes it expensive"
                     + (f" (also past their defaults: {others})" if others else ""))
    if bound == "total":
        return Blame(f"{key}.size", None, "every config key is at most its default: the number of problems makes it "
                     "expensive")
    return Blame(f"{key}.tasks", [t["name"] for t in tasks], "every config key is at most its default: the task itself "
                 "is this expensive")
