"""The explain table, read from real GRPOConfig objects for the four published algorithms and for knob changes.

GSPO uses `loss_type: grpo`: TRL's paper index (docs/source/paper_index.md, "Group Sequence Policy
Optimization") reproduces the paper with importance_sampling_level="sequence", loss_type="grpo", beta=0,
epsilon=3e-4, epsilon_high=4e-4, steps_per_generation = 4 x gradient_accumulation_steps.
"""

import warnings

import pytest

from grpokit.reporting.explain import explain, render

ALGORITHMS = {
    "grpo": dict(loss_type="grpo", scale_rewards="group", beta=0.04, epsilon=0.2),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", beta=0.0),
    "dapo": dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, mask_truncated_completions=True),
    "gspo": dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.0, epsilon=3e-4, epsilon_high=4e-4,
                 gradient_accumulation_steps=1, steps_per_generation=4),
}
REWARDS = [{"name": "accuracy", "weight": 1.0, "args": {}}, {"name": "think_format", "weight": 0.5, "args": {}}]
OVERLONG = {"name": "overlong_penalty", "weight": 1.0, "args": {"max_length": 1024, "buffer": 256, "penalty_factor": 1.0}}
MODEL = {"name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "dtype": "auto", "quantization": "none"}
LORA = {"r": 16, "target_modules": "all-linear"}


def config(tmp_path, **knobs):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], per_device_train_batch_size=8,
                num_generations=8, max_completion_length=1024)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPOConfig(**{**base, **knobs})


def table(args, rewards=REWARDS, sampling=None, lora=LORA, model=MODEL) -> dict[str, str]:
    rows = explain(args, rewards=rewards, sampling=sampling or {"dynamic": False}, lora=lora, model=model)
    assert len({term for term, _ in rows}) == len(rows)  # one row per term
    assert all(line.strip() for line in render(rows))
    return dict(rows)


def test_grpo(tmp_path):
    t = table(config(tmp_path, **ALGORITHMS["grpo"]))
    assert t["advantage"].startswith("GRPO (DeepSeekMath), eq. 8.1: A_i = (r_i - mean(r)) / (std(r) + 1e-4) over the 8 completions")
    assert "per sequence" in t["aggregation"] and "length bias" in t["aggregation"]
    assert t["clip range"] == "[1 - ε, 1 + ε_high] = [0.8, 1.2]: symmetric, ε = 0.2"
    # β > 0 under LoRA: the reference is the base with the adapter disabled, at no memory cost
    assert t["KL"].startswith("β = 0.04 x k3 (eq. 8.3, the estimator DeepSeekMath's GRPO uses) = ρ - 1 - log ρ per token, ρ = π_ref / π_θ")
    assert "adapter disabled" in t["KL"]
    assert t["importance sampling"].startswith("per token") and "on-policy" in t["importance sampling"]
    assert t["truncated completions"].startswith("kept")
    assert t["rewards"] == "1 x accuracy + 0.5 x think_format"
    assert t["dynamic sampling"].startswith("off")
    assert "overlong penalty" not in t


def test_grpo_full_fine_tune_reference_is_a_costed_copy(tmp_path):
    t = table(config(tmp_path, **ALGORITHMS["grpo"]), lora=None)
    assert "a full second copy of the policy, 2.88 GiB more GPU memory (estimated from the architecture)" in t["KL"]


def test_dr_grpo(tmp_path):
    t = table(config(tmp_path, **ALGORITHMS["dr_grpo"]))
    assert t["advantage"].startswith("Dr. GRPO: A_i = r_i - mean(r), no division by std")
    assert t["aggregation"].startswith("sum of token losses / (completions x 1024), a constant")
    assert t["KL"] == "none: β = 0, so no KL term and no reference model is loaded"


def test_dapo(tmp_path):
    sampling = {"dynamic": True, "max_rounds": 3, "metric": "accuracy"}
    t = table(config(tmp_path, **ALGORITHMS["dapo"]), rewards=REWARDS + [OVERLONG], sampling=sampling)
    assert t["aggregation"].startswith("per token over the global accumulated batch")
    assert t["clip range"] == "[1 - ε, 1 + ε_high] = [0.8, 1.28]: clip-higher (DAPO), ε_high 0.28 > ε 0.2"
    assert t["KL"].startswith("none")
    assert t["truncated completions"].startswith("masked")
    assert "1 x overlong_penalty (buffer=256, max_length=1024, penalty_factor=1.0)" in t["rewards"]
    assert t["overlong penalty"].startswith("window (768, 1024] tokens")
    assert t["dynamic sampling"] == ("on (DAPO): groups with zero spread of 'accuracy' are dropped and more "
                                     "prompts generated, up to 3 rounds per batch")


def test_gspo(tmp_path):
    t = table(config(tmp_path, **ALGORITHMS["gspo"]))
    assert t["importance sampling"].startswith("per sequence (GSPO)")
    assert "off-policy here" in t["importance sampling"]  # 4 optimizer steps per generation batch
    assert t["clip range"].startswith("[1 - ε, 1 + ε_high] = [0.9997, 1.0004]")
    assert "per sequence" in t["aggregation"]


# A knob changed on the command line changes the row: the table reads the config, not the recipe's name.
@pytest.mark.parametrize("knobs,term,expected", [
    (dict(scale_rewards="batch"), "advantage", "std of r over the whole batch"),
    (dict(scale_rewards=False), "advantage", "Dr. GRPO"),  # TRL maps False to "none"
    (dict(multi_objective_aggregation="normalize_then_sum"), "advantage", "normalize_then_sum"),
    (dict(loss_type="bnpo"), "aggregation", "local micro-batch"),
    (dict(loss_type="cispo", epsilon_high=5.0), "clip range", "capped at ε_high = 5"),
    (dict(loss_type="sapo"), "clip range", "no hard clip"),
    (dict(delta=1.5), "clip range", "capped at δ = 1.5"),
    (dict(epsilon=0.1, epsilon_high=0.1), "clip range", "[0.9, 1.1]: symmetric"),
    (dict(num_iterations=2), "importance sampling", "off-policy"),
    (dict(gradient_accumulation_steps=4), "importance sampling", "on-policy"),
])
def test_rows_follow_the_knobs(tmp_path, knobs, term, expected):
    assert expected in table(config(tmp_path, **knobs))[term]


def test_entropy_rows_only_when_used(tmp_path):
    assert "entropy mask" not in table(config(tmp_path))
    t = table(config(tmp_path, top_entropy_quantile=0.2, entropy_coef=0.01))
    assert "top 0.2" in t["entropy mask"] and "0.01" in t["entropy bonus"]


def test_reference_cost_unknown_offline_is_said(tmp_path):
    t = table(config(tmp_path, beta=0.01), lora=None, model={"name_or_path": "nobody/unknown-model"})
    assert "its size is unknown" in t["KL"] and "not reachable offline" in t["KL"]


def test_product_text_names_what_a_user_can_look_up(tmp_path):
    """No row cites a chapter or a bare "eq. 8.x" that nothing in the repository names: every
    eq. label in the table is defined in docs/grpo.md, "GRPO in one screen", and the papers are named."""
    import re

    from helpers import ROOT

    section = (ROOT / "docs" / "grpo.md").read_text()
    assert section.startswith("# GRPO in one screen")
    text = "\n".join(v for algo in ALGORITHMS.values() for v in table(config(tmp_path, **algo)).values())
    assert "chapter" not in text
    for label in sorted(set(re.findall(r"eq\. 8\.\d", text))):
        assert re.search(rf"\*\*[^*]+\({re.escape(label)}\)\*\*", section), f"docs/grpo.md does not define {label}"
    assert "DeepSeekMath" in text and "DAPO" in text and "Dr. GRPO" in text
    assert "eq. 8.1, 8.2 and 8.3" in section  # the page says these labels are its own


def test_check_docstring_examples_run():
    """grpokit.run.check's examples: the decisions' labels, and a line cut to the screen's width at a clause."""
    import doctest

    from grpokit.run import check

    result = doctest.testmod(check)
    assert result.attempted and not result.failed
