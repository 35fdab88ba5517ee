"""Rewards for reasoning-gym's procedural tasks (a recipe's `dataset.reasoning_gym`, see grpokit/prompts/tasks.py)."""

from __future__ import annotations

import math
import re

from rewards import is_integer, is_number, register, text
from grpokit.untrusted.pool import Kind, shared
from grpokit.untrusted.task_job import ANSWER_FROM, extract

__all__ = ["ANSWER_FROM", "TaskScore", "extract", "SCORERS"]

SCORERS = Kind("grpokit.untrusted.task_job", "task scorer", "import reasoning_gym")
MAX_COMPLETION_CHARS = 2_000_000  # a longer completion is sent to no scorer: it is scored as having no answer


NAME = "task_score"


@register(NAME)
class TaskScore:
    """The reasoning-gym task's own score_answer of the extracted answer (its partial credit kept); None without a task.

    r = score_answer(extract(completion), problem)

    For data from `dataset.reasoning_gym`: each row's `task_item` names its problem, which is rebuilt and scored by
    the task's own `score_answer` (1.0 right, 0.0 wrong, and what the task gives between: the gold inside a longer
    answer earns len(gold)/len(answer) by reasoning-gym's default scorer, countdown gives 0.05 to an expression that
    is not a solution and 0.01 to none). The answer is taken as the prompt asks for it (`answer_from`: `tag`, the last
    `<answer>...</answer>`, as reasoning-gym's prompts ask; `last_line`; `last_number`; `whole`); a completion without one is scored
    as the task scores no answer (None given to score_answer: 0.0 for the tasks shipped in recipes, 0.01 for
    countdown). Scoring runs in `workers` caged processes (grpokit/untrusted/pool.py: no network, no files
    of yours, bounded memory and processes; several scorers `eval` the answer), each completion within `timeout` seconds from its problem being built
    (killed past it: 0.0), taking the answer included. A scorer that raises on an answer scores it 0.0: the answer
    is the policy's. A row without a task item scores None, which TRL skips; a problem that cannot be rebuilt stops
    the run, naming this reward and the sample. `last` counts the last call's timeouts and scorer errors; in a run
    both are logged at every step (`task_score/timeouts`, `task_score/scorer_errors`, beside `task_score/limit_s`),
    and report.md says them.

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
        pool = shared(SCORERS, self.workers)
        if not self._started:
            pool.start()
            self._started = True
        out: list = [None] * len(completions)
        jobs: dict[tuple[str, str | None], list[int]] = {}  # a group often repeats one completion: scored once
        for i, (completion, item) in enumerate(zip(completions, task_item)):
            if item:
                whole = text(completion)
                jobs.setdefault((item, whole if len(whole) <= MAX_COMPLETION_CHARS else None), []).append(i)
        replies = pool.run([{"item": item, "text": whole, "answer_from": self.answer_from, "tag": self.tag}
                            for item, whole in jobs], self.timeout)
        self.last = Tally()
        for samples, reply in zip(jobs.values(), replies):
            if reply.how == "fail":  # the row's problem cannot be rebuilt: the data's fault, not the answer's
                raise ValueError(f"the task's problem: {reply.value}")
            score = reply.value if reply.how == "result" and _is_score(reply.value) else 0.0
            self.last.count(reply, len(samples))
            for i in samples:
                out[i] = score
        log_metric = kwargs.get("log_metric")  # TRL's, for a reward's own figures beside its mean
        if callable(log_metric):
            log_metric(f"{NAME}/limit_s", self.timeout)
            log_metric(f"{NAME}/timeouts", float(self.last.timeouts))
            log_metric(f"{NAME}/scorer_errors", float(self.last.scorer_errors))
            log_metric(f"{NAME}/refused", float(self.last.refused))
        return out


def _is_score(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class Tally:
    """What the last call's scoring did beyond a score: completions past the time limit (or whose scoring process
    died), those whose scorer raised on the answer or replied with what no score is (scored 0.0: several scorers
    `eval` the answer, and the answer is the policy's), and those too big to send to a scorer (0.0)."""

    def __init__(self):
        self.timeouts = self.scorer_errors = self.refused = 0

    def count(self, reply, n: int) -> None:
        if reply.how in ("timeout", "crash"):
            self.timeouts += n
        elif reply.how in ("error", "invalid") or (reply.how == "result" and not _is_score(reply.value)):
            self.scorer_errors += n
        elif reply.how == "refused":
            self.refused += n


NONSENSE = "I do not know"  # what the audit offers as an answer that answers nothing


def audit(reward: TaskScore, rows: list[dict], per_task: int = 4) -> dict[str, dict]:
    """How the tasks' own scorers treat their own problems, as `reward` reads answers: per task, of up to `per_task`
    rows, how many have a gold answer, how many golds score 1.0 written as the prompt asks, and the most a nonsense
    answer scored. For --check (the lint's task-gold-cannot-score and task-pays-any-text): a task whose gold cannot
    score 1.0, or whose scorer pays any text, teaches nothing. Scored in the cage, like any answer.

    >>> audit(TaskScore(), [])
    {}
    """
    picked: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("task_item") and len(picked.setdefault(row.get("task") or "?", [])) < per_task:
            picked[row.get("task") or "?"].append(row)
    completions, items, whose = [], [], []
    for task, chosen in picked.items():
        for row in chosen:
            for kind, text in (("gold", row.get("answer")), ("nonsense", NONSENSE)):
                if text is None:
                    continue
                wrapped = f"<{reward.tag}>{text}</{reward.tag}>" if reward.answer_from == "tag" else str(text)
                completions.append(wrapped)
                items.append(row["task_item"])
                whose.append((task, kind))
    scores = reward(completions=completions, task_item=items) if completions else []
    found = {task: {"checked": len(chosen), "gold": sum(r.get("answer") is not None for r in chosen), "gold_full": 0,
                    "nonsense": 0.0} for task, chosen in picked.items()}
    for (task, kind), score in zip(whose, scores):
        if kind == "gold":
            found[task]["gold_full"] += score == 1.0
        else:
            found[task]["nonsense"] = max(found[task]["nonsense"], score or 0.0)
    return found

