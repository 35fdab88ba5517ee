"""`dataset.reasoning_gym`: reasoning-gym's procedural tasks as a recipe's data -- generated offline, checked against
reasoning-gym at --check (every problem at once, exit 2, no weights), a held-out set that never meets training."""

from __future__ import annotations

import base64
import json
import pickle
import re

import pytest
from helpers import ROOT, recipe_dict, write_recipe

from grpokit.prompts import tasks
from grpokit.cli import main

CHAIN = {"name": "chain_sum", "weight": 1.0, "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}}


def source(**changes) -> dict:
    checked, problems = tasks.check_source({"tasks": [CHAIN], "size": 40, "seed": 1, "eval_size": 20, **changes})
    assert not problems, [p.format() for p in problems]
    return checked


def task_recipe(tmp_path, rg: dict, **dataset) -> dict:
    """The tiny-model recipe with a reasoning-gym source and its reward."""
    return recipe_dict(dataset={"reasoning_gym": rg, **dataset},
                       rewards=[{"name": "task_score", "args": {"answer_from": "last_number"}}],
                       trainer={**recipe_dict()["trainer"], "output_dir": str(tmp_path / "run")})


def check_lines(capsys) -> list[str]:
    """The `  - file: key: ...` lines a failed --check printed."""
    return [line.strip()[2:] for line in capsys.readouterr().err.splitlines() if line.strip().startswith("- ")]


# ---------------------------------------------------------------------------------------------------------------
# The source


def test_rows_are_the_tasks_problems_with_what_the_reward_rebuilds_them_from():
    src = source()
    rows = tasks.generate(src).rows
    assert len(rows) == 40 and {r["task"] for r in rows} == {"chain_sum"}
    first = rows[0]
    assert first["prompt"].startswith("State the final answer") and first["answer"] == str(eval(first["prompt"].split(":")[1].rstrip(" =")))
    item = json.loads(first["task_item"])
    assert {k: v for k, v in item.items() if k != "entry"} == {"source": {"tasks": src["tasks"], "size": 40, "seed": 1},
                                                               "index": 0}
    # the problem itself travels with the row, as made (the scorer's cage unpickles it: rebuilt in another process, a
    # problem of some tasks is another problem); the same seed still makes the same problems in a fresh dataset object
    assert pickle.loads(base64.b64decode(item["entry"]))["question"] == first["prompt"]
    assert tasks.build(item["source"])[0]["question"] == first["prompt"]


def test_a_weighted_mix_draws_from_each_task():
    src = source(tasks=[CHAIN, {"name": "leg_counting", "weight": 3.0, "config": {"max_animals": 2, "min_animals": 1}}],
                 size=200)
    counts = {name: sum(r["task"] == name for r in tasks.generate(src).rows) for name in ("chain_sum", "leg_counting")}
    assert counts["chain_sum"] + counts["leg_counting"] == 200
    assert 20 < counts["chain_sum"] < 80, counts  # a quarter of 200, give or take the draw


def test_the_heldout_set_comes_from_seeds_past_training_and_asks_no_training_question():
    src = source()
    assert tasks.eval_seed(src) == 41  # seed + size: the first seed training does not use
    train = {r["prompt"] for r in tasks.generate(src).rows}
    held = tasks.generate(src, heldout=True)
    assert held.rows and not train & {r["prompt"] for r in held.rows}
    assert all(json.loads(r["task_item"])["source"]["seed"] == 41 for r in held.rows)


def test_a_heldout_question_training_also_asks_is_dropped_and_counted():
    # one-digit sums have 200 distinct problems: 150 training ones ask many of the held-out set's questions
    small = {**CHAIN, "config": {**CHAIN["config"], "max_digits": 1}}
    src = source(tasks=[small], size=150, eval_size=50)
    held = tasks.generate(src, heldout=True)
    train = {r["prompt"] for r in tasks.generate(src).rows}
    assert held.repeats > 0 and len(held.rows) + held.repeats == 50
    assert not train & {r["prompt"] for r in held.rows}


def test_eval_reads_the_heldout_problems_formatted_like_training(tmp_path):
    from grpokit import config
    from grpokit.config import validate
    from grpokit.prompts.data import heldout_dataset
    from grpokit.run.evaluate import _heldout_name, passes

    data = task_recipe(tmp_path, {"tasks": [CHAIN], "size": 40, "eval_size": 20}, eval_limit=5,
                       template="{prompt} Answer with just the number.")
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    held = heldout_dataset(recipe, tokenizer=None, log=lambda _: None)
    assert len(held) == 5 and all(p.endswith("Answer with just the number.") for p in held["prompt"])
    assert {json.loads(i)["source"]["seed"] for i in held["task_item"]} == {41}
    assert _heldout_name(recipe.dataset) == "reasoning-gym chain_sum (20 problems, seed 41), held out"
    # a pass is the task's full credit: partial credit is paid for wrong answers
    assert passes("task_score", 1.0) and not passes("task_score", 0.43) and passes("accuracy", 0.43)


def test_neighbouring_seeds_would_repeat_training_so_they_are_refused():
    # reasoning-gym draws problem i from seed + i: held-out seed 2 would be training's problems 1.. again
    a = tasks.build({"tasks": [CHAIN], "size": 5, "seed": 1})
    b = tasks.build({"tasks": [CHAIN], "size": 5, "seed": 2})
    assert a[1]["question"] == b[0]["question"]
    _, problems = tasks.check_source({"tasks": [CHAIN], "size": 40, "seed": 1, "eval_seed": 2})
    assert [p.path for p in problems] == ["dataset.reasoning_gym.eval_seed"]
    assert "seeds 2..101, which meet training's 1..40" in problems[0].message and "eval_seed >= 41" in problems[0].allowed


# ---------------------------------------------------------------------------------------------------------------
# --check: every problem at once, in the user's terms, before any weights load


def test_typos_and_bad_values_are_all_reported_with_the_nearest_name(tmp_path, capsys, no_weights):
    rg = {"tasks": [{"name": "chain_summ"},
                    {"name": "leg_counting", "config": {"max_animal": 3, "seed": 4, "min_animals": 0}},
                    {"name": "countdown", "config": {"min_numbers": 1}},
                    {"name": "basic_arithmetic", "config": {"max_terms": "six"}}],
          "size": 100, "seed": 1, "eval_seed": 50, "eval_sise": 10}
    path = write_recipe(tmp_path, task_recipe(tmp_path, rg))
    assert main(["--recipe", str(path), "--check"]) == 2
    lines = check_lines(capsys)
    at = f"{path}: dataset.reasoning_gym"
    expected = [
        f"{at}.eval_sise: is not a known key; allowed: tasks, size, seed, eval_size, eval_seed; did you mean 'eval_size'?",
        f"{at}.tasks[0].name: is not a reasoning-gym task (got 'chain_summ'); allowed: the {len(tasks.registry())} tasks of "
        f"reasoning-gym {tasks.version()} (python -c \"import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))\"); "
        "did you mean 'chain_sum'?",
        f"{at}.tasks[1].config.max_animal: is not a config key of task leg_counting; allowed: min_animals, max_animals, "
        "min_instances, max_instances; did you mean 'max_animals'?",
        f"{at}.tasks[1].config.seed: is set for every task by dataset.reasoning_gym.seed (and eval_seed)",
        # a typo in a config does not hide a bad value beside it: the task's own rule, blamed on the key it names
        f"{at}.tasks[1].config.min_animals: is refused by reasoning-gym's leg_counting config (got 0); allowed: "
        "min_animals must be positive",
        f"{at}.tasks[2].config.min_numbers: is refused by reasoning-gym's countdown config (got 1); allowed: min_numbers "
        "must be greater than 1",
        f"{at}.tasks[3].config.max_terms: has the wrong type (got 'six'); allowed: integer",
        f"{at}.eval_seed: its held-out problems come from seeds 50..149, which meet training's 1..100 (reasoning-gym draws "
        "problem i from seed + i), so held-out problems would repeat training ones (got 50); allowed: eval_seed >= 101; "
        "e.g. 101 (or leave it out: seed + size)",
    ]
    assert sorted(lines) == sorted(expected), "\n".join(lines)


@pytest.mark.parametrize("dataset, message", [
    # a source is one of three: a file, a hub dataset, or generated tasks
    ({"path": "x.jsonl"}, "give exactly one of dataset.name (hub), dataset.path (local file) or dataset.reasoning_gym"),
    # generated tasks bring their own held-out set
    ({"eval_path": "heldout.jsonl"}, "dataset.eval_path: names held-out data, but dataset.reasoning_gym generates its own"),
    # a mix names each task once
    ({"reasoning_gym": {"tasks": ["chain_sum", "chain_sum"]}}, "task 'chain_sum' is listed twice (also tasks[0])"),
    # at least one task
    ({"reasoning_gym": {"tasks": []}}, "dataset.reasoning_gym.tasks: must list at least one task"),
    # every problem is generated before training: a size is bounded
    ({"reasoning_gym": {"tasks": ["chain_sum"], "size": 10**9}}, "dataset.reasoning_gym.size"),
    # a weight is a share, so positive
    ({"reasoning_gym": {"tasks": [{"name": "chain_sum", "weight": 0}]}}, "dataset.reasoning_gym.tasks[0].weight"),
])
def test_source_rules(tmp_path, capsys, dataset, message):
    data = task_recipe(tmp_path, {"tasks": ["chain_sum"], "size": 10})
    data["dataset"].update(dataset)
    path = write_recipe(tmp_path, data)
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_a_heldout_set_left_empty_fails_check(tmp_path, capsys):
    # leg_counting with one animal and one instance has 37 distinct problems: 200 training ones ask them all
    rg = {"tasks": [{"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 1, "max_instances": 1}}],
          "size": 200, "eval_size": 20}
    path = write_recipe(tmp_path, task_recipe(tmp_path, rg))
    assert main(["--recipe", str(path), "--check"]) == 2
    assert "dataset.reasoning_gym.eval_size: all 20 held-out problems ask a question training asks too" in capsys.readouterr().err


def test_check_explains_the_task_source(tmp_path, capsys, no_weights):
    path = write_recipe(tmp_path, task_recipe(tmp_path, {"tasks": [CHAIN], "size": 40, "eval_size": 20}))
    assert main(["--recipe", str(path), "--check"]) == 0
    out = capsys.readouterr().out
    section = out.split("# task source:")[1].split("\n\n")[0]
    assert f"reasoning-gym {tasks.version()}, generated here from seeds (nothing downloaded)" in section
    assert "task chain_sum: config" in section and "scored by ChainSumDataset.score_answer, the task's own" in section
    assert "training: 40 problems from seeds 1..40" in section
    assert "both sets made in a child process within a bound: each problem within 60 s and 1 MiB, all of them (size + " \
           "eval_size) within 10 min, in 4 GiB of memory" in section
    assert re.search(r"held-out \(--eval, trainer.eval_strategy\): no held-out question is a training question; \d+ problems "
                     r"from seeds 41..60, apart from training.s", section)
    assert "no held-out question is a training question" in section
    assert "reward task_score: the answer is the last number in the text" in section


def test_the_recipe_data_line_names_the_task():
    assert tasks.describe(source()) == "reasoning-gym chain_sum (40 problems, seed 1)"
    from grpokit.prompts.data import source_name

    assert source_name({"reasoning_gym": source()}) == "reasoning-gym chain_sum (40 problems, seed 1)"


def test_shipped_task_recipes_pass_check_from_the_command_line():
    """What the README promises a user types, offline, in a fresh process."""
    from helpers import launch

    result = launch("--recipe", "recipes/smollm2-135m/chain_sum.yaml", "--check")
    assert result.returncode == 0, result.stderr
    assert "# task source: reasoning-gym" in result.stdout and "check passed" in result.stdout
    assert (ROOT / "recipes" / "smollm2-135m" / "leg_counting.yaml").exists()


# ---------------------------------------------------------------------------------------------------------------
# A real run


@pytest.mark.slow
def test_a_task_recipe_trains_on_the_tiny_model(tmp_path):
    """Two real GRPOTrainer steps through launch's code path: generated problems, the task's own scorer, the stop rule;
    the report names the task."""
    from grpokit import config
    from grpokit.run import training
    from grpokit.config import validate

    data = task_recipe(tmp_path, {"tasks": [CHAIN], "size": 16, "eval_size": 8})
    data["rewards"].append({"name": "overlong_penalty", "args": {"buffer": 4}})
    data["trainer"]["max_steps"] = 2
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    training.train(recipe)
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    logged = [h for h in state["log_history"] if "rewards/task_score/mean" in h]
    assert len(logged) == 2 and all(0.0 <= h["rewards/task_score/mean"] <= 1.0 for h in logged)
    # the scorer's limit and the completions that hit it, logged at every step and said in the report
    assert all(h["task_score/limit_s"] == 2.0 and "task_score/timeouts" in h for h in logged)
    report = (tmp_path / "run" / "report.md").read_text()
    assert "## Scoring" in report and "`task_score` scored each completion within 2 s" in report
    assert "data: reasoning-gym chain_sum (16 problems, seed 1)" in report
    assert "- dataset: `reasoning-gym chain_sum (16 problems, seed 1)`" in (tmp_path / "run" / "README.md").read_text()
    # the recipe saved with the run reruns as is: the same source, so the same problems
    assert validate(config.load(tmp_path / "run" / "recipe.yaml")).dataset == recipe.dataset


# ---------------------------------------------------------------------------------------------------------------
# Recipe mistakes around the task source, one line each at --check


def test_eval_of_a_heldout_set_left_empty_says_so(tmp_path, capsys, no_weights):
    # as --check says it (test_a_heldout_set_left_empty_fails_check), not as a dataset with no columns
    rg = {"tasks": [{"name": "leg_counting", "config": {"min_animals": 1, "max_animals": 1, "max_instances": 1}}],
          "size": 200, "eval_size": 20}
    path = write_recipe(tmp_path, task_recipe(tmp_path, rg))
    assert main(["--recipe", str(path), "--eval"]) == 2
    err = capsys.readouterr().err
    assert "dataset.reasoning_gym.eval_size: all 20 held-out problems ask a question training asks too" in err, err
    assert "names no column" not in err and "Traceback" not in err


@pytest.mark.parametrize("tasks_value, expected", [
    # a mapping of one entry's keys: the list it meant holds that one entry
    ({"name": "chain_sum", "config": {"max_terms": 3}},
     "dataset.reasoning_gym.tasks: is a mapping, and tasks are a list, one entry per task; write it as "
     "tasks: [{name: chain_sum, config: {max_terms: 3}}]"),
    # a mapping of task names to configs
    ({"chain_sum": {"max_terms": 3}, "leg_counting": {}},
     "dataset.reasoning_gym.tasks: is a mapping, and tasks are a list, one entry per task; write it as "
     "tasks: [{name: chain_sum, config: {max_terms: 3}}, {name: leg_counting}]"),
])
def test_a_task_list_given_as_a_mapping_is_answered_in_words(tmp_path, capsys, tasks_value, expected):
    path = write_recipe(tmp_path, task_recipe(tmp_path, {"tasks": tasks_value, "size": 10}))
    assert main(["--recipe", str(path), "--check"]) == 2
    lines = check_lines(capsys)
    assert len(lines) == 1 and expected in lines[0], lines
    assert "<class" not in lines[0]


@pytest.mark.parametrize("dataset, expected", [
    ({"reasoning_gym": {"size": 10}}, "dataset.reasoning_gym.tasks: is required; allowed: a list of tasks"),
    ({"reasoning_gym": {"tasks": ["chain_sum"], "size": 10}, "few_shot": {"role": "user", "content": "2 + 2?"}},
     "dataset.few_shot: has the wrong type (got {'role': 'user', 'content': '2 + 2?'}); allowed: a list of chat messages"),
])
def test_a_missing_task_list_and_a_few_shot_mapping_are_said_in_words(tmp_path, capsys, dataset, expected):
    data = task_recipe(tmp_path, {"tasks": ["chain_sum"]})
    data["dataset"] = dataset
    path = write_recipe(tmp_path, data)
    assert main(["--recipe", str(path), "--check"]) == 2
    lines = check_lines(capsys)
    assert len(lines) == 1 and expected in lines[0], lines
    assert "<class" not in lines[0]


def test_last_number_on_a_task_whose_gold_is_no_number_is_refused(tmp_path, capsys, no_weights):
    # spell_backward's gold is a word ('ainomma'): no completion's last number can match it, the gold's own included
    rg = {"tasks": [{"name": "chain_sum"}, {"name": "spell_backward"}], "size": 20, "eval_size": 5}
    path = write_recipe(tmp_path, task_recipe(tmp_path, rg))
    assert main(["--recipe", str(path), "--check"]) == 2
    lines = check_lines(capsys)
    assert len(lines) == 1, lines
    assert ("rewards[0].args.answer_from: takes the last number of a completion, and none of spell_backward's gold "
            "answers is a number (e.g. ") in lines[0], lines
    assert "so not even the gold answer can score 1.0 (got 'last_number'); allowed: tag" in lines[0], lines


def test_last_number_on_a_task_whose_gold_is_a_number_passes(tmp_path, capsys, no_weights):
    path = write_recipe(tmp_path, task_recipe(tmp_path, {"tasks": [CHAIN], "size": 20, "eval_size": 5}))
    assert main(["--recipe", str(path), "--check"]) == 0, capsys.readouterr().err
