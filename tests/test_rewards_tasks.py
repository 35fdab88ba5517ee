"""`task_score`: a reasoning-gym task's own score_answer of the answer the prompt asked for, bounded in time."""

from __future__ import annotations

import pickle
import time

import pytest

import rewards
from grpokit import tasks
from rewards._taskpool import shared_pool


def item(name: str, config: dict | None = None, index: int = 0, size: int = 8) -> tuple[str, str]:
    """(task_item, gold answer) of problem `index` of a task, as the task source writes them."""
    src, problems = tasks.check_source({"tasks": [{"name": name, "config": config or {}}], "size": size, "seed": 1})
    assert not problems
    row = tasks.generate(src).rows[index]
    return row["task_item"], row["answer"]


LEGS, LEGS_GOLD = item("leg_counting", {"min_animals": 1, "max_animals": 1})
CHAIN, CHAIN_GOLD = item("chain_sum")
COUNTDOWN, COUNTDOWN_GOLD = item("countdown", {"min_numbers": 3, "max_numbers": 3}, size=2)


def score(completion, task_item, **args):
    return rewards.build("task_score", **args)(completions=[completion], task_item=[task_item])[0]


# (completion, task_item, reward args, expected score)
CASES = [
    # the right answer in the tags reasoning-gym's prompts ask for
    (f"<think>count</think><answer>{LEGS_GOLD}</answer>", LEGS, {}, 1.0),
    # the last tagged answer counts: a model that corrects itself is scored on its correction
    (f"<answer>1</answer> no: <answer>{LEGS_GOLD}</answer>", LEGS, {}, 1.0),
    # a wrong answer
    ("<answer>1</answer>", LEGS, {}, 0.0),
    # a missing answer: no tag, so None goes to the task's scorer, which gives no credit
    (f"it is {LEGS_GOLD}", LEGS, {}, 0.0),
    # partial credit, the task's own: reasoning-gym's default scorer pays len(gold)/len(answer) for the gold inside
    (f"<answer>{LEGS_GOLD} legs</answer>", LEGS, {}, len(LEGS_GOLD) / len(f"{LEGS_GOLD} legs")),
    # partial credit of another kind: countdown pays 0.05 for an expression that is not a solution
    ("<answer>1 + 1</answer>", COUNTDOWN, {}, 0.05),
    # ... and 0.01 for no answer at all: a missing answer is scored as the task scores one
    ("I cannot", COUNTDOWN, {}, 0.01),
    # countdown's gold is a solution: full credit
    (f"<answer>{COUNTDOWN_GOLD}</answer>", COUNTDOWN, {}, 1.0),
    # chain_sum's own scorer compares decimals: "+0x.00" is the gold number
    (f"<answer>{float(CHAIN_GOLD):+.2f}</answer>", CHAIN, {}, 1.0),
    # another tag, when the prompt asks for one
    (f"<final>{LEGS_GOLD}</final>", LEGS, {"tag": "final"}, 1.0),
    # the last non-empty line, for a prompt that asks for the answer on the last line
    (f"reasoning\n{LEGS_GOLD}\n\n", LEGS, {"answer_from": "last_line"}, 1.0),
    # the last number, for "answer with just the number" to a model that writes the sum out
    (f"2 x 7 = {LEGS_GOLD}.", LEGS, {"answer_from": "last_number"}, 1.0),
    # the whole completion, which must then be the answer alone
    (f" {LEGS_GOLD}\n", LEGS, {"answer_from": "whole"}, 1.0),
    (f"{LEGS_GOLD} legs", LEGS, {"answer_from": "whole"}, len(LEGS_GOLD) / len(f"{LEGS_GOLD} legs")),
    # a row that is not a task's problem: None, which TRL skips
    (f"<answer>{LEGS_GOLD}</answer>", None, {}, None),
    # a chat completion is scored by its text
    ([{"role": "assistant", "content": f"<answer>{LEGS_GOLD}</answer>"}], LEGS, {}, 1.0),
]


