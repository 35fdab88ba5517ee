"""A corpus of malformed recipes (tests/bad_recipes/): each ends in one clear message and exit code 2.

Every case runs `launch.py --check` (in-process for speed, a few as real subprocesses) and must name the
problem, exit 2, print no traceback and load no weights. Each YAML file extends fixtures/valid.yaml and
breaks one thing; its first line says what.
"""

from __future__ import annotations


import pytest
from helpers import ROOT, launch

from grpokit.cli import main

CORPUS = ROOT / "tests" / "bad_recipes"

# case file (without .yaml) -> fragments the message must contain
CASES = {
    # --- the file itself
    "yaml_syntax_error": ["YAML syntax error at line 3"],  # unclosed flow mapping
    "python_object_tag": ["line 3: YAML tag !!python/object/apply:os.system is not allowed", "safe_load"],  # never constructed
    "duplicate_key": ["duplicate key 'trainer' (first at line 3)"],  # PyYAML alone keeps the last silently
    "not_a_mapping": ["not a recipe: the file holds a list, not a mapping of sections"],  # top level is a list
    "empty_file": ["model: section is required", "dataset: section is required", "rewards: section is required"],
    # --- base
    "base_cycle": ["recipes extend each other in a cycle", "base_cycle.yaml -> ", "cycle_b.yaml -> "],
    "base_missing": ["base: base recipe", "no_such_base.yaml' does not exist"],
    "base_not_a_path": ["base: must be a path to another recipe"],  # a list where a path is expected
    # --- wrong type at every level
    "section_scalar": ["model: must be a mapping", "got 'builtin:tiny-llama'"],  # section: scalar for mapping
    "section_list": ["trainer: must be a mapping", "got ['max_steps', 2]"],  # section: list for mapping
    "mapping_where_scalar": ["model.name_or_path: has the wrong type", "allowed: string"],  # key: mapping for scalar
    "wrong_type_trainer": ["trainer.max_steps: has the wrong type", "got 'ten'", "allowed: integer"],  # GRPOConfig's own annotation
    "wrong_type_lora": ["lora.r: has the wrong type", "got 'eight'", "allowed: integer"],  # LoraConfig's own annotation
    "wrong_type_dataset": ["dataset.prompt_column: has the wrong type", "got 3", "allowed: string"],
    "rewards_mapping": ["rewards: must be a non-empty list of {name, weight, args}"],  # list expected
    "reward_args_list": ["rewards[0].args: has the wrong type", "allowed: mapping"],  # entry level
    # --- unknown section and typo'd keys at every level, each with the nearest valid name
    "unknown_section": ["trainning: is not a recipe section", "did you mean 'trainer'?"],
    "typo_model_key": ["model.dtpye: is not a known key", "did you mean 'dtype'?"],
    "typo_dataset_key": ["dataset.promt_column: is not a known key", "did you mean 'prompt_column'?"],
    "typo_lora_key": ["lora.lora_aplha: is not a LoraConfig field", "did you mean 'lora_alpha'?"],
    "typo_trainer_key": ["trainer.learnig_rate: is not a GRPOConfig field", "did you mean 'learning_rate'?"],
    "typo_sampling_key": ["sampling.dynamc: is not a known key", "did you mean 'dynamic'?"],
    "typo_reward_entry_key": ["rewards[0].wieght: is not a known key", "did you mean 'weight'?"],
    "typo_reward_arg": ["reward 'char_fraction' has no argument 'chr'", "did you mean 'char'?"],  # bound to the signature
    # --- bad enumeration values
    "bad_enum_dtype": ["model.dtype: is not an allowed value", "got 'fp16'", "auto, bfloat16, float16, float32"],
    "bad_enum_quantization": ["model.quantization: is not an allowed value", "none, 8bit, 4bit"],
    "bad_enum_loss_type": ["trainer.loss_type: is not an allowed value", "did you mean 'grpo'?"],  # TRL accepts it
    "bad_enum_scheduler": ["trainer.lr_scheduler_type: is not an allowed value", "did you mean 'cosine'?"],  # transformers' enum
    "bad_enum_conversational": ["dataset.conversational: is not an allowed value", "got 'sometimes'"],
    # --- contradictory knobs
    "contradict_quantized_full_ft": ["model.quantization: a quantized model cannot be fully fine-tuned; add a lora section"],
    "contradict_dataset_name_and_path": ["give exactly one of dataset.name (hub), dataset.path (local file) or dataset.reasoning_gym"],
    "contradict_generation_knobs": ["trainer.generation_batch_size: cannot be set together with trainer.steps_per_generation"],
    "contradict_batch_groups": ["must be divisible by num_generations (3)", "e.g. per_device_train_batch_size: 9"],
    "contradict_bf16_fp16": ["trainer.fp16: cannot be true together with trainer.bf16"],
    # --- negative or zero sizes
    "zero_batch": ["trainer.per_device_train_batch_size: is out of range", "got 0", ">= 1"],
    "negative_completion_length": ["trainer.max_completion_length: is out of range", "got -16"],
    "negative_learning_rate": ["trainer.learning_rate: is out of range", "> 0.0"],
    "zero_lora_rank": ["lora.r: is out of range", "got 0"],  # PEFT itself accepts r=0
    "zero_dataset_limit": ["dataset.limit: is out of range", "got 0"],
    # --- the model
    "missing_model_dir": ["model.name_or_path: model directory does not exist", "no_such_model"],
    "model_dir_not_a_model": ["model.name_or_path: directory has no config.json: not a saved model"],
    "model_dir_without_weights": ["model.name_or_path: directory holds config.json but no weights: none of "
                                  "model.safetensors, pytorch_model.bin", "allowed: a saved model"],
    "unknown_builtin_model": ["unknown built-in model 'huge-llama'; built-ins: tiny-llama"],
    # --- the data
    "missing_dataset_file": ["dataset.path: dataset file does not exist", "no_such_data.jsonl"],
    "unsupported_dataset_type": ["dataset.path: unsupported file type", "got '.txt'", ".jsonl, .json, .parquet, .csv"],
    "malformed_dataset_file": ["dataset.path: broken.jsonl line 2 is not valid JSON", "(column 1)"],  # 1-based, said once
    "no_prompt_column": ["dataset.prompt_column: names no column of the dataset", "got 'prompt'", "allowed: question, answer"],
    "no_gold_column": ["dataset.answer_column: names no column of the dataset", "allowed: prompt, solution"],
    "template_typo": ["placeholder {promt} names no column", "did you mean 'prompt'?"],
    "empty_after_holes": ["dataset: no rows left to train on (5 read"],  # every row a hole
    "empty_after_length_filter": ["dataset: no rows left to train on (64 read"],  # every prompt over max_prompt_tokens
    "reward_gold_column_missing": ["rewards[0].args.gold_column: names no column of the prepared dataset", "got 'answer'"],
    # --- rewards
    "unknown_reward": ["unknown reward 'char_fractoin'", "did you mean 'char_fraction'?"],
    "reward_bad_arg_value": ["reward 'char_fraction': argument char='ab'", "char must be a single character"],
    "reward_listed_twice": ["reward 'char_fraction' is listed twice"],
    "refused_trainer_key": ["trainer.reward_weights: is set by grpokit from the rewards list"],
    "sampling_metric_unknown": ["sampling.metric: names no reward of this recipe", "got 'acuracy'"],
    "user_reward_file_missing": ["no_such_reward.py' does not exist"],
    "user_reward_syntax_error": ["syntax error in", "reward_syntax_error.py line 2"],
    "user_reward_no_function": ["reward_no_function.py has no 'score'", "did you mean 'scores'?"],
    "user_reward_bad_signature": ["has signature (text), which cannot take TRL's call", "def f(completions, **kwargs)"],
    "user_reward_import_fails": ["importing", "failed: RuntimeError: needs a GPU to import"],
    "user_reward_module_missing": ["module 'no_such_pkg.my_rewards' not found"],
    # --- the warm start (grpokit/warm_start/)
    "warm_start_typo": ["warm_start.stpes: is not a known key", "did you mean 'steps'?"],
    "warm_start_no_source": ["warm_start: give exactly one source of worked exchanges", "warm_start.examples"],
    "warm_start_zero_steps": ["warm_start.steps: is out of range", "got 0"],
    "warm_start_from_task_without_task": ["warm_start.from_task: writes worked exchanges for the recipe's reasoning-gym "
                                          "task", "give warm_start.examples"],
    "warm_start_broken_examples": ["warm_start.examples: line 2 is not valid JSON", "broken_exchanges.jsonl"],
    "warm_start_quantized": ["warm_start: merges its adapter into the model's weights", "got '4bit'"],
}
PROBLEM_COUNT = {"empty_file": 3}  # every other case is exactly one problem
SUBPROCESS_CASES = ["yaml_syntax_error", "unknown_reward", "missing_dataset_file"]  # file, registry and data stages


def test_corpus_and_table_agree():
    assert len(CASES) >= 25
    assert sorted(p.stem for p in CORPUS.glob("*.yaml")) == sorted(CASES)


def test_the_base_is_valid(no_weights, capsys):
    """So that each case fails for the one thing it breaks."""
    assert main(["--recipe", str(CORPUS / "fixtures" / "valid.yaml"), "--check"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_recipe(case, no_weights, capsys):
    path = CORPUS / f"{case}.yaml"
    assert main(["--recipe", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    for fragment in CASES[case]:
        assert fragment in err, err
    assert f"{case}.yaml" in err  # names the file to edit
    assert err.count("\n  - ") == PROBLEM_COUNT.get(case, 1), err
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_recipe_as_a_real_command(case):
    proc = launch("--recipe", str(CORPUS / f"{case}.yaml"), "--check", timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert all(fragment in proc.stderr for fragment in CASES[case]), proc.stderr
    assert "Traceback" not in proc.stderr
