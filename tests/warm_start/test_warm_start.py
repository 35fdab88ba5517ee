"""The warm start (`warm_start:`, grpokit/warm_start/): worked exchanges, which of their tokens carry the loss, the rules
of the section, --check's account of it, and a real run: TRL's SFTTrainer, merged, then GRPO from it, in one run
whose folder keeps it and whose --resume uses it without training it again."""

from __future__ import annotations

import json

import pytest
import yaml

from grpokit import config
from grpokit.tools import tooluse
from grpokit.cli import main
from grpokit.config import validate
from grpokit.warm_start import worked as examples
from tests.helpers import ROOT, write_recipe

QUESTION = "Solve the following multiplication: 709 * 132 * 653. Give only the result as your final answer."
MULTI_CALL = ROOT / "recipes" / "smollm2-135m" / "multi_call.yaml"


def tiny_recipe(tmp_path, **warm) -> dict:
    """A warm-start recipe on the tiny model: products with the two-integer calculator, one round of calls."""
    return {
        "model": {"name_or_path": "builtin:tiny-llama", "chat_template": "qwen2_5"},
        "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"},
        "warm_start": {"from_task": {"size": 4}, "steps": 2, "batch_size": 2, "learning_rate": 1.0e-3, **warm},
        "dataset": {"reasoning_gym": {"tasks": [{"name": "products", "config": {"min_terms": 3, "max_terms": 3,
                                                                                 "min_digits": 1, "max_digits": 2}}],
                                      "size": 8, "seed": 1, "eval_size": 4},
                    "system_prompt": "Use the tools."},
        "tools": {"environment": "grpokit.tools.environments:Calculator"},
        "rewards": [{"name": "task_score", "args": {"answer_from": "last_number"}}],
        "trainer": {"max_steps": 1, "per_device_train_batch_size": 4, "num_generations": 4,
                    "max_completion_length": 320, "max_tool_calling_iterations": 1, "learning_rate": 1.0e-3,
                    "lr_scheduler_type": "constant", "logging_steps": 1, "save_steps": 1, "seed": 0,
                    "gradient_checkpointing": False, "output_dir": str(tmp_path / "run")},
    }


def test_a_products_exchange_is_two_calls_that_reach_the_answer():
    messages = examples.product_exchange([{"role": "user", "content": QUESTION}], QUESTION, "61112964", "multiply")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    first, second = (m["tool_calls"][0]["function"] for m in (messages[1], messages[3]))
    assert first == {"name": "multiply", "arguments": {"a": 709, "b": 132}}
    assert second == {"name": "multiply", "arguments": {"a": 709 * 132, "b": 653}}  # reads the first's result
    assert messages[2]["content"] == str(709 * 132) and messages[4]["content"] == str(709 * 132 * 653)
    assert messages[-1]["content"] == "61112964"  # reasoning-gym's own answer to this question
    with pytest.raises(ValueError, match="not the task's answer"):  # a writer that disagrees with the task is refused
        examples.product_exchange([], QUESTION, "5", "multiply")


CHAIN = "State the final answer to the following arithmetic problem: 205 - 838 + 505 - 7 ="


def test_a_chain_sum_exchange_works_left_to_right_with_add_and_subtract():
    messages = examples.chain_sum_exchange([{"role": "user", "content": CHAIN}], CHAIN, "-135")
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "tool"] * 3 + ["assistant"]
    calls = [m["tool_calls"][0]["function"] for m in messages if m.get("tool_calls")]
    assert calls == [{"name": "subtract", "arguments": {"a": 205, "b": 838}},
                     {"name": "add", "arguments": {"a": -633, "b": 505}},  # each reads the one before's result
                     {"name": "subtract", "arguments": {"a": -128, "b": 7}}]
    assert [m["content"] for m in messages if m["role"] == "tool"] == ["-633", "-128", "-135"]
    assert messages[-1]["content"] == "-135"
    with pytest.raises(ValueError, match="not the task's answer"):
        examples.chain_sum_exchange([], CHAIN, "5")
    with pytest.raises(ValueError, match="no chain"):
        examples.chain_sum_exchange([], QUESTION, None)


