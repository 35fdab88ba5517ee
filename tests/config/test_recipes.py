"""Every shipped recipe: passes --check offline, opens with its own command, states the published knobs."""

from __future__ import annotations

import pytest
import yaml
from helpers import ROOT, launch

from grpokit.config import load
from grpokit.cli import main
from grpokit.config import validate

RECIPES = ROOT / "recipes"
# recipes/accelerate/ holds accelerate launch configs, not grpokit recipes.
ALL = sorted(p for p in RECIPES.rglob("*.yaml") if "accelerate" not in p.relative_to(RECIPES).parts)
MODEL_RECIPES = [p for p in ALL if p.parent.name.startswith(("qwen", "smollm3", "llama"))]  # the GPU models' folders


def rel(path) -> str:
    return str(path.relative_to(ROOT))


def test_the_catalogue_is_complete():
    """Every model x algorithm a user wants is one small file."""
    models = {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"}
    algorithms = {"grpo", "dr_grpo", "dapo", "gspo"}
    found = {(p.parent.name, p.stem) for p in MODEL_RECIPES}
    assert found >= {(m, a) for m in models for a in algorithms}  # task recipes (mbpp) come on top


# --check's default view fits a screen: a one-turn recipe's in 60 lines, a tool recipe's in 80, no line wider than 160
# characters (what is cut ends in [...]; --check --full shows every line whole).
SCREEN_LINES, TOOL_SCREEN_LINES, SCREEN_WIDTH = 60, 80, 160


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_recipe_passes_check_offline(path, capsys):
    assert main(["--recipe", str(path), "--check"]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    out = captured.out
    assert "check passed" in out
    assert "advantage" in out and "clip range" in out  # the explain table
    assert "Memory plan:" in out and "-> fits" in out  # every shipped recipe is planned to fit a T4's 15 GiB
    assert "warning [" not in out  # no shipped recipe sets a knob that cannot act (grpokit/config/lint.py)
    if path.stem in UPDATES_PER_GENERATION:  # the named algorithms: the clip their papers define acts
        assert "off-policy here" in out and "the clip range binds" in out
    lines = (captured.err + out).splitlines()
    bound = TOOL_SCREEN_LINES if "# tool use" in out else SCREEN_LINES
    assert len(lines) <= bound, f"{len(lines)} lines, more than a screen ({bound})"
    assert [line for line in lines if len(line) > SCREEN_WIDTH] == []


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_recipe_opens_with_its_command(path):
    head = [line for line in path.read_text().splitlines()[:12] if line.startswith("#")]
    assert any(f"launch.py --recipe {rel(path)}" in line for line in head), head


@pytest.mark.parametrize("path", ALL, ids=rel)
def test_recipe_names_shipped_data_as_builtin(path):
    """A relative path into grpokit/assets breaks in a copy elsewhere; `builtin:` finds the file from any folder, as
    recipes/README.md tells users to write it."""
    dataset = yaml.safe_load(path.read_text()).get("dataset") or {}
    for key in ("path", "eval_path"):
        value = dataset.get(key)
        assert value is None or value.startswith("builtin:"), f"dataset.{key}: {value}"


@pytest.mark.parametrize("path", [p for p in ALL if p.name != "smoke.yaml"], ids=rel)
def test_recipe_extends_a_base(path):
    if path.stem == "gsm8k":
        return  # the root of the chain
    if (yaml.safe_load(path.read_text()).get("model") or {}).get("name_or_path", "").startswith("builtin:"):
        return  # a CPU recipe on a built-in model (like smoke.yaml): nothing GPU-shaped to share
    assert yaml.safe_load(path.read_text()).get("base"), "every GPU recipe extends a shared base"


# The algorithms as published (and as TRL's docs give them for GSPO).
PUBLISHED = {
    "grpo": dict(loss_type="grpo", scale_rewards="group", beta=0.04, epsilon=0.2),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", beta=0.0),
    "dapo": dict(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0, mask_truncated_completions=True),
    "gspo": dict(importance_sampling_level="sequence", loss_type="grpo", beta=0.0),
}


# The update structure, as each paper trains, scaled to one 16 GB GPU (the recipes' comments say how):
# optimizer steps per generation batch of 64 completions (8 prompts x 8). DeepSeekMath's Algorithm 1 takes mu
# passes over each batch (num_iterations 2 here); DAPO, Dr. GRPO's oat-zero scripts and GSPO split a rollout
# into mini-batches (4 of 16 completions here).
UPDATES_PER_GENERATION = {"grpo": 2, "dr_grpo": 4, "dapo": 4, "gspo": 4}
ALGORITHM_RECIPES = [p for p in ALL if p.stem in UPDATES_PER_GENERATION]


@pytest.mark.parametrize("path", ALGORITHM_RECIPES, ids=rel)
def test_update_structure_as_published(path):
    from grpokit.config.trainer_args import grpo_args
    from grpokit.reporting.explain import updates_per_generation

    args = grpo_args(validate(load(path)))
    generation = args.per_device_train_batch_size * args.steps_per_generation
    # the generation batch the plan sizes: 64, or 32 where a KV cache leaves no room for 64 (Llama-3.2-3B's
    # 28 layers x 1024 wide; Qwen3's 2048-token thoughts); the mini-batches keep their size, so there are fewer
    assert generation in (64, 32)
    expected = UPDATES_PER_GENERATION[path.stem]
    assert updates_per_generation(args) == (expected if path.stem == "grpo" else expected * generation // 64)
    # Each optimizer step still sees whole prompt groups (a mini-batch of a half group would be noise).
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps % args.num_generations == 0


@pytest.mark.parametrize("path", MODEL_RECIPES, ids=rel)
def test_algorithm_knobs_as_published(path):
    recipe = validate(load(path))
    # A task recipe (mbpp.yaml) runs the algorithm of the base it extends.
    algorithm = path
    while algorithm.stem not in PUBLISHED:  # a task recipe may extend another model's task recipe
        algorithm = (algorithm.parent / yaml.safe_load(algorithm.read_text())["base"]).resolve()
    algorithm = algorithm.stem
    for key, value in PUBLISHED[algorithm].items():
        assert recipe.trainer.get(key, {"scale_rewards": "group"}.get(key)) == value, key
    assert recipe.lora is not None and recipe.trainer["optim"] in ("adamw_bnb_8bit", "paged_adamw_8bit")
    assert recipe.trainer["num_generations"] == 8 and recipe.trainer["gradient_checkpointing"] is True
    assert recipe.trainer["learning_rate"] > 1e-6  # a LoRA rate, not TRL's full fine-tune default
    if path.stem == "dapo":
        assert recipe.sampling["dynamic"] is True
        overlong = next(r for r in recipe.rewards if r["name"] == "overlong_penalty")
        assert 0 < overlong["args"]["buffer"] < overlong["args"]["max_length"] == recipe.trainer["max_completion_length"]
    if path.parent.name == "qwen2.5-7b":
        assert recipe.model["quantization"] == "4bit"  # QLoRA


@pytest.mark.slow
def test_check_is_offline_without_being_told():
    """`--check` itself never reaches for the hub: no HF_HUB_OFFLINE in the environment, no retries, exit 0."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE")}
    proc = launch("--recipe", "recipes/qwen2.5-3b/dapo.yaml", "--check", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "is not in the local cache" in proc.stdout and "check passed" in proc.stdout
    assert "Retrying" not in proc.stderr and "huggingface.co" not in proc.stderr


def clip_metrics(tmp_path, *overrides) -> list[dict]:
    """The smoke recipe under DAPO's clip (epsilon 0.2, epsilon_high 0.28, loss_type dapo) for 2 optimizer steps of
    one prompt group (4 completions of 8 tokens: seconds on a CPU), built the way `training.train()` builds it (no plots or
    report); TRL's clip_ratio/* metrics per logged step."""
    from grpokit.run import build
    from grpokit.trainer.models import load_model

    recipe = validate(load(RECIPES / "smoke.yaml", [f"trainer.output_dir={tmp_path}", "trainer.save_strategy=no",
                                                    "trainer.disable_tqdm=true", "trainer.max_steps=2",
                                                    "trainer.loss_type=dapo", "trainer.epsilon=0.2",
                                                    "trainer.epsilon_high=0.28", "trainer.per_device_train_batch_size=4",
                                                    "trainer.max_completion_length=8", *overrides]))
    prep = build.prepare(recipe, log=lambda m: None, mode="train")
    trainer = build.make_trainer(prep, load_model(prep.model_path, recipe))
    trainer.train()
    return [h for h in trainer.state.log_history if "clip_ratio/region_mean" in h]


@pytest.mark.slow
def test_the_clip_binds_only_off_policy(tmp_path):
    """'The clip binds' measured, not claimed: DAPO's structure (one generation of 8 completions, two optimizer
    steps on one prompt group each) logs clipped tokens on the second step; the on-policy smoke (a fresh generation
    every step) logs exactly 0 on both. The smoke's learning rate (1e-2, what LoRA on a random model needs to
    learn at all) moves the policy far enough in one step for the second step's ratios to leave [0.8, 1.28];
    seed 0 makes the run repeatable."""
    on = clip_metrics(tmp_path / "on")  # steps_per_generation = gradient_accumulation_steps = 1
    assert len(on) == 2
    assert all(h["clip_ratio/region_mean"] == 0 and h["clip_ratio/high_max"] == 0 for h in on)

    off = clip_metrics(tmp_path / "off", "trainer.steps_per_generation=2")
    assert len(off) == 2
    assert off[0]["clip_ratio/region_mean"] == 0  # the first step of a generation is on-policy
    assert off[1]["clip_ratio/region_mean"] > 0 or off[1]["clip_ratio/high_max"] > 0, off[1]
