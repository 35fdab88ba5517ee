"""--check's lint: one test per rule, each on a real validated recipe and its real GRPOConfig (a recipe that
fires the rule, and the nearest recipe that does not), then the CLI: a warning line, exit 0, silenced by
`lint: {ignore: [...]}`, and an unknown rule name refused with the nearest one (exit 2)."""

from __future__ import annotations

import pytest
from helpers import ROOT, recipe_dict, write_recipe

from grpokit.cli import main
from grpokit.config import load, validate
from grpokit.config.lint import RULES, lint
from grpokit.config.trainer_args import grpo_args


def recipe_with(tmp_path, trainer=None, **sections):
    data = recipe_dict(**sections)
    data["trainer"].update(trainer or {})
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    return validate(load(write_recipe(tmp_path, data)))


def fired(recipe, **facts) -> dict[str, str]:
    """rule -> formatted warning, for the warnings `recipe` draws."""
    return {w.rule: w.format() for w in lint(recipe, grpo_args(recipe), **facts)}


def test_the_smoke_recipe_is_clean():
    recipe = validate(load(ROOT / "recipes" / "smoke.yaml"))
    assert fired(recipe) == {}


def test_clip_on_policy(tmp_path):
    # The smoke batch: 8 completions, accumulation 1 = steps_per_generation 1: every step is on-policy.
    on = recipe_with(tmp_path, {"epsilon": 0.2, "epsilon_high": 0.28})
    text = fired(on)["clip-on-policy"]
    assert "trainer.epsilon, trainer.epsilon_high" in text and "the clip never binds" in text
    assert "steps_per_generation" in text and "num_iterations" in text  # the knobs to turn
    # GSPO's sequence-level ratio is 1 on-policy too.
    gspo_on_policy = recipe_with(tmp_path, {"importance_sampling_level": "sequence"})
    assert "trainer.importance_sampling_level" in fired(gspo_on_policy)["clip-on-policy"]
    # Off-policy, by mini-batches (DAPO) or by repeated passes (DeepSeekMath's mu): the clip acts, no warning.
    assert "clip-on-policy" not in fired(recipe_with(tmp_path, {"epsilon_high": 0.28, "steps_per_generation": 2}))
    assert "clip-on-policy" not in fired(recipe_with(tmp_path, {"epsilon_high": 0.28, "num_iterations": 2}))
    # Knobs left at TRL's defaults are not the recipe's claim: nothing to warn about.
    assert "clip-on-policy" not in fired(recipe_with(tmp_path))


def test_beta_full_copy_says_the_cost_from_the_memory_planner(tmp_path):
    full = recipe_with(tmp_path, {"beta": 0.04}, lora=None)
    text = fired(full)["beta-full-copy"]
    from grpokit.planning import memory
    from grpokit.planning.architecture import load_model_config

    config, _ = load_model_config("builtin:tiny-llama")
    weights, _ = memory.weight_bytes(config, memory.planned_dtype(full.model), "none")
    assert f"{weights / memory.GIB:.2f} GiB more GPU memory" in text  # the planner's figure, not a constant
    assert "add a lora section" in text and "trainer.beta: 0" in text
    assert "beta-full-copy" not in fired(recipe_with(tmp_path, {"beta": 0.04}))  # LoRA: the reference costs no memory
    assert "beta-full-copy" not in fired(recipe_with(tmp_path, lora=None))  # beta 0: no reference at all


@pytest.mark.parametrize("scale", ["group", "batch", True])
def test_dr_grpo_scaled(tmp_path, scale):
    text = fired(recipe_with(tmp_path, {"loss_type": "dr_grpo", "scale_rewards": scale}))["dr-grpo-scaled"]
    assert "trainer.scale_rewards: none" in text
    assert "dr-grpo-scaled" not in fired(recipe_with(tmp_path, {"loss_type": "dr_grpo", "scale_rewards": "none"}))


def test_dr_grpo_scaled_by_trl_default(tmp_path):
    """`loss_type: dr_grpo` alone keeps TRL's scale_rewards 'group': the case that is easy to miss."""
    assert "dr-grpo-scaled" in fired(recipe_with(tmp_path, {"loss_type": "dr_grpo"}))