def test_the_loss_falls_on_the_assistant_turns_only(tiny_model_dir):
    from grpokit.trainer import models

    recipe = validate(config.load(MULTI_CALL))
    tokenizer = models.load_tokenizer(str(tiny_model_dir), recipe)  # the recipe's qwen2_5 template
    tools = tooluse.template_tools(tooluse.resolve(recipe.tools))
    prompt = [{"role": "system", "content": recipe.dataset["system_prompt"]}, {"role": "user", "content": QUESTION}]
    messages = examples.product_exchange(prompt, QUESTION, None, "multiply")
    ids, mask = examples.tokens_and_labels(tokenizer, messages, tools)
    assert ids == tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False)
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    untrained = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert trained.count("<tool_call>") == 2 and '"a": 93588, "b": 653' in trained
    assert trained.rstrip().endswith("61112964<|im_end|>")
    # the tool results are the environment's (GRPO masks them too); the prompt and the role headers are not the model's
    assert "<tool_response>" not in trained and "<tool_response>" in untrained
    assert "93588\n</tool_response>" in untrained and "Solve the following" in untrained
    assert "<|im_start|>assistant" not in trained and untrained.count("<|im_start|>assistant") == 3


@pytest.mark.parametrize("change, fragments", [
    # a task grpokit cannot work a problem of: refused at --check, saying to give a file
    ({"dataset.reasoning_gym.tasks": [{"name": "leg_counting"}]},
     ["warm_start.from_task: grpokit writes worked exchanges only for products (with multiply), chain_sum (with add "
      "and subtract); for leg_counting give warm_start.examples"]),
    # seeds that meet training's: the warm start would show training problems
    ({"warm_start.from_task": {"size": 4, "seed": 5}}, ["warm_start.from_task.seed: its problems come from seeds 5..8, "
                                                        "which meet training's 1..8", "a seed >= 13"]),
    # a typo'd key inside the section's own lora, with the nearest name
    ({"warm_start.lora": {"rr": 4}}, ["warm_start.lora.rr: is not a LoraConfig field", "did you mean 'r'?"]),
])
def test_what_a_warm_start_cannot_do_is_said_before_anything_loads(tmp_path, capsys, no_weights, change, fragments):
    data = tiny_recipe(tmp_path)
    for dotted, value in change.items():
        section, key = dotted.rsplit(".", 1)
        target = data
        for part in section.split("."):
            target = target[part]
        target[key] = value
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert all(f in err for f in fragments), err
    assert "Traceback" not in err


def test_a_warm_start_runs_in_one_process(tmp_path, no_weights):
    from grpokit.errors import RecipeError

    with pytest.raises(RecipeError, match="warm_start: runs its supervised pass in one process, and this run has 2"):
        validate(config.load(write_recipe(tmp_path, tiny_recipe(tmp_path))), num_processes=2)


