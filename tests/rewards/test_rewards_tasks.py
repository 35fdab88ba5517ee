"""`task_score`: a reasoning-gym task's own score_answer of the answer the prompt asked for, bounded in time."""

from __future__ import annotations

import pickle
import time

import pytest

from helpers import recipe_dict, write_recipe

import rewards
from grpokit.cli import main
from grpokit.prompts import tasks
from grpokit.untrusted.pool import shared
from rewards.tasks import SCORERS, TaskScore, audit


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
    # countdown's scorer evaluates the answer: one that sleeps holds it past any limit
    pool = shared(SCORERS, 2)
    reward = rewards.build("task_score", timeout=0.5)
    assert reward(completions=["<answer>1 + 2</answer>"], task_item=[COUNTDOWN]) == [0.05]  # workers up, problem built
    timeouts = pool.counts.timeouts
    start = time.monotonic()
    sleeper = "<answer>__import__('time').sleep(600)</answer>"
    assert reward(completions=[sleeper], task_item=[COUNTDOWN]) == [0.0]
    assert time.monotonic() - start < 60  # the limit, not the answer's ten minutes (bound loose for a loaded box)
    assert pool.counts.timeouts == timeouts + 1 and reward.fn.last.timeouts == 1
    # and the pool goes on
    assert reward(completions=["<answer>1 + 2</answer>", f"<answer>{LEGS_GOLD}</answer>"],
                  task_item=[COUNTDOWN, LEGS]) == [0.05, 1.0]


def test_building_the_problem_is_not_the_answers_time():
    # knight_swap's default config takes seconds to build a problem (it solves the puzzle); a limit of 0.5 s is the
    # answer's, so the gold still scores 1.0 in a worker that has never seen the task.
    # eval_size 1: the held-out set is made with the training one, and 100 of these problems would take a minute
    source, problems = tasks.check_source({"tasks": [{"name": "knight_swap", "config": {}}], "size": 2, "seed": 3,
                                           "eval_size": 1})
    assert not problems
    row = tasks.generate(source).rows[1]
    reward = rewards.build("task_score", timeout=0.5)
    assert reward(completions=[f"<answer>{row['answer']}</answer>"], task_item=[row["task_item"]]) == [1.0]


def test_a_scorer_that_raises_on_the_answer_scores_it_zero():
    # the answer is the policy's: a scorer it breaks is a wrong answer, counted, not a stopped run
    reward = rewards.build("task_score")
    raiser = "<answer>__import__('builtins').exec('raise SystemExit(3)')</answer>"
    assert reward(completions=[raiser, "<answer>1 + 2</answer>"], task_item=[COUNTDOWN, COUNTDOWN]) in (
        [0.01, 0.05], [0.0, 0.05])


def test_a_problem_that_cannot_be_rebuilt_names_the_reward_and_the_sample():
    broken = LEGS.replace('"leg_counting"', '"no_such_task"')  # a problem reasoning-gym cannot rebuild: the data's fault
    reward = rewards.build("task_score")
    with pytest.raises(rewards.RewardFailure) as err:
        reward(completions=["<answer>1</answer>", "<answer>2</answer>"], task_item=[LEGS, broken])
    message = str(err.value)
    assert message.startswith("reward 'task_score' raised on sample 1: ValueError: the task's problem: cannot rebuild")
    assert "no_such_task" in message and "completion: '<answer>2</answer>'" in message


def test_a_degenerate_megabyte_completion_is_scored_within_the_limit():
    # a policy that repeats a tag: reasoning-gym's own extraction is quadratic there (256 KB: 153 s)
    reward = rewards.build("task_score", timeout=2.0)
    start = time.monotonic()
    assert reward(completions=["<answer>" * (1 << 17)], task_item=[LEGS]) == [0.0]
    assert reward.fn.last.timeouts == 0  # scored, not cut off
    assert time.monotonic() - start < 60


def test_identical_answers_to_one_problem_are_scored_once(monkeypatch):
    pool = shared(SCORERS, 2)
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
    from grpokit.config.reward_entries import reward_call_problems

    problems = reward_call_problems([{"name": "task_score", "args": {}}], ["prompt", "answer"])
    assert len(problems) == 1 and "requires 'task_item'" in problems[0].message


def test_it_pickles_and_logs_under_its_name():
    reward = rewards.build("task_score", answer_from="last_number")
    clone = pickle.loads(pickle.dumps(reward))
    assert clone.__name__ == "task_score"
    assert clone(completions=[f"so {LEGS_GOLD}"], task_item=[LEGS]) == [1.0]


import re  # noqa: E402 - used by the refusal table above


@pytest.mark.parametrize("module", ["rewards.tasks", "grpokit.untrusted.task_job", "grpokit.prompts.tasks"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted and not result.failed


def rows_of(name: str, config: dict | None = None, size: int = 4) -> list[dict]:
    src, problems = tasks.check_source({"tasks": [{"name": name, "config": config or {}}], "size": size, "seed": 1})
    assert not problems
    return list(tasks.generate(src).rows)


def test_the_audit_finds_a_scorer_that_pays_any_text_and_golds_the_reward_cannot_read():
    # game_of_life_halting's scorer compares bool(answer) with bool(gold): any text scores 1.0
    said = audit(TaskScore(), rows_of("game_of_life_halting"))
    assert said == {"game_of_life_halting": {"checked": 4, "gold": 4, "gold_full": 4, "nonsense": 1.0}}
    # string_insertion's golds are letters: read as the last number, none scores
    said = audit(TaskScore(answer_from="last_number"), rows_of("string_insertion"))
    assert said["string_insertion"]["gold_full"] == 0 and said["string_insertion"]["nonsense"] == 0.0
    # chain_sum read from its tag: every gold scores, nonsense does not
    assert audit(TaskScore(), rows_of("chain_sum")) == {"chain_sum": {"checked": 4, "gold": 4, "gold_full": 4,
                                                                      "nonsense": 0.0}}


def test_check_warns_of_a_task_that_pays_any_text(tmp_path, capsys):
    data = recipe_dict(dataset={"reasoning_gym": {"tasks": ["game_of_life_halting", "chain_sum"], "size": 20},
                                "template": "{prompt} Give the answer as <answer>...</answer>."},
                       rewards=[{"name": "task_score"}])
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    assert "warning [task-pays-any-text] dataset.reasoning_gym.tasks: the task's own scorer pays the answer " \
           "'I do not know': game_of_life_halting (1)" in out
    assert "task-gold-cannot-score" not in out  # both tasks' golds score 1.0 from the tag


def test_a_kept_problem_whose_dataset_was_dropped_for_newer_ones_still_scores(monkeypatch):
    # A worker keeps the last KEPT_DATASETS datasets and 4096 problems: a problem kept from an early source is scored
    # by that source's dataset, built again when newer sources pushed it out (a recipe mixing many tasks).
    from grpokit.untrusted import task_job

    monkeypatch.setattr(task_job, "KEPT_DATASETS", 1)
    items = [tasks.generate(tasks.check_source({"tasks": [{"name": "chain_sum", "config": {}}], "size": 1,
                                                "seed": seed})[0]).rows[0]["task_item"] for seed in (1, 2)]
    for item in items:
        task_job.problem(item)
    dataset, entry = task_job.problem(items[0])  # its entry kept, its dataset dropped
    assert dataset.score_answer(entry["answer"], entry) == 1.0
