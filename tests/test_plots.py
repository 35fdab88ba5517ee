"""Run plots and report.md on the trainer_state.json of a real, short GRPOTrainer run on the tiny model."""

import json
import shutil

import pytest

from grpokit.reporting.plots import PANELS, collect_panels, find_trainer_state, plot_run
from grpokit.reporting.report import completions_from_disk, completions_from_logs, pick_completions, write_report

STEPS = 10


def frac_a(completions, **kwargs):
    """Share of 'a' characters: a reward the tiny model can move in a few steps."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [t.count("a") / max(len(t), 1) for t in texts]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """A 10-step run: beta > 0 so KL is logged, log_completions so TRL writes its parquet, a checkpoint-10/."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    out = tmp_path_factory.mktemp("run")
    words = ["apple", "river", "stone", "cloud"] * 4
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {w}"}]} for w in words])
    cfg = GRPOConfig(
        output_dir=str(out),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        beta=0.04,
        log_completions=True,
        num_completions_to_print=1,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="steps",
        save_steps=STEPS,  # one checkpoint, at the end: enough to test finding it
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype="float32"),
        reward_funcs=frac_a,
        args=cfg,
        train_dataset=ds,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_state()
    return out, completions_from_logs(trainer._logs, step=trainer.state.global_step)


def assert_png(path, min_width=600, min_height=400):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(path).shape[:2]
    assert min_width <= width <= 4000 and min_height <= height <= 4000, (width, height)


@pytest.mark.slow
def test_plot_run_writes_a_png_grid(run):
    run_dir, _ = run
    paths = plot_run(run_dir)
    assert paths == [run_dir / "plots" / "training.png"]
    assert_png(paths[0])


@pytest.mark.slow
def test_every_panel_is_filled_from_a_real_run(run):
    run_dir, _ = run
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    drawn = {panel.title: lines for panel, lines in collect_panels(history)}
    assert list(drawn) == [p.title for p in PANELS]  # TRL logged every metric we know, KL included
    assert [label for label, *_ in drawn["Reward"]] == ["total (weighted)", "frac_a"]
    steps = drawn["Reward"][0][1]
    assert steps == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_kl_panel_only_when_kl_is_logged(run):
    # A beta = 0 run logs no `kl` key at all (TRL skips it); strip it from the real history to get one.
    run_dir, _ = run
    history = json.loads((run_dir / "trainer_state.json").read_text())["log_history"]
    for entry in history:
        entry.pop("kl", None)
    titles = [panel.title for panel, _ in collect_panels(history)]
    assert "KL to reference (k3)" not in titles and "Entropy" in titles


@pytest.mark.slow
def test_checkpoint_dirs_are_found(run, tmp_path):
    run_dir, _ = run
    checkpoints = sorted(run_dir.glob("checkpoint-*"))
    assert [c.name for c in checkpoints] == [f"checkpoint-{STEPS}"]
    # a checkpoint dir itself
    assert find_trainer_state(checkpoints[0]) == checkpoints[0] / "trainer_state.json"
    # a run dir without its own file (a run still going, or killed): the highest checkpoint-N wins
    for step in (5, 10, 9):  # numeric, not text, order: 10 > 9
        (tmp_path / f"checkpoint-{step}").mkdir()
        shutil.copy(checkpoints[0] / "trainer_state.json", tmp_path / f"checkpoint-{step}")
    (tmp_path / "checkpoint-11").mkdir()  # a checkpoint being written, no state yet: skipped
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    assert plot_run(tmp_path) == [tmp_path / "plots" / "training.png"]


def test_missing_trainer_state_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"no trainer_state.json in .* or its checkpoint-N/ folders"):
        plot_run(tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        plot_run(tmp_path / "nope")
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"train_runtime": 1.0, "step": 0}]}))
    with pytest.raises(ValueError, match="no training metrics to plot"):
        plot_run(tmp_path)


@pytest.mark.slow
def test_report_with_completions_from_the_trainer(run):
    run_dir, completions = run
    assert len(completions) == 8 and set(completions[0]["rewards"]) == {"frac_a"}
    path = write_report(
        run_dir, recipe_name="smoke-test", explain_lines=["model: builtin:tiny-llama", "rewards: frac_a x 1.0"],
        completions=completions,
    )
    assert path == run_dir / "report.md"
    text = path.read_text()
    assert text.startswith("# GRPO run report: smoke-test\n")
    assert "model: builtin:tiny-llama" in text
    assert f"- Steps: {STEPS} of {STEPS}" in text
    assert "| reward (total) (`reward`) |" in text and "| KL to reference (`kl`) |" in text
    assert "(step 1)" in text and f"(step {STEPS})" in text
    assert "![training](plots/training.png)" in text
    assert_png(run_dir / "plots" / "training.png")
    assert text.count("### ") == 4 and f"### 1. step {STEPS} · frac_a " in text
    assert "Say " in text and "'role'" not in text  # prompt text, not a message dict
    best, worst = pick_completions(completions)[0], pick_completions(completions)[-1]
    assert best["rewards"]["frac_a"] == max(c["rewards"]["frac_a"] for c in completions)
    assert worst["rewards"]["frac_a"] == min(c["rewards"]["frac_a"] for c in completions)


@pytest.mark.slow
def test_report_reads_trls_log_completions_parquet(run):
    run_dir, completions = run
    rows = completions_from_disk(run_dir, ["frac_a"])
    assert len(rows) == 8 and {r["step"] for r in rows} == {STEPS}  # the latest file
    # the same batch TRL keeps in memory
    on_disk = sorted(r["rewards"]["frac_a"] for r in rows)
    assert on_disk == pytest.approx(sorted(c["rewards"]["frac_a"] for c in completions))
    text = write_report(run_dir, recipe_name="smoke-test", plots=[run_dir / "plots" / "training.png"]).read_text()
    assert "(no explain summary given)" in text and "![training](plots/training.png)" in text
    assert text.count("### ") == 4 and "advantage " in text
    assert "Say " in text and "'role'" not in text  # parquet's message arrays rendered as text


@pytest.mark.slow
def test_report_without_completions_says_how_to_get_them(run, tmp_path):
    run_dir, _ = run
    shutil.copy(run_dir / "trainer_state.json", tmp_path)
    text = write_report(tmp_path, recipe_name="bare", completions=[], plots=[]).read_text()
    assert "No completions recorded" in text and "log_completions: true" in text
    assert "(no plots)" in text and not (tmp_path / "plots").exists()