def test_a_file_of_exchanges_goes_after_the_recipes_prompt_and_may_not_ask_a_heldout_question(tmp_path, capsys, no_weights):
    from grpokit.prompts import tasks

    recipe = validate(config.load(write_recipe(tmp_path, tiny_recipe(tmp_path))))
    heldout = tasks.generate(recipe.dataset["reasoning_gym"], heldout=True).rows[0]["prompt"]
    call = {"role": "assistant", "tool_calls": [{"name": "multiply", "arguments": {"a": 2, "b": 3}}]}
    lines = [{"messages": [{"role": "user", "content": "What is 2 * 3?"}, call,
                           {"role": "tool", "name": "multiply", "content": "6"}, {"role": "assistant", "content": "6"}]}]
    (tmp_path / "worked.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    worked = examples.from_file(str(tmp_path / "worked.jsonl"), recipe.dataset, ["multiply"])
    assert worked.exchanges[0][0] == {"role": "system", "content": "Use the tools."}  # the prompt training sees
    assert worked.exchanges[0][2]["tool_calls"][0]["function"]["name"] == "multiply"  # TRL's form
    lines.append({"messages": [{"role": "user", "content": heldout}, {"role": "assistant", "content": "1"}]})
    (tmp_path / "worked.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    data = tiny_recipe(tmp_path)
    data["warm_start"] = {"examples": "worked.jsonl"}  # beside the recipe
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "warm_start: 1 of its exchanges ask a training or held-out question" in err, err


def test_check_explains_the_warm_start(tmp_path, capsys, no_weights):
    assert main(["--recipe", str(write_recipe(tmp_path, tiny_recipe(tmp_path))), "--check"]) == 0
    out = capsys.readouterr().out
    section = out[out.index("# warm start"):].split("\n\n")[0]
    assert "4 products problems from reasoning-gym seeds 13..16" in section  # past training's 1..8 and held-out 9..12
    assert "user -> assistant calls multiply -> tool -> assistant calls multiply -> tool -> assistant answers" in section
    assert "2 steps of 2 exchanges: 4 seen" in section and "TRL's SFTTrainer, LoRA r=4" in section
    assert f"kept in       {tmp_path / 'run' / 'warm_start'}" in section and "why " in section
    assert "  time          not measured for this model and shape" in section  # bench measured SmolLM2's, not tiny's


def test_check_gives_the_warm_starts_time_from_benchs_measured_figure(capsys, monkeypatch, no_weights):
    from grpokit.run import check
    from grpokit.planning.cpu_time import WARM_START_RESULTS

    monkeypatch.setattr(check, "gpu_facts", lambda: None)  # the CPU path, which bench measured
    assert main(["--recipe", str(MULTI_CALL), "--check"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  time   "))
    tried = json.loads((ROOT / WARM_START_RESULTS).read_text())
    assert f"on {tried['machine']} as bench measured" in line and f"{tried['when']}: {WARM_START_RESULTS}" in line
    assert len(line) < 160, line


def test_chain_sum_problems_are_worked_with_the_calculators_add_and_subtract(tmp_path, capsys, no_weights):
    data = tiny_recipe(tmp_path)
    data["dataset"]["reasoning_gym"]["tasks"] = [{"name": "chain_sum", "config": {"min_terms": 3, "max_terms": 3}}]
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 0
    section = capsys.readouterr().out.split("# warm start", 1)[1].split("\n\n")[0]
    assert "4 chain_sum problems from reasoning-gym seeds 13..16, each worked with the tools add and subtract" in section
    assert "user -> assistant calls " in section and "-> tool -> assistant calls " in section
    # every exchange reaches reasoning-gym's own answer (a writer that disagrees is refused, above)
    recipe = validate(config.load(write_recipe(tmp_path, data)))
    worked = examples.from_task(recipe.warm_start["from_task"], recipe.dataset, ["add", "subtract", "multiply"])
    assert len(worked.exchanges) == 4 and all(len(e) == 7 for e in worked.exchanges)  # system, user, 2 x (call, result), answer


def test_the_warm_starts_step_lines_give_its_pace_and_the_time_left(capsys):
    from types import SimpleNamespace

    from grpokit.run import supervised

    losses = []
    steps = supervised._Steps(10, losses, clock=iter([0.0, 40.0, 40.0, 56.0]).__next__)  # steps of 40 s, then 16 s
    for step, loss in ((1, 0.9), (2, 0.5)):
        steps.on_step_begin(None, None, None)
        steps.on_step_end(None, None, None)
        steps.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": loss})
    out = capsys.readouterr().out
    assert "warm start step 1/10: loss 0.900  first step 40 s (warm-up)" in out
    assert "warm start step 2/10: loss 0.500  16 s/step, ~2 min left" in out and losses == [0.9, 0.5]


def test_a_warm_start_far_slower_than_checks_figure_says_so():
    from types import SimpleNamespace

    from grpokit.run import supervised
    from grpokit.planning.cpu_time import WARM_START_RESULTS

    recipe = validate(config.load(MULTI_CALL))
    rows = [([0] * 610, [1] * 610)] * 4  # exchanges of the measured length
    prep = SimpleNamespace(recipe=recipe, warm_start=SimpleNamespace(rows=rows))
    lora = supervised.adapter(recipe.warm_start, recipe.lora)
    tried = json.loads((ROOT / WARM_START_RESULTS).read_text())["warm_starts"]
    per_step = [m["seconds"] / m["steps"] for m in (e.get("made") for e in tried.values()) if m]
    expected = sum(per_step) / len(per_step) * recipe.warm_start["steps"]
    said = supervised.against_measured(4 * expected, prep, lora, on_cpu=True)
    assert said.startswith(f"warm start: its 10 steps took {4 * expected:.0f} s, 4.0x the {expected:.0f} s --check gave (")
    assert said.endswith("this machine is slower or busier than bench's")
    assert supervised.against_measured(1.2 * expected, prep, lora, on_cpu=True) is None  # within the tolerance
    assert supervised.against_measured(4 * expected, prep, lora, on_cpu=False) is None  # bench measured a CPU


@pytest.mark.slow
def test_one_run_trains_the_warm_start_then_grpo_from_it_and_resume_reuses_it(tmp_path, monkeypatch):
    import trl

    from grpokit.run import supervised

    labels = []
    real_loss = trl.SFTTrainer.compute_loss

    def compute_loss(self, model, inputs, *args, **kwargs):  # what the supervised pass is trained on, as it gets it
        labels.append((inputs["input_ids"].tolist(), inputs["labels"].tolist()))
        return real_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trl.SFTTrainer, "compute_loss", compute_loss)
    path = write_recipe(tmp_path, tiny_recipe(tmp_path))
    assert main(["--recipe", str(path), "--threads", "1"]) == 0
    run = tmp_path / "run"
    warm = run / "warm_start"
    record = json.loads((warm / "warm_start.json").read_text())
    assert record["examples"] == 4 and len(record["loss"]) == 2 and (warm / "model.safetensors").is_file()
    # GRPO trained its adapter on the warm start, not on the recipe's model
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == str(warm)
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 1
    # only the assistant's turns carry a loss: no tool result, prompt or role header
    from grpokit.trainer import models

    tokenizer = models.load_tokenizer(str(warm), validate(config.load(path)))  # the recipe's template
    for ids, rows in labels:
        for row, label in zip(ids, rows):
            trained = tokenizer.decode([t for t, lab in zip(row, label) if lab != -100])
            assert trained.count("<tool_call>") == 2 and "<tool_response>" not in trained
            assert "Use the tools." not in trained and "<|im_start|>" not in trained
    assert len(labels) == 4  # 2 steps of 2 exchanges, one exchange at a time
    # --eval and --merge of the run, or of a checkpoint, put its adapter on the warm start
    from grpokit.run import evaluate, merge

    recipe = validate(config.load(path))
    assert evaluate._warm_start(recipe, str(run / "checkpoint-1")) == warm
    assert evaluate._warm_start(recipe, None) is None  # the base's figures are the recipe's own model's
    assert merge.base_model(run)[0] == str(warm)
    # --resume uses the warm start as it is: never trained again, its files untouched
    stamps = {p.name: p.stat().st_mtime_ns for p in warm.iterdir()}
    monkeypatch.setattr(supervised, "make", lambda *a, **k: pytest.fail("the warm start was trained again on --resume"))
    assert main(["--recipe", str(path), "--threads", "1", "--resume", "trainer.max_steps=2"]) == 0
    assert {p.name: p.stat().st_mtime_ns for p in warm.iterdir()} == stamps
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 2
    assert len(labels) == 4


@pytest.mark.slow
def test_a_warm_started_runs_report_card_adapter_and_eval_name_the_warm_start(tmp_path, capsys):
    run = tmp_path / "run"
    # the shipped recipe, its warm start and GRPO shortened, on the tiny model (its sections as shipped)
    short = [f"trainer.output_dir={run}", "model.name_or_path=builtin:tiny-llama", "warm_start.steps=1",
             "warm_start.batch_size=1", "warm_start.from_task.size=1", "trainer.max_steps=1", "trainer.save_steps=1",
             "trainer.per_device_train_batch_size=2", "trainer.num_generations=2", "trainer.max_completion_length=320",
             "trainer.max_tool_calling_iterations=1", "dataset.reasoning_gym.eval_size=1"]
    assert main(["--recipe", str(MULTI_CALL), "--threads", "1", *short]) == 0
    warm = run / "warm_start"
    made = json.loads((warm / "warm_start.json").read_text())
    # the adapter's base is the warm start, itself made from the recipe's model
    assert json.loads((run / "adapter_config.json").read_text())["base_model_name_or_path"] == str(warm)
    assert made["from_model"] == "builtin:tiny-llama" and made["steps"] == 1 and made["examples"] == 1
    card = (run / "README.md").read_text()
    assert "a LoRA adapter (r=16) for this run's warm start" in card and "base_model:" not in card
    assert "- base model: this run's warm start, `warm_start/` in this folder: `builtin:tiny-llama` after 1 supervised " \
           "steps on 1 worked exchanges" in card
    report = (run / "report.md").read_text()
    section = report[report.index("## Warm start"):].split("\n## ")[0]
    assert "- From: `builtin:tiny-llama`" in section and "- Trained on: 1 worked exchanges" in section
    assert f"- Loss: {made['loss'][0]:.4g} at its first step" in section and f"- Time: {made['seconds']:.0f} s" in section

    # --eval: the base, the warm start and the run, each change put down to what made it
    for scored in ([], [str(warm)], [str(run)]):
        assert main(["--recipe", str(MULTI_CALL), "--threads", "1", *short, "--eval", *scored]) == 0
    figures = {name: json.loads((run / name).read_text())["greedy"]["pass@1"]
               for name in ("eval-base.json", "eval-warm-start.json", "eval.json")}
    assert json.loads((run / "eval-base.json").read_text()).get("warm_start") is None  # the recipe's own model
    table = (run / "report.md").read_text().split("## Held-out eval", 1)[1]
    assert "| | base model (`builtin:tiny-llama`) | warm start (builtin:tiny-llama after 1 supervised steps on 1 worked " \
           "exchanges) | after (this run: GRPO from the warm start) |" in table and "before (base model)" not in table
    warm_change = figures["eval-warm-start.json"] - figures["eval-base.json"]
    grpo_change = figures["eval.json"] - figures["eval-warm-start.json"]
    assert (f"| change in pass@1 | — | {warm_change:+.3f} (the warm start's 1 supervised steps) | {grpo_change:+.3f} "
            "(1 GRPO steps, from the warm start) |") in table
