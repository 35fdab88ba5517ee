"""Rewards for reasoning-gym's procedural tasks (a recipe's `dataset.reasoning_gym`, see grpokit/tasks.py)."""

from __future__ import annotations

import re

from rewards import is_integer, is_number, register, text
from rewards._taskpool import ScorerFailure, shared_pool

ANSWER_FROM = ("tag", "last_line", "last_number", "whole")
_NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")
MAX_ANSWER_CHARS = 10_000  # a longer "answer" is sent to no scorer: it scores as no answer


def extract(completion: str, answer_from: str = "tag", tag: str = "answer") -> str | None:
    """The answer as the prompt asked for it: `tag`, the last `<tag>...</tag>` (reasoning-gym's own `extract_answer`);
    `last_line`, the last non-empty line; `last_number`, the last number in the text (lenient: for a prompt that asks
    for "just the number" of a model that writes "4 + 5 = 9"); `whole`, the whole completion; stripped, None when
    there is none.

    >>> extract("<think>2+2</think> <answer> 4 </answer>"), extract("so\\n4\\n\\n", "last_line"), extract("no tag")
    ('4', '4', None)
    >>> extract("4 + 5 = 9.", "last_number"), extract("no number", "last_number")
    ('9', None)
    """
    if answer_from == "tag":
        from reasoning_gym.utils import extract_answer

        return extract_answer(completion, tag_name=re.escape(tag))
    if answer_from == "last_number":
        found = _NUMBER.findall(completion)
        return found[-1] if found else None
    if answer_from == "last_line":
        lines = [line.strip() for line in completion.splitlines() if line.strip()]
        return lines[-1] if lines else None
    return completion.strip() or None


@register("task_score")
class TaskScore:
    """The reasoning-gym task's own score_answer of the extracted answer (its partial credit kept); None without a task.

    r = score_answer(extract(completion), problem)

    For data from `dataset.reasoning_gym`: each row's `task_item` names its problem, which is rebuilt and scored by
    the task's own `score_answer` (1.0 right, 0.0 wrong, and what the task gives between: the gold inside a longer
    answer earns len(gold)/len(answer) by reasoning-gym's default scorer, countdown gives 0.05 to an expression that
    is not a solution and 0.01 to none). The answer is taken as the prompt asks for it (`answer_from`: `tag`, the last
    `<answer>...</answer>`, as reasoning-gym's prompts ask; `last_line`; `last_number`; `whole`); a completion without one is scored
    as the task scores no answer (None given to score_answer: 0.0 for the tasks shipped in recipes, 0.01 for
    countdown). Scoring runs in
    `workers` processes, each completion within `timeout` seconds (killed past it: 0.0). A row without a task item
    scores None, which TRL skips. A scorer that raises stops the run, naming this reward and the sample.

    >>> TaskScore()(completions=["<answer>8</answer>"], task_item=[None])
    [None]
    """

    def __init__(self, answer_from: str = "tag", tag: str = "answer", timeout: float = 2.0, workers: int = 2):
        if answer_from not in ANSWER_FROM:
            raise ValueError(f"answer_from must be one of {', '.join(ANSWER_FROM)}, got {answer_from!r}")
        if not isinstance(tag, str) or not re.fullmatch(r"[A-Za-z_][\w-]*", tag):
            raise ValueError(f"tag must be a tag name such as 'answer' (letters, digits, _ and -), got {tag!r}")
        if not is_number(timeout) or not 0 < timeout <= 60:
            raise ValueError(f"timeout must be a number of seconds in (0, 60], got {timeout!r}")
        if not is_integer(workers) or not 1 <= workers <= 64:
            raise ValueError(f"workers must be an integer in [1, 64], got {workers!r}")
        self.answer_from, self.tag, self.timeout, self.workers = answer_from, tag, float(timeout), workers
        self._started = False  # no process here: instances pickle, and --check builds every reward

    def __getstate__(self):
        return {**self.__dict__, "_started": False}

    def __call__(self, completions, task_item, **kwargs) -> list[float | None]:
        if len(task_item) != len(completions):
            raise ValueError(f"got {len(completions)} completions but {len(task_item)} values of 'task_item'")
        if not self._started:
            shared_pool(self.workers).start()
            self._started = True
        out: list = [None] * len(completions)
        jobs: dict[tuple[str, str | None], list[int]] = {}  # a group often repeats one answer: scored once
        for i, (completion, item) in enumerate(zip(completions, task_item)):
            if not item:
                continue
            answer = extract(text(completion), self.answer_from, self.tag)
            if answer is not None and len(answer) > MAX_ANSWER_CHARS:
                answer = None
            jobs.setdefault((item, answer), []).append(i)
        scores = shared_pool(self.workers).run(list(jobs), self.timeout)
        for samples, score in zip(jobs.values(), scores):
            if isinstance(score, ScorerFailure):
                raise ValueError(f"the task's score_answer raised {score}")
            for i in samples:
                out[i] = score
        return out