def test_mask_most_truncated_from_measured_answer_lengths(tmp_path):
    masked = recipe_with(tmp_path, {"mask_truncated_completions": True, "max_completion_length": 16})
    text = fired(masked, answer_lengths=[10, 20, 30, 40, 50])["mask-most-truncated"]
    assert "30 tokens at the median (measured on 5 rows" in text and "90th percentile is 50 tokens" in text
    assert "mask-most-truncated" not in fired(masked, answer_lengths=[4, 5, 6, 20, 30])  # most fit
    assert "mask-most-truncated" not in fired(masked)  # lengths unknown (dataset not reachable): no claim
    assert "mask-most-truncated" not in fired(recipe_with(tmp_path, {"max_completion_length": 16}), answer_lengths=[30])


def test_group_collapse_under_greedy_decoding(tmp_path):
    greedy = recipe_with(tmp_path, {"generation_kwargs": {"do_sample": False}})
    assert "all completions of a prompt are the same text" in fired(greedy)["group-collapse"]
    dynamic = recipe_with(tmp_path, {"generation_kwargs": {"do_sample": False}}, sampling={"dynamic": True, "max_rounds": 3})
    assert "filled short after 3 rounds" in fired(dynamic)["group-collapse"]
    assert "group-collapse" not in fired(recipe_with(tmp_path, {"generation_kwargs": {"top_k": 20}}))


def test_task_answer_not_asked(tmp_path):
    data = recipe_dict(dataset={"reasoning_gym": {"tasks": ["chain_sum"], "size": 20}}, rewards=[{"name": "task_score"}])
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    unasked = validate(load(write_recipe(tmp_path, data)))
    assert "task_score reads the answer from <answer>...</answer>, which neither" in fired(unasked)["task-answer-not-asked"]
    data["dataset"]["template"] = "{prompt} Give the answer as <answer>...</answer>."  # asked: clean
    assert "task-answer-not-asked" not in fired(validate(load(write_recipe(tmp_path, data))))
    data["dataset"].pop("template")
    data["rewards"] = [{"name": "task_score", "args": {"answer_from": "last_number"}}]  # read as the prompt asks
    assert "task-answer-not-asked" not in fired(validate(load(write_recipe(tmp_path, data))))


def test_task_scorer_audit(tmp_path):
    # the audit itself (scored in the cage) is tested in test_rewards_tasks.py; here what the two rules say of it
    data = recipe_dict(dataset={"reasoning_gym": {"tasks": ["chain_sum"], "size": 20}}, rewards=[{"name": "task_score"}])
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    recipe = validate(load(write_recipe(tmp_path, data)))
    audit = {"chain_sum": {"checked": 4, "gold": 4, "gold_full": 4, "nonsense": 0.0},
             "boxnet": {"checked": 4, "gold": 0, "gold_full": 0, "nonsense": 0.0},
             "knight_swap": {"checked": 4, "gold": 4, "gold_full": 3, "nonsense": 0.0},
             "game_of_life_halting": {"checked": 4, "gold": 4, "gold_full": 4, "nonsense": 1.0}}
    said = fired(recipe, task_audit=audit)
    assert ("score 1.0 on boxnet: 0 of 4 problems checked (4 carry no gold answer: the task's scorer checks a solution, "
            "of which there are many); knight_swap: 3 of 4 problems checked;") in said["task-gold-cannot-score"]
    assert "pays the answer 'I do not know': game_of_life_halting (1)" in said["task-pays-any-text"]
    clean = {"chain_sum": audit["chain_sum"]}
    assert not {"task-gold-cannot-score", "task-pays-any-text"} & set(fired(recipe, task_audit=clean))


@pytest.mark.parametrize("temperature,warns", [(0.1, True), (0.3, True), (0.31, False), (1.0, False)])
def test_low_temperature(tmp_path, temperature, warns):
    found = fired(recipe_with(tmp_path, {"temperature": temperature}))
    assert ("low-temperature" in found) == warns
    if warns:
        assert "std collapses to 0" in found["low-temperature"] and "raise trainer.temperature" in found["low-temperature"]


def overlong(**args):
    return [{"name": "char_fraction", "args": {"char": "a"}}, {"name": "overlong_penalty", "args": args}]


@pytest.mark.parametrize("args,expected", [
    ({"max_length": 32, "buffer": 8}, "the penalty never fires"),  # window (24, 32] past the 16-token budget
    ({"max_length": 20, "buffer": 8}, "the ramp never reaches -1 (at most -0.5)"),  # window (12, 20]: cut at 16
    ({"buffer": 16}, "covers the whole completion budget"),  # max_length follows max_completion_length (16)
])
def test_overlong_window(tmp_path, args, expected):
    text = fired(recipe_with(tmp_path, {"max_completion_length": 16}, rewards=overlong(**args)))["overlong-window"]
    assert "rewards[1].args" in text and expected in text


