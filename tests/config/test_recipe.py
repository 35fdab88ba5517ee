"""Recipe loading and validation: every class of mistake gives its own clear message, all at once."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import ROOT, recipe_dict, with_trainer, write_recipe

from grpokit.config import load
from grpokit.errors import RecipeError
from grpokit.config import validate


def problems_of(path, overrides=(), num_processes=None) -> list[str]:
    """The formatted problem lines of a recipe that must fail."""
    with pytest.raises(RecipeError) as info:
        validate(load(path, overrides), num_processes=num_processes)
    return [p.format() for p in info.value.problems]


def test_valid_recipe_fills_defaults(tmp_path):
    r = validate(load(write_recipe(tmp_path, recipe_dict())))
    assert r.model["quantization"] == "none"
    assert r.dataset["split"] == "train"
    assert r.sampling == {"dynamic": False, "max_rounds": 4, "metric": "reward", "reuse_prefix": True}
    assert r.lora["task_type"] == "CAUSAL_LM"
    assert r.rewards == [{"name": "char_fraction", "weight": 1.0, "args": {"char": "a"}}]


# (trainer keys, a fragment every message must contain): one row per class of mistake.
TRAINER_CASES = [
    ({"epsilon_hihg": 0.28}, ["trainer.epsilon_hihg", "did you mean 'epsilon_high'"]),  # typo -> nearest name
    ({"beta": "high"}, ["trainer.beta", "wrong type", "'high'", "number"]),  # TRL itself accepts this
    ({"loss_type": "dapo2"}, ["trainer.loss_type", "not an allowed value", "did you mean 'dapo'"]),  # TRL fails only at the first loss
    ({"scale_rewards": "sometimes"}, ["trainer.scale_rewards", "group, batch, none"]),
    ({"max_completion_length": 0}, ["trainer.max_completion_length", "out of range", ">= 1"]),
    ({"num_generations": 1}, ["trainer.num_generations", "out of range"]),
    ({"top_p": 1.5}, ["trainer.top_p", "<= 1.0"]),
    ({"optim": "adamw_bnb_8bitt"}, ["trainer.optim", "did you mean 'adamw_bnb_8bit'"]),  # enum from transformers
    ({"reward_weights": [1.0]}, ["trainer.reward_weights", "give each entry a weight"]),  # one source of weights
    ({"auto_find_batch_size": True}, ["trainer.auto_find_batch_size", "not supported by GRPO"]),
    ({"num_generations": 3}, ["trainer.num_generations", "divisible by num_generations (3)", "per_device_train_batch_size: 9"]),
    ({"generation_batch_size": 16, "steps_per_generation": 2}, ["trainer.generation_batch_size", "cannot be set together"]),
]


@pytest.mark.parametrize("trainer,fragments", TRAINER_CASES, ids=[next(iter(c[0])) for c in TRAINER_CASES])
def test_trainer_problem_messages(tmp_path, trainer, fragments):
    lines = problems_of(write_recipe(tmp_path, with_trainer(tmp_path, **trainer)))
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0]
    assert str(tmp_path / "recipe.yaml") in lines[0]  # names the file to edit


def test_numeric_text_is_a_number(tmp_path):
    """PyYAML reads 1e-5 (no dot) as a string; a float field takes it as the number it means."""
    r = validate(load(write_recipe(tmp_path, with_trainer(tmp_path, learning_rate="1e-5"))))
    assert r.trainer["learning_rate"] == 1e-5


def test_all_problems_reported_together(tmp_path):
    data = with_trainer(tmp_path, epsilon_hihg=0.3, beta="x")
    data["modle"] = {}
    data["lora"]["r"] = 0
    data["dataset"]["promt_column"] = "q"
    data["rewards"].append({"name": "char_fractoin"})
    lines = problems_of(write_recipe(tmp_path, data))
    joined = "\n".join(lines)
    assert len(lines) == 6, joined
    for fragment in ["modle", "did you mean 'model'", "trainer.epsilon_hihg", "trainer.beta", "lora.r",
                     "dataset.promt_column", "did you mean 'prompt_column'", "char_fractoin"]:
        assert fragment in joined


SECTION_CASES = [
    (dict(model={"name_or_path": "builtin:tiny-llama", "quantization": "4bits"}), "model.quantization"),
    (dict(model={"name_or_path": "builtin:tiny-llama", "quantization": "4bit"}, lora=None), "cannot be fully fine-tuned"),
    (dict(model={}), "model.name_or_path: is required"),
    (dict(dataset={"prompt_column": "prompt"}), "exactly one of dataset.name"),
    (dict(rewards=[]), "non-empty list"),
    (dict(rewards=[{"name": "char_fraction", "args": {"chr": "a"}}]), "no argument 'chr'"),
    (dict(rewards=[{"name": "char_fraction", "wieght": 2}]), "did you mean 'weight'"),
    (dict(rewards=[{"name": "char_fraction"}, {"name": "char_fraction"}]), "listed twice"),
    (dict(lora={"r": 8, "lora_dropuot": 0.1}), "did you mean 'lora_dropout'"),
    (dict(sampling={"dynamic": True, "metric": "acuracy"}), "sampling.metric"),
    (dict(sampling={"max_rounds": 0}), "sampling.max_rounds"),
    # the overlong buffer must fit inside max_length (= trainer.max_completion_length, 16)
    (dict(rewards=[{"name": "overlong_penalty", "args": {"buffer": 32}}]), "rewards[0].args: reward 'overlong_penalty': argument buffer=32"),
    # what the dynamic-sampling trainer would refuse at init, caught before weights load
    (dict(sampling={"dynamic": True}, trainer={**recipe_dict()["trainer"], "scale_rewards": "batch"}), "trainer.scale_rewards: cannot be used with sampling.dynamic"),
]


@pytest.mark.parametrize("sections,fragment", SECTION_CASES, ids=[c[1][:30] for c in SECTION_CASES])
def test_section_problem_messages(tmp_path, sections, fragment):
    lines = problems_of(write_recipe(tmp_path, recipe_dict(**sections)))
    assert any(fragment in line for line in lines), lines


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("model: {name_or_path: x\n", "YAML syntax error at line"),  # unclosed flow mapping
        ("model: !!python/object:os.system {}\n", "YAML tag !!python/object:os.system is not allowed"),  # never executes anything
        ("- a\n- b\n", "not a recipe: the file holds a list, not a mapping of sections"),
        ("model: {}\nmodel: {}\n", "duplicate key 'model'"),
    ],
)
def test_file_level_problems(tmp_path, text, fragment):
    lines = problems_of(write_recipe(tmp_path, text))
    assert fragment in lines[0]


def test_missing_recipe_file(tmp_path):
    assert "recipe file does not exist" in problems_of(tmp_path / "nope.yaml")[0]


def test_base_merge_child_wins_and_where_set(tmp_path):
    base = recipe_dict()
    base["trainer"]["beta"] = 0.04
    write_recipe(tmp_path, base, "base.yaml")
    write_recipe(tmp_path, {"base": "base.yaml", "trainer": {"beta": 0.0, "epsilon_hihg": 0.2}}, "child.yaml")
    lines = problems_of(tmp_path / "child.yaml")
    assert lines == [f"{tmp_path / 'child.yaml'}: trainer.epsilon_hihg: is not a GRPOConfig field; allowed: the field names of trl.GRPOConfig; did you mean 'epsilon_high'?"]
    write_recipe(tmp_path, {"base": "base.yaml", "trainer": {"beta": 0.0}}, "child.yaml")
    loaded = load(tmp_path / "child.yaml")
    assert loaded.data["trainer"]["beta"] == 0.0  # child wins
    assert loaded.data["trainer"]["num_generations"] == 4  # base fills the rest
    assert loaded.where_set("trainer.num_generations") == str(tmp_path / "base.yaml")
    assert loaded.where_set("trainer.beta") == str(tmp_path / "child.yaml")


# (key path, the file where_set_in names): a key answers for itself, else for its nearest set parent, else the default
WHERE_SET = [
    ("trainer.beta", "command line"),  # set itself, on the command line
    ("trainer.seed", "base.yaml"),  # unset: its section was set in the base
    ("trainer.seed.deeper", "base.yaml"),  # two levels down: still the section
    ("model.name_or_path", "recipe.yaml"),  # nothing on its path was set: the default
    ("", "recipe.yaml"),  # the file as a whole
]


@pytest.mark.parametrize("key_path, expected", WHERE_SET)
def test_where_set_in_walks_up_to_the_nearest_set_parent(key_path, expected):
    from grpokit.config.loader import CLI, where_set_in

    set_by = {"trainer": "base.yaml", "trainer.beta": CLI}
    assert where_set_in(set_by, key_path, "recipe.yaml") == expected


def test_a_validated_recipe_answers_where_set_as_its_load_does(tmp_path):
    write_recipe(tmp_path, recipe_dict(), "base.yaml")
    write_recipe(tmp_path, {"base": "base.yaml", "trainer": {"beta": 0.0}}, "child.yaml")
    loaded = load(tmp_path / "child.yaml", ["trainer.seed=3"])
    recipe = validate(loaded)
    for key in ("trainer.beta", "trainer.seed", "trainer.num_generations", "trainer.no_such_key", "dataset.path", "nope"):
        assert recipe.where_set(key) == loaded.where_set(key), key
    assert recipe.where_set("trainer.seed") == "command line"
    assert recipe.where_set("nope") == str(tmp_path / "child.yaml")


def test_empty_section_changes_nothing_but_null_lora_means_full_finetune(tmp_path):
    write_recipe(tmp_path, recipe_dict(), "base.yaml")
    write_recipe(tmp_path, "base: base.yaml\ntrainer:\n  # nothing changed yet\nlora:\n", "child.yaml")
    r = validate(load(tmp_path / "child.yaml"))
    assert r.trainer["num_generations"] == 4  # the base's trainer section survives an empty one
    assert r.lora is None  # an explicit null lora turns LoRA off


def test_base_paths_are_relative_to_the_base(tmp_path):
    (tmp_path / "sub").mkdir()
    base = recipe_dict()
    base["dataset"]["path"] = "../data.jsonl"
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi", "answer": "a"}\n')
    write_recipe(tmp_path / "sub", base, "base.yaml")
    write_recipe(tmp_path, {"base": "sub/base.yaml"}, "child.yaml")
    assert load(tmp_path / "child.yaml").data["dataset"]["path"] == str(tmp_path / "data.jsonl")


def test_base_cycle(tmp_path):
    write_recipe(tmp_path, {"base": "b.yaml"}, "a.yaml")
    write_recipe(tmp_path, {"base": "a.yaml"}, "b.yaml")
    assert "cycle" in problems_of(tmp_path / "a.yaml")[0]


def test_overrides_are_validated_like_file_keys(tmp_path):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    r = validate(load(path, ["trainer.max_steps=5", "trainer.beta=0.04", "lora.target_modules=[q_proj, v_proj]", "rewards.0.weight=2"]))
    assert (r.trainer["max_steps"], r.trainer["beta"]) == (5, 0.04)
    assert r.lora["target_modules"] == ["q_proj", "v_proj"]
    assert r.rewards[0]["weight"] == 2.0
    lines = problems_of(path, ["trainer.epsilon_hihg=0.28"])
    assert lines == ["command line: trainer.epsilon_hihg: is not a GRPOConfig field; allowed: the field names of trl.GRPOConfig; did you mean 'epsilon_high'?"]
    assert "section.key=value" in problems_of(path, ["trainer.max_steps"])[0]
    assert "no list item 3" in problems_of(path, ["rewards.3.weight=1"])[0]


def test_num_processes_enters_the_batch_check(tmp_path):
    path = write_recipe(tmp_path, with_trainer(tmp_path, per_device_train_batch_size=2, num_generations=4))
    validate(load(path), num_processes=2)  # 2 x 2 = 4: whole groups
    lines = problems_of(path, num_processes=3)
    assert "2 x 3 process(es)" in lines[0]


@pytest.mark.slow
def test_cli_exit_code_2_no_traceback_before_weights(tmp_path):
    """A typo'd key exits 2 naming the key and the fix, before any weights load."""
    path = write_recipe(tmp_path, with_trainer(tmp_path, epsilon_hihg=0.28))
    code = (
        "import sys, transformers\n"
        "def refuse(*a, **k): raise SystemExit('weights were loaded')\n"
        "transformers.AutoModelForCausalLM.from_pretrained = refuse\n"
        "from grpokit.cli import main\n"
        f"sys.exit(main(['--recipe', {str(path)!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert "trainer.epsilon_hihg" in proc.stderr and "did you mean 'epsilon_high'" in proc.stderr
    assert "Traceback" not in proc.stderr and "weights were loaded" not in proc.stderr


def test_help_imports_nothing_heavy():
    code = (
        "import sys\nfrom grpokit.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'datasets') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--recipe" in proc.stdout and proc.stdout.strip().endswith("[]")


def test_dynamic_sampling_keeps_groups_on_one_process(tmp_path):
    """2 processes x 2 completions hold whole groups of 4 globally, but a group would straddle the ranks."""
    data = with_trainer(tmp_path, per_device_train_batch_size=2, num_generations=4)
    data["sampling"] = {"dynamic": True}
    lines = problems_of(write_recipe(tmp_path, data), num_processes=2)
    assert len(lines) == 1 and "every prompt group stays on one process" in lines[0]


def test_flags_and_overrides_in_any_order(tmp_path, capsys):
    """`--overwrite` between overrides is not an argparse error: the run gets both overrides."""
    from grpokit.cli import main

    path = write_recipe(tmp_path, with_trainer(tmp_path))
    assert main(["--recipe", str(path), "trainer.beta=0.1", "--check", "trainer.epsilon_hihg=1"]) == 2
    assert "trainer.epsilon_hihg" in capsys.readouterr().err  # the override after --check reached the recipe


# (trainer, lora, the problem TRL's or PEFT's own check gives, blamed where the section was set); one comment per case
LIBRARY_REJECTS = [
    ({"num_generations": 1}, None, "w.yaml: trainer: TRL rejects this configuration: GRPO requires at least 2 generations"),
    ({"per_device_train_batch_size": 8, "num_generations": 3}, None,  # TRL's own batch rule, with its own numbers
     "w.yaml: trainer: TRL rejects this configuration: generation_batch_size (8) must be divisible by num_generations (3)"),
    ({}, {"layers_pattern": "h"}, "w.yaml: lora: PEFT rejects this configuration: `layers_pattern` cannot be used"),
    ({}, {}, None),  # both accept
]


@pytest.mark.parametrize("trainer, lora, expected", LIBRARY_REJECTS)
def test_the_libraries_own_checks_are_reworded_and_blamed(trainer, lora, expected):
    from grpokit.config.sections import LORA_DEFAULTS
    from grpokit.config.validate import _check_with_the_libraries
    from grpokit.errors import Problems

    problems = Problems(file="r.yaml")
    lora = None if lora is None else {**LORA_DEFAULTS, "r": 8, "target_modules": "all-linear", **lora}
    _check_with_the_libraries({"output_dir": "out", **trainer}, {}, [], lora, 1, problems, lambda key: "w.yaml")
    said = [p.format() for p in problems.items]
    if expected is None:
        assert said == []
    else:
        assert len(said) == 1 and said[0].startswith(expected), said


def test_section_names_say_every_unknown_and_missing_section_at_once():
    from grpokit.config.validate import _check_section_names
    from grpokit.errors import Problems

    problems = Problems(file="r.yaml")
    _check_section_names({"modle": {}, "dataset": None, "rewards": []}, problems, lambda key: "w.yaml")
    assert [p.format() for p in problems.items] == [
        "w.yaml: modle: is not a recipe section; allowed: model, lora, dataset, rewards, tools, warm_start, trainer, sampling, lint; did you mean 'model'?",
        "r.yaml: model: section is required",
        "r.yaml: dataset: section is required",  # null is not a section
    ]


def test_every_key_of_a_rewards_args_is_checked_even_when_another_is_wrong(tmp_path):
    # An unknown key hid the others' bad values, and a first bad value hid the next (README: every problem at once).
    lines = problems_of(write_recipe(tmp_path, recipe_dict(rewards=[
        {"name": "task_score", "args": {"answer_fromm": "tag", "timeout": "x", "workers": 999}}])))
    said = [line.split("rewards[0].args: ", 1)[1] for line in lines if "rewards[0].args: " in line]
    assert said == ["reward 'task_score' has no argument 'answer_fromm'; arguments: answer_from, tag, timeout, workers; "
                    "did you mean 'answer_from'?",
                    "reward 'task_score': argument timeout='x': timeout must be a number of seconds in (0, 60], got 'x'",
                    "reward 'task_score': argument workers=999: workers must be an integer in [1, 64], got 999"], lines
