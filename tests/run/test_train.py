"""Real GRPOTrainer runs on the tiny model through the same code path `launch.py` uses."""

from __future__ import annotations

import json
import re

import matplotlib.image
import pytest
import yaml
from helpers import ROOT, recipe_dict, with_trainer, write_recipe

from grpokit import config
from grpokit.run import training
from grpokit.cli import main
from grpokit.errors import RecipeError
from grpokit.config import validate

pytestmark = pytest.mark.slow


def load(path, overrides=()):
    return validate(config.load(path, overrides))


def rewards_logged(output_dir) -> list[float]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [h["reward"] for h in state["log_history"] if "reward" in h]


def test_smoke_recipe_learns_with_lora_and_8bit_adam(tmp_path):
    """The demo: LoRA + adamw_bnb_8bit on the tiny model; the mean reward clearly rises."""
    out = tmp_path / "smoke"
    recipe = load(ROOT / "recipes" / "smoke.yaml", [f"trainer.output_dir={out}", "trainer.disable_tqdm=true"])
    assert recipe.trainer["optim"] == "adamw_bnb_8bit" and recipe.lora is not None
    training.train(recipe)
    rewards = rewards_logged(out)
    assert len(rewards) == recipe.trainer["max_steps"]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.5, rewards
    # The run leaves everything needed to use or rerun it.
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer_config.json", "trainer_state.json", "recipe.yaml"):
        assert (out / name).exists(), name
    saved = yaml.safe_load((out / "recipe.yaml").read_text())
    assert saved["trainer"]["output_dir"] == str(out)  # overrides applied, exactly as it ran
    assert load(out / "recipe.yaml").trainer == recipe.trainer  # and it reruns as is
    # Curves and a report, at the end of every run.
    png = matplotlib.image.imread(out / "plots" / "training.png")
    assert png.shape[0] > 300 and png.shape[1] > 300
    report = (out / "report.md").read_text()
    assert "# GRPO run report: smoke" in report and "plots/training.png" in report
    assert "advantage" in report and "char_fraction" in report  # the explain summary and the reward
    assert "## Sampled completions" in report and "```" in report.split("## Sampled completions")[1]
    # ... and again on demand for an existing run.
    (out / "plots" / "training.png").unlink()
    (out / "report.md").unlink()
    assert main(["--plot", str(out)]) == 0
    assert (out / "plots" / "training.png").exists() and (out / "report.md").exists()


@pytest.mark.parametrize("lora", [True, False], ids=["lora-adapter-disabled-ref", "full-ft-ref-copy"])
def test_beta_runs_the_reference_path(tmp_path, lora, capsys):
    data = with_trainer(tmp_path, beta=0.04, max_steps=2)
    if not lora:
        data.pop("lora")
        data["trainer"]["learning_rate"] = 1e-3
    recipe = load(write_recipe(tmp_path, data))
    trainer = training.train(recipe)
    assert (trainer.ref_model is None) == lora  # LoRA: the base with the adapter disabled is the reference
    kls = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert len(kls) == 2 and all(k >= 0 for k in kls)  # k3 is never negative
    # The console gets one compact line per log step (the full metrics stay in trainer_state.json).
    out = capsys.readouterr().out
    assert re.search(r"^step 2/2  reward \d\.\d{3}  ± \d\.\d{3} .* kl \d\.\d{4}", out, re.M), out
    assert "'completions/mean_length'" not in out


def test_output_dir_is_never_silently_replaced(tmp_path, capsys):
    path = write_recipe(tmp_path, with_trainer(tmp_path, max_steps=1))
    training.train(load(path))
    with pytest.raises(RecipeError) as info:
        training.train(load(path))
    assert "already holds a run" in str(info.value) and "--overwrite" in str(info.value)
    assert main(["--recipe", str(path), "--overwrite", "trainer.disable_tqdm=true"]) == 0


def test_check_prints_the_resolved_recipe_with_full(tmp_path, capsys):
    path = write_recipe(tmp_path, with_trainer(tmp_path))
    assert main(["--recipe", str(path), "--check", "--full", "trainer.beta=0.02"]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out.split("\n# first formatted rows")[0].split("# resolved recipe", 1)[1].split("\n", 1)[1])
    assert resolved["trainer"]["beta"] == 0.02
    assert "check passed" in out and not (tmp_path / "run").exists()  # nothing trained
    # without --full: the decisions, one line each, and no dump of every default
    assert main(["--recipe", str(path), "--check", "trainer.beta=0.02"]) == 0
    short = capsys.readouterr().out
    assert "# resolved recipe" not in short and "gguf_file: null" not in short and "--check --full" in short
    assert "\n  model " in short and "\n  rewards " in short and "\n  training " in short
    assert main(["--recipe", str(path), "--full"]) == 2  # --full belongs to --check
    assert "--full" in capsys.readouterr().err