@pytest.mark.parametrize("completion, task_item, args, expected", CASES)
def test_score(completion, task_item, args, expected):
    assert score(completion, task_item, **args) == pytest.approx(expected) if expected is not None else score(
        completion, task_item, **args) is None


def test_a_scorer_past_its_time_is_killed_and_scores_zero():
    # countdown with six numbers solves its own problem before scoring (~100 ms): far past a 1 ms limit
    slow, _ = item("countdown", {"min_numbers": 6, "max_numbers": 6}, size=1)
    pool = shared_pool(2)
    pool.start()
    reward = rewards.build("task_score", timeout=0.001)
    # both workers up and ready, given the time: the next call times the scorer alone
    rewards.build("task_score")(completions=["<answer>1</answer>", "<answer>2</answer>"], task_item=[LEGS, LEGS])
    before = set(pool.pids())
    start = time.monotonic()
    assert reward(completions=["<answer>1 + 2</answer>"], task_item=[slow]) == [0.0]  # in time it earns 0.05 (below)
    assert time.monotonic() - start < 1.0  # not the scorer's own time
    assert set(pool.pids()) != before or len(pool.pids()) < len(before)  # the worker that ran it is gone
    # and the pool goes on: the next calls are scored, the slow problem too, given the time
    assert rewards.build("task_score")(completions=["<answer>1 + 2</answer>"], task_item=[slow]) == [0.05]
    assert rewards.build("task_score")(completions=[f"<answer>{LEGS_GOLD}</answer>"], task_item=[LEGS]) == [1.0]


def test_a_failing_scorer_names_the_reward_and_the_sample():
    broken = LEGS.replace('"leg_counting"', '"no_such_task"')  # a problem reasoning-gym cannot rebuild
    reward = rewards.build("task_score")
    with pytest.raises(rewards.RewardFailure) as err:
        reward(completions=["<answer>1</answer>", "<answer>2</answer>"], task_item=[LEGS, broken])
    message = str(err.value)
    assert message.startswith("reward 'task_score' raised on sample 1: ValueError: the task's score_answer raised")
    assert "no_such_task" in message and "completion: '<answer>2</answer>'" in message


def test_identical_answers_to_one_problem_are_scored_once(monkeypatch):
    pool = shared_pool(2)
    seen = []
    real = pool.run
    monkeypatch.setattr(pool, "run", lambda jobs, timeout: (seen.append(len(jobs)), real(jobs, timeout))[1])
    out = rewards.build("task_score")(completions=["<answer>1</answer>"] * 4 + [f"<answer>{LEGS_GOLD}</answer>"],
                                      task_item=[LEGS] * 5)
    assert out == [0.0] * 4 + [1.0] and seen == [2]


@pytest.mark.parametrize("args, message", [
    ({"answer_from": "last_word"}, "answer_from must be one of tag, last_line, last_number, whole"),  # a typo'd mode
    ({"tag": "<answer>"}, "tag must be a tag name such as 'answer'"),  # the name, not the tag itself
    ({"timeout": 0}, "timeout must be a number of seconds in (0, 60]"),  # no limit is not a limit
])
def test_bad_arguments_are_refused_at_check(args, message):
    with pytest.raises(rewards.RewardError, match=re.escape(message)):
        rewards.build("task_score", **args)


def test_data_without_task_items_fails_check():
    from grpokit.config.validate import reward_call_problems

    problems = reward_call_problems([{"name": "task_score", "args": {}}], ["prompt", "answer"])
    assert len(problems) == 1 and "requires 'task_item'" in problems[0].message


def test_it_pickles_and_logs_under_its_name():
    reward = rewards.build("task_score", answer_from="last_number")
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "task_score"
    assert clone(completions=[f"so {LEGS_GOLD}"], task_item=[LEGS]) == [1.0]


import re  # noqa: E402 - used by the refusal table above


@pytest.mark.parametrize("module", ["rewards.tasks", "grpokit.tasks"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed
