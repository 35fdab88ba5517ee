"""grpokit's own passes (the loss pass's shared prompts, generation's kept prefixes) run on a family only where they
are TRL's method to float rounding on its tiny instance (grpokit.trainer.ownpasses.PROVEN), and each run checks that again on
its first micro-batch, falling back to TRL's method past the tolerance for its dtype."""

from __future__ import annotations

import pytest
import torch
from trl import GRPOTrainer

from grpokit.trainer import ownpasses
from grpokit.trainer.generation import PrefixStore
from grpokit.reporting.own_passes import own_passes_section
from tests.helpers import FAMILIES, family_trainer
from tests.trainer.test_generation import generate
from tests.trainer.test_shared_prompt import LEAD, assert_gradients_close, logps_and_grads, rows

# The families whose caches hold plain keys and values per token: grpokit's passes are compared with TRL's on them.
# Qwen3.5 (linear-attention state) and Gemma 4 (sliding windows) run TRL's method.
OWN = ("qwen3", "smollm3", "llama3_2", "qwen2_5")


@pytest.fixture(scope="module")
def trainers(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("family-passes"), {}

    def get(family):
        if family not in made:
            made[family] = family_trainer(family, root, max_completion_length=8, gradient_checkpointing=False)
            made[family].model.train()
        return made[family]

    return get


@pytest.mark.parametrize("family", list(FAMILIES))
def test_own_passes_run_only_where_proven(family, trainers):
    trainer = trainers(family)
    verdict = ownpasses.verdict(trainer.model.config)
    assert verdict.runs == (family in OWN), verdict.why
    assert trainer._own_generation == trainer._share_prompts == verdict.runs


@pytest.mark.parametrize("family", OWN)
def test_generation_from_kept_prefixes_draws_what_trl_draws(family, trainers):
    trainer = trainers(family)
    tok = trainer.processing_class
    # a lead all prompts share (prefilled once), prompts of unequal lengths (left padding differs), copies of each
    prompts = [tok.apply_chat_template([{"role": "system", "content": LEAD}, {"role": "user", "content": q}],
                                       add_generation_prompt=True) for q in ("What is 2 + 2?", "Add 12 and 30, then 4.")]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    batch = [p for p in prompts for _ in range(3)]
    store = PrefixStore()
    first = generate(trainer, batch, 3, store)
    assert first == generate(trainer, batch, 3)
    assert store.reused_tokens > 0
    # the turn after a tool's result, from the states the first turn kept
    result = tok("<tool_response>\n42\n</tool_response>")["input_ids"]
    second = [r + c + result[: 3 + i] for i, (r, c) in enumerate(zip(batch, first, strict=True))][::3]
    before = store.reused_tokens
    assert generate(trainer, second, 1, store) == generate(trainer, second, 1)
    assert store.reused_tokens - before >= sum(map(len, prompts))
    found, tolerance, dtype = trainer.own_pass_check.judged["generation"]  # the first-step check ran on the first
    assert dtype == "float32" and found <= tolerance  # batch with kept states, and agreed


@pytest.mark.parametrize("family", OWN)
def test_the_loss_pass_with_shared_prompts_is_trls(family, trainers):
    trainer = trainers(family)
    ids, mask, keep = rows(trainer, [LEAD + "What is 2 + 2?", LEAD + "What is 12 + 30? Think first."], 3,
                           [3, 7, 5, 2, 6, 4])
    shared = trainer.shared_prompt_tally.shared
    ours = logps_and_grads(trainer, trainer._get_per_token_logps_and_entropies, ids, mask, keep)
    theirs = logps_and_grads(trainer, lambda *a, **k: GRPOTrainer._get_per_token_logps_and_entropies(trainer, *a, **k),
                             ids, mask, keep)
    assert trainer.shared_prompt_tally.shared > shared  # ours ran, not TRL's in its place
    torch.testing.assert_close(ours[0], theirs[0], atol=1e-5, rtol=1e-4)  # log-probs
    torch.testing.assert_close(ours[1], theirs[1], atol=1e-5, rtol=1e-4)  # entropies
    assert_gradients_close(ours[2], theirs[2])
    found, tolerance, _ = trainer.own_pass_check.judged["loss"]
    assert found <= tolerance


# ---------------------------------------------------------------------------------------------------------------
# The first-step check: a real run's first micro-batch compared with TRL's method; apart, TRL's method takes over


def first_steps(tmp_path, **config):
    from datasets import Dataset

    from grpokit.trainer.generation import PrefixReuseGRPOTrainer
    from tests.helpers import tiny_trainer

    rows = Dataset.from_list([{"prompt": LEAD + q} for q in ("What is 2 + 2?", "Add 12 and 30.")] * 4)
    trainer = tiny_trainer(tmp_path, [lambda completions, **kw: [float(len(c) % 3) for c in completions]], rows,
                           trainer_cls=PrefixReuseGRPOTrainer, max_steps=2, max_completion_length=6, **config)
    trainer.train()
    return trainer, [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.slow
def test_passes_that_agree_on_the_first_step_keep_running(tmp_path, capsys):
    trainer, steps = first_steps(tmp_path)
    assert trainer._share_prompts and trainer._own_generation
    for which in ("loss", "generation"):
        assert steps[0][f"own_passes/{which}_fell_back"] == 0.0
        assert steps[0][f"own_passes/{which}_check"] <= steps[0][f"own_passes/{which}_tolerance"] == 1e-4  # float32
        assert f"own_passes/{which}_check" not in steps[1]  # judged once, on the first step
    assert "first-step check" not in capsys.readouterr().out
    report = own_passes_section(trainer.state.log_history)  # what report.md says of it
    assert report[1] == "## grpokit's own passes" and len(report) == 7
    assert report[-2].startswith("- the loss pass (each prompt computed once for its copies): ")
    assert report[-2].endswith("from TRL's method on step 1's first micro-batch, within the tolerance 0.0001: "
                               "grpokit's pass ran")


@pytest.mark.slow
def test_a_loss_pass_apart_from_trls_falls_back_for_the_run_and_says_so(tmp_path, capsys, monkeypatch):
    from grpokit.trainer import shared_prompt

    real = shared_prompt.logps_and_entropies

    def apart(*args, **kwargs):  # the seam: our pass's log-probabilities moved by 0.5 (a fault's size)
        done = real(*args, **kwargs)
        return None if done is None else (done[0] + 0.5, done[1])

    monkeypatch.setattr(shared_prompt, "logps_and_entropies", apart)
    trainer, steps = first_steps(tmp_path)
    out = capsys.readouterr().out
    assert out.count("first-step check: the loss pass's shared prompts differ from TRL's method by 0.5") == 1
    assert "TRL's method runs for the rest of the run" in out
    assert steps[0]["own_passes/loss_fell_back"] == 1.0 and not trainer._share_prompts
    assert trainer.shared_prompt_tally.shared == 0  # nothing of ours counted: TRL's method ran, on step 1 too
    assert trainer._own_generation and steps[0]["own_passes/generation_fell_back"] == 0.0  # the other pass is its own
    assert "past the tolerance 0.0001: TRL's method ran from then on" in own_passes_section(
        trainer.state.log_history)[-2]


@pytest.mark.slow
def test_generation_apart_from_trls_falls_back_for_the_run_and_says_so(tmp_path, capsys, monkeypatch):
    from grpokit.trainer import generation

    real = generation._batch_cache

    def apart(*args, **kwargs):  # the seam: the kept keys moved
        cache, width = real(*args, **kwargs)
        for layer in cache.layers:
            if layer.is_initialized:
                layer.keys += 1.0
        return cache, width

    monkeypatch.setattr(generation, "_batch_cache", apart)
    trainer, steps = first_steps(tmp_path)
    out = capsys.readouterr().out
    assert out.count("first-step check: generation's kept prefixes differ from TRL's method") == 1
    assert steps[0]["own_passes/generation_fell_back"] == 1.0 and not trainer._own_generation
    assert trainer._share_prompts