def test_check_reports_data_problems(tmp_path, capsys):
    data = recipe_dict()
    data["dataset"]["answer_column"] = "answr"
    data["dataset"]["template"] = "Q: {promt}"
    assert main(["--recipe", str(write_recipe(tmp_path, data)), "--check"]) == 2
    err = capsys.readouterr().err
    assert "dataset.answer_column: names no column" in err and "did you mean 'answer'" in err
    assert "placeholder {promt}" in err and "did you mean 'prompt'" in err


def test_failing_reward_names_reward_step_and_sample(tmp_path, capsys):
    (tmp_path / "bad_reward.py").write_text(
        "def picky(completions, id, **kwargs):\n"
        "    return [1 / 0 if i % 2 == 0 else 0.0 for i in id]  # fails on every even dataset id\n"
    )
    data = with_trainer(tmp_path, max_steps=1)
    data["rewards"] = [{"name": "bad_reward.py:picky"}]
    assert main(["--recipe", str(write_recipe(tmp_path, data))]) == 1
    err = capsys.readouterr().err
    found = re.search(r"reward 'picky' raised at step 1 on sample (\d+): ZeroDivisionError: division by zero; completion: ", err)
    assert found, err
    assert "no checkpoint was saved yet" in err


def test_dynamic_sampling_through_the_recipe(tmp_path):
    """`sampling.dynamic: true` in a recipe trains with the DAPO subclass: trained batches carry signal."""
    recipe = load(ROOT / "recipes" / "smoke.yaml", [f"trainer.output_dir={tmp_path / 'run'}", "trainer.max_steps=4",
                                                    "trainer.save_strategy=no", "trainer.disable_tqdm=true",
                                                    "sampling.dynamic=true", "sampling.max_rounds=3"])
    trainer = training.train(recipe)
    from grpokit.trainer.dynamic_sampling import DynamicSamplingGRPOTrainer

    assert isinstance(trainer, DynamicSamplingGRPOTrainer)  # (generating through grpokit.trainer.generation)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logs) == 4 and all("sampling/rounds" in h for h in logs)
    for h in logs:  # a batch filled short is said so; otherwise no group without reward spread was trained on
        assert h["frac_reward_zero_std"] == 0 or h["sampling/filled_short"] > 0


@pytest.mark.parametrize("quantization,layer", [("4bit", "Linear4bit"), ("8bit", "Linear8bitLt")])
def test_quantized_base_trains_with_lora(tmp_path, quantization, layer):
    """The QLoRA path the 7B recipes use (bitsandbytes 0.50 quantizes on CPU too): real steps, quantized layers."""
    recipe = load(ROOT / "recipes" / "smoke.yaml", [f"model.quantization={quantization}", f"trainer.output_dir={tmp_path / 'run'}",
                                                    "trainer.max_steps=2", "trainer.save_strategy=no", "trainer.disable_tqdm=true"])
    trainer = training.train(recipe)
    layers = {type(m).__name__ for m in trainer.model.get_base_model().modules()}
    assert layer in layers  # the base really is quantized, under the LoRA adapter
    assert trainer.state.global_step == 2 and (tmp_path / "run" / "adapter_model.safetensors").exists()


def test_a_4bit_base_on_a_cpu_gives_the_same_gradients_after_generating(tiny_model_dir):
    """bitsandbytes repacks a 4-bit layer for a CPU's AVX512-BF16 kernel the first time it runs without gradients (as
    GRPO's generation does, before every training pass) and keeps that packing in training, where that kernel has no
    backward: every gradient through the frozen base is then dropped, and the adapters train on the wrong ones. A
    policy grpokit loads never repacks: its gradients after a generation are the ones before it. (On a CPU without
    AVX512-BF16 nothing repacks either way; this machine has it where `has_avx512bf16()` says so.)"""
    import bitsandbytes as bnb
    import torch
    from peft import LoraConfig, get_peft_model

    from grpokit.trainer.models import load_model

    recipe = load(ROOT / "recipes" / "smoke.yaml", ["model.quantization=4bit", "model.dtype=float32"])
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))

    def policy():
        torch.manual_seed(1)
        return get_peft_model(load_model(str(tiny_model_dir), recipe),
                              LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False))

    def gradients(model):
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return {name: p.grad for name, p in model.named_parameters() if p.requires_grad}

    before = gradients(policy())
    generated = policy()
    generated.eval()
    with torch.no_grad():
        generated(input_ids=ids)  # what generation does to every layer
    layers = [m for m in generated.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)
    after = gradients(generated)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], msg=name)


def test_known_third_party_noise_is_quiet(tiny_model_dir):
    # TRL's calls of transformers' deprecated names warned at every checkpointing toggle; other warnings stay.
    import warnings

    from transformers import AutoModelForCausalLM

    from grpokit.cli import quiet_known_noise

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_noise()
        model.gradient_checkpointing_enable()
        assert model.is_gradient_checkpointing
        model.gradient_checkpointing_disable()
        warnings.warn("`something_else` is deprecated", FutureWarning)
    assert [str(w.message) for w in caught] == ["`something_else` is deprecated"]
