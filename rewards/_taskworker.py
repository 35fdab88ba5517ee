"""What runs in a task-scorer process (`rewards._taskpool`): rebuild a reasoning-gym problem from its `task_item` and
score an answer with the task's own `score_answer`.

Protocol, pickled tuples over two pipes:
    worker -> pool   ("ready", pid) once, when reasoning-gym is imported
    pool -> worker   (task_item, answer | None, cpu_limit_s)
    worker -> pool   ("score", float) or ("error", "TypeName: message") when the scorer raises
"""

from __future__ import annotations

import functools
import json
import os
from multiprocessing.connection import Connection


@functools.lru_cache(maxsize=16)
def _dataset(source_key: str):
    from grpokit.tasks import build

    return build(json.loads(source_key))


@functools.lru_cache(maxsize=4096)  # a problem is scored once per completion of its group
def _problem(source_key: str, index: int):
    return _dataset(source_key)[index]


def score(task_item: str, answer: str | None) -> float:
    """The task's own score of `answer` for the problem `task_item` names ({"source": ..., "index": i})."""
    item = json.loads(task_item)
    key = json.dumps(item["source"], sort_keys=True)
    return float(_dataset(key).score_answer(answer, _problem(key, int(item["index"]))))


def serve(read_fd: int, write_fd: int) -> None:
    """The worker's loop: score each job, answer; exit when the pool closes the pipe."""
    from grpokit.tasks import registry

    registry()  # import reasoning-gym before saying ready, so a job's time is the scorer's own
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    outbox.send(("ready", os.getpid()))
    while True:
        try:
            task_item, answer, cpu_limit_s = inbox.recv()
        except (EOFError, OSError):
            return
        _limit_cpu(cpu_limit_s)
        try:
            outbox.send(("score", score(task_item, answer)))
        except Exception as err:  # noqa: BLE001 - the reward names the scorer's failure, with its sample
            try:
                shown = f"{type(err).__name__}: {err}"
            except Exception:  # noqa: BLE001
                shown = type(err).__name__
            outbox.send(("error", shown[:500]))


def _limit_cpu(seconds: int) -> None:
    """The kernel kills this worker if one job burns `seconds` more CPU: the backstop should the pool that would kill
    it be gone (a scorer stuck in a loop must not spin on, orphaned)."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(usage.ru_utime + usage.ru_stime) + seconds
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    except (ImportError, ValueError, OSError):
        pass