def test_overlong_window_within_budget_is_clean(tmp_path):
    assert "overlong-window" not in fired(recipe_with(tmp_path, {"max_completion_length": 16}, rewards=overlong(buffer=4)))


def test_overlong_unmasked_in_a_dapo_recipe(tmp_path):
    dapo = {"epsilon_high": 0.28, "steps_per_generation": 2}  # clip-higher: the recipe claims DAPO
    text = fired(recipe_with(tmp_path, dapo, rewards=overlong(buffer=4)))["overlong-unmasked"]
    assert "trainer.mask_truncated_completions: true" in text
    masked = {**dapo, "mask_truncated_completions": True}
    assert "overlong-unmasked" not in fired(recipe_with(tmp_path, masked, rewards=overlong(buffer=4)))
    # Not DAPO (no clip-higher, no dynamic sampling, not named dapo): the penalty alone is a plain length shaping.
    assert "overlong-unmasked" not in fired(recipe_with(tmp_path, rewards=overlong(buffer=4)))


def test_thinking_room(tmp_path):
    # The thinking template's block and an answer cannot fit 256 tokens; 1024 leaves it room; no thinking, no warning.
    short = recipe_with(tmp_path, {"max_completion_length": 256})
    text = fired(short, thinking_template="qwen3_5_think (TRL's, model.chat_template)")["thinking-room"]
    assert "trainer.max_completion_length: is 256 tokens, and under qwen3_5_think" in text
    assert "qwen3_5_nothink" in text and "enable_thinking: false" in text  # the ways out
    roomy = recipe_with(tmp_path, {"max_completion_length": 1024})
    assert "thinking-room" not in fired(roomy, thinking_template="qwen3_5_think")
    assert "thinking-room" not in fired(short)


def test_every_rule_is_tested_here():
    import inspect
    import sys

    source = inspect.getsource(sys.modules[__name__])
    assert all(f'"{name}"' in source for name in RULES)


# -- the CLI --------------------------------------------------------------------------------------------


def test_check_prints_a_warning_line_and_passes(tmp_path, capsys):
    data = recipe_dict()
    data["trainer"].update(epsilon_high=0.28, temperature=0.2, output_dir=str(tmp_path / "run"))
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("warning [")]
    assert [line.split("]")[0] for line in lines] == ["warning [clip-on-policy", "warning [low-temperature"]
    assert "check passed" in out


def test_check_measures_answer_lengths_for_truncation(tmp_path, capsys):
    """The dataset's reference answers, tokenized by the model's tokenizer, against the completion budget."""
    rows = "\n".join(f'{{"prompt": "Say {i}.", "answer": "{"a" * 40}"}}' for i in range(8))
    (tmp_path / "long.jsonl").write_text(rows + "\n")
    data = recipe_dict()
    data["dataset"]["path"] = "long.jsonl"
    data["trainer"].update(mask_truncated_completions=True, output_dir=str(tmp_path / "run"))
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    out = capsys.readouterr().out
    assert "warning [mask-most-truncated]" in out and "measured on 8 rows" in out  # a character tokenizer: 40 tokens


def test_a_recipe_silences_a_warning_it_means(tmp_path, capsys):
    data = recipe_dict()
    data["trainer"].update(epsilon_high=0.28, output_dir=str(tmp_path / "run"))
    data["lint"] = {"ignore": ["clip-on-policy"]}
    path = write_recipe(tmp_path, data)
    assert main(["--recipe", str(path), "--check", "--full"]) == 0
    out = capsys.readouterr().out
    assert "warning [" not in out and "check passed" in out
    assert "ignore:\n  - clip-on-policy" in out  # the resolved recipe keeps it, so a saved run reruns as quietly


def test_an_unknown_rule_name_is_refused_with_the_nearest(tmp_path, capsys):
    data = recipe_dict()
    data["lint"] = {"ignore": ["clip-on-polcy"]}
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "lint.ignore[0]: is not a lint rule (got 'clip-on-polcy')" in err
    assert "did you mean 'clip-on-policy'?" in err and "Traceback" not in err


def test_the_lint_section_is_validated(tmp_path, capsys):
    data = recipe_dict()
    data["lint"] = {"ignore": "clip-on-policy", "silence": True}
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "lint.ignore: has the wrong type" in err and "lint.silence: is not a known key" in err


# -- the generation engine (trainer.use_vllm): the plan's figures as facts, no vLLM import ----------------


