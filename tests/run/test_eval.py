"""`--eval`: held-out scoring of a base model or a trained run, eval.json, the report's before/after, TRL's eval_dataset.

The trained-run cases use the tiny model (seconds); the real model's `--eval` runs on 4 prompts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpokit import cli
from grpokit.run import evaluate
from grpokit.files import ownership
from grpokit.checkpoints.rundir import BASE_EVAL_FILE, EVAL_FILE, guard_output_dir, remove_previous
from tests.helpers import ROOT, SMOKE_DATA, with_trainer, write_recipe

REAL_RECIPE = ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml"


def tiny_recipe(tmp_path, **trainer) -> Path:
    """The smoke-like recipe with its own prompts as held-out data (4 of them)."""
    data = with_trainer(tmp_path, **trainer)
    data["dataset"].update(eval_path=str(SMOKE_DATA), eval_limit=4)
    return write_recipe(tmp_path, data)


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0),    # no sample passes
    (4, 4, 1, 1.0),    # every sample passes
    (4, 1, 1, 0.25),   # pass@1 is the pass rate
    (4, 1, 4, 1.0),    # one pass among all k drawn
    (4, 2, 2, 1 - 1 / 6),  # 1 - C(2,2)/C(4,2)
])
def test_pass_at_k_is_the_unbiased_estimator(n, c, k, expected):
    assert evaluate.pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.slow
def test_eval_json_for_base_then_trained_run_and_the_report_compares_them(tmp_path, capsys):
    path = tiny_recipe(tmp_path)
    run = tmp_path / "run"
    assert cli.main(["--recipe", str(path), "--eval"]) == 0  # the base model, before any run exists
    assert last_line(capsys).startswith("pass@1 ")
    base = json.loads((run / BASE_EVAL_FILE).read_text())
    assert base["run_dir"] is None and base["prompts"] == 4 and base["pass_reward"] == "char_fraction"

    assert cli.main(["--recipe", str(path)]) == 0  # eval-base.json does not count as a previous run
    assert cli.main(["--recipe", str(path), "--eval", str(run), "--eval-samples", "2"]) == 0
    line = last_line(capsys)
    assert line.startswith("pass@1 ") and "/4 held-out prompts" in line and "pass@2" in line
    after = json.loads((run / EVAL_FILE).read_text())
    assert after["run_dir"] == str(run) and after["sampled"]["k"] == 2
    assert 0.0 <= after["sampled"]["mean@2"] <= after["sampled"]["pass@2"] <= 1.0
    assert set(after["greedy"]["rewards"]) == {"char_fraction", "reward"}
    assert after["examples"] and {"prompt", "answer", "completion", "rewards"} <= set(after["examples"][0])
    report = (run / "report.md").read_text()
    assert "## Held-out eval" in report and "before (base model)" in report and "after (this run)" in report
    change = after["greedy"]["pass@1"] - base["greedy"]["pass@1"]
    assert f"| change in pass@1 | — | {change:+.3f} (" in report


def test_eval_out_and_an_override_right_after_eval(tmp_path, capsys):
    out = tmp_path / "elsewhere.json"
    # `--eval dataset.eval_limit=2` is an override, not a RUN_DIR named "dataset.eval_limit=2"
    assert cli.main(["--recipe", str(tiny_recipe(tmp_path)), "--eval", "dataset.eval_limit=2", "--eval-out", str(out)]) == 0
    assert json.loads(out.read_text())["prompts"] == 2
    assert last_line(capsys).startswith("pass@1 ")


def corrupt_adapter(tmp_path) -> Path:
    """A run directory whose adapter_config.json was cut off mid-write."""
    run = tmp_path / "cut"
    run.mkdir()
    (run / "adapter_config.json").write_text('{"r": 8, "lora_al')
    return run


@pytest.mark.parametrize("args, expected", [
    (["--eval", "{tmp}"], "--eval: is not a trained run or checkpoint"),         # a folder without a model
    (["--eval", "--eval-out", "{tmp}"], "--eval-out: names a directory; give a file path"),  # found after the whole eval
    (["--eval", "{cut}"], "adapter_config.json is not valid JSON (line 1, column 10: Unterminated string"),  # PEFT's JSONDecodeError traceback
    (["--eval", "--eval-out", "{recipe}/eval.json"], "--eval-out: cannot be created: {recipe} is a file"),
])
def test_eval_inputs_and_outputs_are_checked_before_any_weights_load(tmp_path, capsys, no_weights, args, expected):
    recipe = tiny_recipe(tmp_path)
    fill = dict(tmp=tmp_path, cut=corrupt_adapter(tmp_path), recipe=recipe)
    argv = ["--recipe", str(recipe)] + [a.format(**fill) for a in args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected.format(**fill) in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["-1", "100000000", "two"])
def test_eval_samples_is_bounded_when_the_command_line_is_read(tmp_path, capsys, no_weights, value):
    """100000000 was taken and ended, after the greedy pass, in an allocation traceback."""
    with pytest.raises(SystemExit) as caught:
        cli.main(["--recipe", str(tiny_recipe(tmp_path)), "--eval", "--eval-samples", value])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert (f"argument --eval-samples: must be a whole number of samples per prompt from 0 (greedy only) to "
            f"{evaluate.MAX_SAMPLES} (got {value!r})") in err and "Traceback" not in err


def test_eval_without_heldout_data_says_which_key_to_set(tmp_path, capsys):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    assert cli.main(["--recipe", str(path), "--eval"]) == 2
    assert "dataset.eval_path: --eval and trainer.eval_strategy need held-out data" in capsys.readouterr().err


@pytest.mark.parametrize("dataset, trainer, expected", [
    ({"eval_path": str(SMOKE_DATA), "eval_split": "test"}, {}, "dataset.eval_split: give one of"),
    ({"eval_split": "test"}, {}, "dataset.eval_split: names a split of a hub dataset"),
    ({"eval_limit": 4}, {}, "dataset.eval_limit: limits held-out data the recipe does not name"),
    ({}, {"eval_strategy": "steps"}, "trainer.eval_strategy: evaluates on held-out data the recipe does not name"),
])
def test_heldout_keys_are_validated(tmp_path, capsys, dataset, trainer, expected):
    data = with_trainer(tmp_path, **trainer)
    data["dataset"].update(dataset)
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    assert expected in capsys.readouterr().err


def test_eval_strategy_hands_the_heldout_split_to_trl(tmp_path):
    from grpokit.run import build
    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model

    path = tiny_recipe(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=4)
    prep = build.prepare(validate(load(path)), mode="train")
    trainer = build.make_trainer(prep, load_model(prep.model_path, prep.recipe))
    assert len(trainer.eval_dataset) == 4 and trainer.eval_dataset[0]["prompt"] == prep.dataset[0]["prompt"]
    assert "eval_reward" in trainer.evaluate()  # TRL's own evaluation loop runs on it


def test_base_eval_survives_overwrite(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / BASE_EVAL_FILE).write_text("{}")
    guard_output_dir(run, None, False, "r.yaml")  # only the base eval: not a previous run
    (run / "trainer_state.json").write_text("{}")
    (run / "checkpoint-1").mkdir()
    ownership.claim(run, ["trainer_state.json", "checkpoint-1"])  # the previous run, as its manifest lists it
    previous = guard_output_dir(run, None, True, "r.yaml")
    remove_previous(run, previous, "r.yaml")
    assert ownership.entries(run) == [BASE_EVAL_FILE]


@pytest.mark.slow
def test_eval_of_the_real_model_on_a_handful_of_heldout_prompts(tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["--recipe", str(REAL_RECIPE), "--eval", "--eval-out", str(out), "dataset.eval_limit=4",
            "trainer.max_completion_length=12"]
    assert cli.main(argv) == 0
    assert last_line(capsys).startswith("pass@1 ")
    result = json.loads(out.read_text())
    assert result["model"] == "builtin:smollm2-135m-instruct" and result["prompts"] == 4
    assert result["pass_reward"] == "accuracy" and 0 <= result["greedy"]["passed"] <= 4
    assert result["greedy"]["pass@1"] == result["greedy"]["passed"] / 4
    assert result["examples"][0]["answer"].endswith("#### 28")  # held-out row 1: 11 + 17


def test_a_lora_run_is_scored_with_the_adapter_merged(tmp_path, tiny_model_dir):
    """An unquantized base gets the adapter merged into its weights (plain matmuls while generating), and its greedy
    completions are the adapter's own; a quantized base keeps the adapter apart."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from grpokit.run.evaluate import _with_adapter

    torch.manual_seed(0)
    base = lambda: AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32")  # noqa: E731
    trained = get_peft_model(base(), LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))
    trained.save_pretrained(tmp_path / "run")
    merged = _with_adapter(base(), str(tmp_path / "run"), quantized=False)
    assert not isinstance(merged, PeftModel) and not any("lora" in n for n, _ in merged.named_parameters())
    apart = _with_adapter(base(), str(tmp_path / "run"), quantized=True)
    assert isinstance(apart, PeftModel)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(merged.eval().generate(ids, **kwargs), apart.eval().generate(ids, **kwargs))
        plain = base().eval().generate(ids, **kwargs)
    assert not torch.equal(plain, merged.generate(ids, **kwargs))  # the adapter does change the model


# Rule: where K sampled completions of a prompt pass less often than its greedy one (pass@K under greedy pass@1), the
# line says why, so the two figures side by side do not read as a fault; where pass@K is not under, nothing is added.
@pytest.mark.parametrize("sampled_pass,explained", [(0.4, True), (0.6, False), (0.8, False)])
def test_sampled_pass_at_k_under_greedy_pass_at_1_is_explained(sampled_pass, explained):
    result = {"greedy": {"pass@1": 0.6, "passed": 3}, "prompts": 5, "pass_reward": "accuracy",
              "sampled": {"k": 2, "pass@2": sampled_pass, "mean@2": 0.3, "temperature": 0.7}}
    line = evaluate.summary(result)
    assert f"pass@2 {sampled_pass:.3f}" in line
    assert ("pass@2 under greedy pass@1: at temperature 0.7 each token is drawn at random" in line) is explained
