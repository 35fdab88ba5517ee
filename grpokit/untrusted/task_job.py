"""A reasoning-gym scoring job, as the untrusted-work pool's workers run it (`sandbox.pool`; imported in the cage):
rebuild the problem a row's `task_item` names, take the answer from the completion, score it with the task's own
`score_answer`.

A job is {"item": task_item, "text": completion | None, "answer_from": ..., "tag": ...}. Building the problem is
the job's trusted part (`prepare`: the recipe's task and seed, no answer read), timed by the worker's keeper apart
from the job's own limit (PREPARE_S), which counts only the answer's part -- taking it from the text (linear in the
text's length) and the scorer. The worker keeps what it built. A problem that cannot be built raises `Refused` (a
data problem, said as such); a scorer that raises on the answer is the answer's doing (several scorers `eval` it).
The keeper takes a result only as a score: a finite number in [0, 1] (`check`).
"""

from __future__ import annotations

import base64
import json
import pickle
import re

from grpokit.untrusted.keeper import score

ANSWER_FROM = ("tag", "last_line", "last_number", "whole")
_NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")
MAX_ANSWER_CHARS = 10_000  # a longer "answer" is sent to no scorer: it scores as no answer
PREPARE_S = 300.0  # building one problem, at most (a source's generation is bounded at --check: grpokit/taskgen.py)


class Refused(Exception):
    """The job's problem cannot be rebuilt from its task item."""


def extract(completion: str, answer_from: str = "tag", tag: str = "answer") -> str | None:
    """The answer as the prompt asked for it: `tag`, the last `<tag>...</tag>` (as reasoning-gym's own
    `extract_answer` finds it, in time linear in the text's length); `last_line`, the last non-empty line;
    `last_number`, the last number in the text (lenient: for a prompt that asks for "just the number" of a model that
    writes "4 + 5 = 9"); `whole`, the whole completion; stripped, None when there is none.

    >>> extract("<think>2+2</think> <answer> 4 </answer>"), extract("so\\n4\\n\\n", "last_line"), extract("no tag")
    ('4', '4', None)
    >>> extract("4 + 5 = 9.", "last_number"), extract("no number", "last_number")
    ('9', None)
    >>> extract("<answer><answer>5</answer> <answer>6"), extract("<answer>" * 3)
    ('<answer>5', None)
    """
    if answer_from == "tag":
        # reasoning-gym's regex `<tag>(.*?)</tag>` matched left to right, the last match kept: each match opens at
        # the first opening tag past the previous match and closes at the first closing tag after it. Two finds per
        # match, each starting past the last: linear (the regex is quadratic on a text of opening tags alone).
        opening, closing = f"<{tag}>", f"</{tag}>"
        pos, found = 0, None
        while (start := completion.find(opening, pos)) >= 0:
            end = completion.find(closing, start + len(opening))
            if end < 0:
                break
            found, pos = completion[start + len(opening):end], end + len(closing)
        return None if found is None else found.strip()
    if answer_from == "last_number":
        found = _NUMBER.findall(completion)
        return found[-1] if found else None
    if answer_from == "last_line":
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None
    return completion.strip() or None


def warm() -> None:
    """Import reasoning-gym (~2-3 s of CPU) and what several scorers import on first use (sympy's expression parser),
    once, in the zygote: no job pays it inside its time limit."""
    import warnings

    warnings.simplefilter("ignore")
    from grpokit.taskgen import registry
    from sympy.parsing.sympy_parser import parse_expr

    registry()
    parse_expr("1 + 2*x")


KEPT_DATASETS = 16  # datasets a worker keeps (the problems it keeps need theirs to be scored)
_DATASETS: dict = {}  # source key -> dataset, the last few built
_ENTRIES: dict = {}  # (source key, index) -> problem: a problem is scored once per completion of its group


def problem(task_item: str):
    """(dataset, entry) of the problem `task_item` names ({"source": ..., "index": i, "entry": pickled entry}), kept
    once made; `Refused` when it cannot be. The entry is the problem the model was shown (grpokit/taskgen.py `row`);
    an item without one (a dataset written before entries travelled) is rebuilt from its source and index."""
    try:
        item = json.loads(task_item)
        key, index = json.dumps(item["source"], sort_keys=True), int(item["index"])
        # The dataset is kept apart from its entries (it scores them): a kept entry's dataset may have been dropped
        # for newer ones, and is built again.
        if key not in _DATASETS:
            from grpokit.taskgen import build

            _forget_oldest(_DATASETS, KEPT_DATASETS)
            _DATASETS[key] = build(json.loads(key))
        if (key, index) not in _ENTRIES:
            _forget_oldest(_ENTRIES, 4096)
            entry = item.get("entry")
            # The row's own data, made by the task generator from the recipe; unpickled here, in the cage, never in
            # the trainer.
            _ENTRIES[key, index] = pickle.loads(base64.b64decode(entry)) if entry else _DATASETS[key][index]
        return _DATASETS[key], _ENTRIES[key, index]
    except Exception as err:  # noqa: BLE001 - the row's item, or the task's generator, is at fault: said, not scored
        raise Refused(f"cannot rebuild the problem {task_item[:300]}: {type(err).__name__}: {str(err)[:300]}") from None


def _forget_oldest(kept: dict, most: int) -> None:
    while len(kept) >= most:
        del kept[next(iter(kept))]


def prepare(job: dict) -> bool:
    """The job's trusted part: its problem built (or found kept), before the answer is read."""
    problem(job["item"])
    return True


def run(job: dict) -> float:
    dataset, entry = problem(job["item"])  # built by `prepare`
    answer = None if job["text"] is None else extract(job["text"], job["answer_from"], job["tag"])
    if answer is not None and len(answer) > MAX_ANSWER_CHARS:
        answer = None
    return float(dataset.score_answer(answer, entry))


def check(job: dict, value) -> float:
    """The keeper's check of a result: a score."""
    return score(value)