def vllm_facts(recipe, **share):
    """--check's facts for `recipe` generating with vLLM, planned on Qwen2.5-1.5B's shipped config."""
    from grpokit.planning import vllm_share

    args = grpo_args(recipe)
    model = {"name_or_path": "Qwen/Qwen2.5-1.5B-Instruct"}
    plan = vllm_share.plan_for(args, model=model, lora=recipe.lora, prompt_length=256, **share)
    asleep = None if plan.engine.sleep else vllm_share.plan_for(args, model=model, lora=recipe.lora,
                                                                prompt_length=256, sleep=True, **share)
    return {"vllm_plan": plan, "vllm_plan_asleep": asleep, "prompt_length": 256}


# the shipped 1.5B shape: 64 completions of 256 + 1024 tokens per generation, micro-batch 8
SHAPE = {"use_vllm": True, "per_device_train_batch_size": 8, "num_generations": 8, "steps_per_generation": 8,
         "max_completion_length": 1024, "vllm_max_model_length": 1280}


def test_vllm_kv_preempt(tmp_path):
    r = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.3, "vllm_enable_sleep_mode": True})
    text = fired(r, **vllm_facts(r))["vllm-kv-preempt"]
    # on the default card, a T4's 15 GiB
    assert "needs 81,920 (64 sequences x 1280 tokens)" in text and "raise trainer.vllm_gpu_memory_utilization to 0.38" in text
    ok = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.4, "vllm_enable_sleep_mode": True})
    assert fired(ok, **vllm_facts(ok)) == {}
    assert "vllm-kv-preempt" not in fired(r)  # no plan (model not reachable): silent


def test_vllm_no_training_room(tmp_path):
    start = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.9, "vllm_enable_sleep_mode": True})
    text = fired(start, **vllm_facts(start))["vllm-no-training-room"]
    assert "vLLM refuses to start" in text and "lower trainer.vllm_gpu_memory_utilization to at most" in text
    small = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.15, "vllm_enable_sleep_mode": True})
    assert "raise trainer.vllm_gpu_memory_utilization" in fired(small, **vllm_facts(small))["vllm-no-training-room"]
    # asleep, but the training phase itself is over the card: vLLM's 0.25 GiB is part of it, the fix is the batch
    big = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.4, "vllm_enable_sleep_mode": True,
                                 "per_device_train_batch_size": 64, "steps_per_generation": 1})
    text = fired(big, **vllm_facts(big))["vllm-no-training-room"]
    assert "the training phase needs" in text and "asleep" in text and "per_device_train_batch_size" in text


def test_vllm_needs_sleep(tmp_path):
    # awake, vLLM's 7.2 GiB share and a 16-completion micro-batch's backward do not fit together; asleep they do
    awake = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.45, "per_device_train_batch_size": 16,
                                   "steps_per_generation": 4})
    found = fired(awake, **vllm_facts(awake))
    assert "trainer.vllm_enable_sleep_mode: true" in found["vllm-needs-sleep"]
    assert "vllm-no-training-room" not in found  # one warning, the one that fixes it
    asleep = recipe_with(tmp_path, {**SHAPE, "vllm_gpu_memory_utilization": 0.45, "per_device_train_batch_size": 16,
                                    "steps_per_generation": 4, "vllm_enable_sleep_mode": True})
    assert "vllm-needs-sleep" not in fired(asleep, **vllm_facts(asleep))


def test_vllm_max_model_len(tmp_path):
    unset = {k: v for k, v in SHAPE.items() if k != "vllm_max_model_length"}
    r = recipe_with(tmp_path, {**unset, "vllm_gpu_memory_utilization": 0.25, "vllm_enable_sleep_mode": True})
    text = fired(r, **vllm_facts(r))["vllm-max-model-len"]
    assert "less than one max_model_len sequence (32,768" in text and "vllm_max_model_length: 1280" in text
    short = recipe_with(tmp_path, {**SHAPE, "vllm_max_model_length": 1024, "vllm_gpu_memory_utilization": 0.4,
                                   "vllm_enable_sleep_mode": True})
    text = fired(short, **vllm_facts(short))["vllm-max-model-len"]
    assert "1024 is below the longest prompt (256 tokens) + max_completion_length 1024" in text


def test_vllm_knobs_off(tmp_path):
    text = fired(recipe_with(tmp_path, {"vllm_gpu_memory_utilization": 0.4}))["vllm-knobs-off"]
    assert "trainer.vllm_gpu_memory_utilization" in text and "trainer.use_vllm is false" in text
    assert "vllm-knobs-off" not in fired(recipe_with(tmp_path, {"use_vllm": True, "vllm_gpu_memory_utilization": 0.4}))


