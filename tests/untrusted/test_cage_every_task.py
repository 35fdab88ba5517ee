"""Every reasoning-gym task grpokit lists, scored on answers that attack: none escapes the cage, none scores.

Several of reasoning-gym's scorers evaluate the answer (`eval`, sympy's `parse_expr`): an answer that runs code runs
it in the scoring worker. Here, for every task, the gold answer and six attacks go through `task_score` in one call:
delete a file of the user's, write outside, open a socket, fork without end, allocate without end, sleep forever. The
gold scores 1.0 (but on the tasks named in GOLD_CANNOT_SCORE), every attack scores what its text earns as text (0,
or the task's own partial credit: what the task pays a nonsense answer, or a sliver), the call ends (each job within its limit), and nothing outside changed: the file is
there, nothing was written, no connection came, and no process is left in the cage but its workers.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
from helpers import cage_processes

import rewards
from grpokit import taskgen
from grpokit.prompts import tasks
from grpokit.untrusted.pool import shared
from rewards.tasks import SCORERS

# Tasks whose problems carry no gold answer (their scorer checks a solution; there are many): --check says so.
GOLD_CANNOT_SCORE = {"boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour"}
# Tasks whose own scorer pays a text that answers nothing (game_of_life_halting compares bool(answer) with
# bool(gold), and every non-empty text is True): --check says so.
PAYS_ANY_TEXT = {"game_of_life_halting"}
NONSENSE = "I do not know"
NOT_A_TASK = {"composite"}  # a mix of tasks, listed by reasoning-gym with the tasks


def attacks(victim: str, outside: str, port: int) -> dict[str, str]:
    run = "__import__('builtins').exec({!r}) or 1".format
    return {
        "delete": run(f"import os; os.remove({victim!r})"),
        "write outside": run(f"open({outside!r}, 'w').write('x')"),
        "socket": run(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5)"),
        "fork without end": run("import os\nwhile True: os.fork()"),
        "allocate without end": run("x = []\nwhile True: x.append(' ' * (1 << 24))"),
        "sleep forever": run("import time; time.sleep(10 ** 6)"),
    }


def first_problems(names: list[str]) -> list[tuple[str, str | None]]:
    """(task_item, gold answer) of each task's first problem at its default config, made as a run makes them (in the
    bounded child, all tasks in one: a child per task would take minutes)."""
    parts = []
    for name in names:
        source, problems = tasks.check_source({"tasks": [{"name": name}], "size": 1, "seed": 1})
        assert not problems, (name, problems)
        parts.append({key: source[key] for key in ("tasks", "size", "seed")})
    made = taskgen.produce(parts)
    return [(json.dumps({"source": part, "index": 0, "entry": rows[0][3]}, sort_keys=True), rows[0][1])
            for part, rows in zip(parts, made)]


def test_every_task_scores_its_gold_and_no_attack(tmp_path):
    names = sorted(set(tasks.registry()) - NOT_A_TASK)
    victim, outside = tmp_path / "thesis.tex", tmp_path / "written"
    victim.write_text("years of work")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    texts = attacks(str(victim), str(outside), listener.getsockname()[1])
    completions, items, what = [], [], []
    for name, (item, gold) in zip(names, first_problems(names)):
        for kind, text in [("gold", gold), ("nonsense", NONSENSE), *texts.items()]:
            completions.append(f"<answer>{text}</answer>")
            items.append(item)
            what.append((name, kind))
    reward = rewards.build("task_score", timeout=1.0)
    scores = reward(completions=completions, task_item=items)
    by = dict(zip(what, scores))
    gold_failed = {name: by[name, "gold"] for name in names if by[name, "gold"] != 1.0}
    assert set(gold_failed) == GOLD_CANNOT_SCORE, (gold_failed, reward.fn.last.timeouts)
    assert {name for name in names if by[name, "nonsense"] >= 0.5} == PAYS_ANY_TEXT
    # An attack earns what its text earns as text: at most what the task pays any text, or a sliver of partial credit.
    scored = {key: score for key, score in by.items() if key[1] in texts and score > max(0.1, by[key[0], "nonsense"])}
    assert not scored, scored
    assert victim.read_text() == "years of work" and not outside.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()
    # Nothing left running: a keeper per worker, each with its worker alone (the workers that ran an attack were
    # replaced, and their pid namespaces went with them; the kernel tears a namespace down, and the zygote reaps
    # what exited, within a moment: polled, not timed).
    pool = shared(SCORERS, 2)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not settled(pool):
        time.sleep(0.1)
    assert settled(pool), (cage_processes(pool, depth=3), cage_processes(pool, depth=4), cage_processes(pool, depth=5))


def settled(pool) -> bool:
    keepers, workers = cage_processes(pool, depth=3), cage_processes(pool, depth=4)
    return len(keepers) == len(workers) == len(pool._workers) and not cage_processes(pool, depth=5)