def test_bf16_unsupported(tmp_path):
    t4 = {"name": "Tesla T4", "bf16": False}
    r = recipe_with(tmp_path, {"use_vllm": True}, model={**recipe_dict()["model"], "dtype": "bfloat16"})
    text = fired(r, gpu=t4)["bf16-unsupported"]
    assert "Tesla T4" in text and "model.dtype: auto" in text and "vLLM refuses bfloat16" in text
    assert "bf16-unsupported" not in fired(r, gpu={"name": "NVIDIA L4", "bf16": True})
    assert "bf16-unsupported" not in fired(r)  # no GPU here: nothing to say
    assert "bf16-unsupported" not in fired(recipe_with(tmp_path), gpu=t4)  # dtype auto picks float16 there


# -- tool use (the tools section): rounds against the completion budget, and the overlong penalty's count


def tool_recipe_with(tmp_path, trainer, rewards=None):
    (tmp_path / "env.py").write_text(
        "class Env:\n    def reset(self, **row):\n        pass\n\n"
        "    def add(self, a: int, b: int) -> int:\n        \"\"\"Add.\n\n        Args:\n            a: x\n            b: y\n        \"\"\"\n"
        "        return a + b\n")
    data = recipe_dict(**({"rewards": rewards} if rewards else {}))
    data["tools"] = {"environment": "env.py:Env"}
    data["trainer"].update(trainer, output_dir=str(tmp_path / "run"))
    return validate(load(write_recipe(tmp_path, data)))


def test_tool_budget_measures_rounds_against_the_completion_budget(tmp_path):
    tight = tool_recipe_with(tmp_path, {"max_completion_length": 64, "max_tool_calling_iterations": 2})
    assert "2 round(s) of tool calls take at least 60 of the 64-token" in fired(tight, tool_round_tokens=30)["tool-budget"]
    roomy = tool_recipe_with(tmp_path, {"max_completion_length": 256, "max_tool_calling_iterations": 2})
    assert "tool-budget" not in fired(roomy, tool_round_tokens=30)
    unbounded = tool_recipe_with(tmp_path, {"max_completion_length": 256})
    assert "is unset: rounds of tool calls stop only" in fired(unbounded, tool_round_tokens=30)["tool-budget"]
    assert "tool-budget" not in fired(tight)  # without the measured round cost it says nothing


def test_overlong_counts_tools_only_with_tools_and_the_penalty(tmp_path):
    penalty = [{"name": "char_fraction", "args": {"char": "a"}}, {"name": "overlong_penalty", "args": {"buffer": 4}}]
    assert "overlong-counts-tools" in fired(tool_recipe_with(tmp_path, {"max_tool_calling_iterations": 1}, penalty))
    assert "overlong-counts-tools" not in fired(recipe_with(tmp_path, rewards=penalty))


def test_bf16_on_a_cpu_without_bf16_instructions_is_said_to_be_emulated(tmp_path):
    r = recipe_with(tmp_path, model={**recipe_dict()["model"], "dtype": "bfloat16"})
    text = fired(r, cpu_bf16=False)["bf16-unsupported"]
    assert "[bf16-unsupported] model.dtype: bfloat16 on this CPU, which has no bfloat16 instructions" in text, text
    assert "emulates it" in text and "set model.dtype: auto (float32 on this CPU)" in text
    assert "bf16-unsupported" not in fired(r, cpu_bf16=True)  # AVX512-BF16 / AMX: computed natively
    assert "bf16-unsupported" not in fired(recipe_with(tmp_path), cpu_bf16=False)  # auto picks float32 there
    # a run on a GPU is judged by the GPU
    assert "bf16-unsupported" not in fired(r, cpu_bf16=False, gpu={"name": "NVIDIA L4", "bf16": True})


def test_check_says_bf16_is_emulated_on_a_cpu_without_it(tmp_path, capsys, monkeypatch, no_weights):
    from grpokit.run import check
    from grpokit import cpu

    monkeypatch.setattr(check, "gpu_facts", lambda: None)  # the CPU path, on any machine
    monkeypatch.setattr(cpu, "cpu_computes_bf16", lambda *a: False)
    data = recipe_dict(model={**recipe_dict()["model"], "dtype": "bfloat16"})
    data["trainer"]["output_dir"] = str(tmp_path / "run")
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    assert "model.dtype: bfloat16 on this CPU, which has no bfloat16 instructions" in capsys.readouterr().out
