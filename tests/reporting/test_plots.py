"""Run plots and report.md on the trainer_state.json of a real, short GRPOTrainer run on the tiny model."""

import json
import shutil
import types

import pytest
from helpers import tiny_trainer

from grpokit.reporting.plots import PANELS, collect_panels, figure, find_trainer_state, flat_reasons, plot_run
from grpokit.reporting.report import (completions_from_disk, keep_first_completions, pick_completions, run_completions,
                                      write_report)

STEPS = 10


def frac_a(completions, **kwargs):
    """Share of 'a' characters: a reward the tiny model can move in a few steps."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [t.count("a") / max(len(t), 1) for t in texts]


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    """A 10-step run: beta > 0 so KL is logged, log_completions so TRL writes its parquet, a checkpoint-10/."""
    from datasets import Dataset

    out = tmp_path_factory.mktemp("run")
    words = ["apple", "river", "stone", "cloud"] * 4
    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Say {w}"}]} for w in words])
    trainer = tiny_trainer(
        out, frac_a, ds, model_dir=tiny_model_dir,
        max_steps=STEPS,
        beta=0.04,
        log_completions=True,
        num_completions_to_print=1,
        save_strategy="steps",
        save_steps=STEPS,  # one checkpoint, at the end: enough to test finding it
    )
    keep_first_completions(trainer)
    trainer.train()
    trainer.save_state()
    return out, run_completions(trainer)


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
    # TRL logged every metric we know, KL included; the tool panels only for a run given tools, which this is not
    assert list(drawn) == [p.title for p in PANELS if not p.series[0][0].startswith("tools/")]
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
    # the first logged step's batch, kept by grpokit's callback, and the last one TRL keeps
    assert len(completions) == 16 and [c["step"] for c in completions] == [1] * 8 + [STEPS] * 8
    assert set(completions[0]["rewards"]) == {"frac_a"}
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
    assert "### Early: step 1 (8 completions, " in text and f"### Late: step {STEPS} (8 completions, " in text
    early, late = text.split("### Early")[1].split("### Late")
    assert 1 <= early.count("#### ") <= 2 and 1 <= late.count("#### ") <= 2 and "#### 1. frac_a " in early
    assert "Say " in text and "'role'" not in text  # prompt text, not a message dict
    best, worst = pick_completions(completions)[0], pick_completions(completions)[-1]
    assert best["rewards"]["frac_a"] == max(c["rewards"]["frac_a"] for c in completions)
    assert worst["rewards"]["frac_a"] == min(c["rewards"]["frac_a"] for c in completions)


@pytest.mark.slow
def test_report_reads_trls_log_completions_parquet(run):
    run_dir, completions = run
    rows = completions_from_disk(run_dir, ["frac_a"])
    assert len(rows) == 16 and {r["step"] for r in rows} == {1, STEPS}  # the first file and the latest
    # the same batch TRL keeps in memory
    on_disk = sorted(r["rewards"]["frac_a"] for r in rows if r["step"] == STEPS)
    assert on_disk == pytest.approx(sorted(c["rewards"]["frac_a"] for c in completions if c["step"] == STEPS))
    text = write_report(run_dir, recipe_name="smoke-test", plots=[run_dir / "plots" / "training.png"]).read_text()
    assert "(no explain summary given)" in text and "![training](plots/training.png)" in text
    assert "### Early: step 1" in text and f"### Late: step {STEPS}" in text and "advantage " in text
    assert "Say " in text and "'role'" not in text  # parquet's message arrays rendered as text


@pytest.mark.slow
def test_report_without_completions_says_how_to_get_them(run, tmp_path):
    run_dir, _ = run
    shutil.copy(run_dir / "trainer_state.json", tmp_path)
    text = write_report(tmp_path, recipe_name="bare", completions=[], plots=[]).read_text()
    assert "No completions recorded" in text and "log_completions: true" in text
    assert "(no plots)" in text and not (tmp_path / "plots").exists()


# --- the report teaches (fast: synthetic histories shaped like the demo's, no training) ---

def demo_like_history(steps=30, collapse_at=20):
    """The smoke demo's shape: reward climbs to 1, entropy 3.44 -> 0.01, every group unanimous from step 20 (one
    step with some spread at 23, as the demo had), LR constant, clip ratios 0 (on-policy)."""
    history = []
    for s in range(1, steps + 1):
        done = s >= collapse_at
        history.append({"step": s, "reward": 1.0 if done else s / collapse_at, "reward_std": 0.0 if done else 0.1,
                        "frac_reward_zero_std": 0.5 if s == 23 else (1.0 if done else 0.0),
                        "entropy": 0.01 if done else 3.44 - 3.0 * (s - 1) / collapse_at, "learning_rate": 0.01,
                        "clip_ratio/region_mean": 0.0, "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
                        "loss": 0.0 if done else 0.1})
    return history


def write_state(folder, history):
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": len(history),
                                                           "max_steps": len(history)}))
    return folder


ON_POLICY = types.SimpleNamespace(gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
                                  lr_scheduler_type="constant")


def test_a_solved_task_is_said_as_solved_not_as_a_collapse(tmp_path):
    """The demo's shape: the reward rose to its best and stayed, so every group is unanimous *right*."""
    text = write_report(write_state(tmp_path, demo_like_history()), recipe_name="smoke", completions=[],
                        plots=[]).read_text()
    said = text.split("## What the curves say", 1)[1].split("\n## ", 1)[0]
    assert said.lstrip().startswith("**The task is solved from step 20 on**")
    assert "from step 20 of 30 on, every group's completions earned the same reward" in said
    assert "at 10 of 11 logged steps" in said  # the blip at 23 does not hide it
    assert "collapsed" not in said and "not a collapse" in said and "no gradient" in said
    assert "3.44 to 0.01" in said and "same completion every time" in said
    assert "nothing is wrong" in said and "`trainer.max_steps: 20`" in said
    assert "`sampling.dynamic: true`" not in said  # a fix for a collapse, not for a task learnt


def test_report_says_the_run_collapsed_and_what_to_do(tmp_path):
    """Unanimous groups below the run's best reward are a collapse: the groups agree on being wrong."""
    history = demo_like_history()
    for entry in history[19:]:
        entry["reward"] = 0.2
    text = write_report(write_state(tmp_path, history), recipe_name="smoke", completions=[], plots=[]).read_text()
    said = text.split("## What the curves say", 1)[1].split("\n## ", 1)[0]
    assert "collapsed at step 20" in said and "10 of 11 logged steps" in said  # the blip at 23 does not hide it
    assert "every advantage is 0" in said and "policy gradient" in said and "solved" not in said
    assert "3.44 to 0.01" in said and "same completion every time" in said
    assert "the groups are unanimous, right or wrong" in said
    for fix in ("`trainer.max_steps`", "`trainer.temperature`", "`sampling.dynamic: true`"):
        assert fix in said


def test_report_without_collapse_says_the_signal_held(tmp_path):
    history = [{"step": s, "reward": s / 10, "frac_reward_zero_std": 0.25, "entropy": 2.0} for s in range(1, 11)]
    text = write_report(write_state(tmp_path, history), recipe_name="ok", completions=[], plots=[]).read_text()
    assert "collapsed" not in text and "The learning signal held" in text and "25% of the groups" in text


def test_flat_panels_say_why(tmp_path):
    history = demo_like_history()
    reasons = flat_reasons(history, ON_POLICY)
    assert reasons["PPO clip ratios"].startswith("0 at every step by construction: one optimizer step per generation")
    assert reasons["Learning rate"] == "constant by the recipe (lr_scheduler_type: constant), 0.01"
    assert "Reward" not in reasons and "Entropy" not in reasons  # curves that move are not annotated
    off_policy = types.SimpleNamespace(**{**vars(ON_POLICY), "num_iterations": 2, "lr_scheduler_type": "linear"})
    assert flat_reasons(history, off_policy)["PPO clip ratios"] == "0 at every step: the ratio never left the clip range"
    # the same words on the panel itself and in report.md
    fig = figure(history, "t", ON_POLICY)
    panel_text = {ax.get_title(): [x.get_text().replace("\n", " ") for x in ax.texts] for ax in fig.axes}
    assert panel_text["Learning rate"] == [reasons["Learning rate"]] and panel_text["Entropy"] == []
    text = write_report(write_state(tmp_path, history), recipe_name="s", completions=[], plots=[], args=ON_POLICY).read_text()
    assert f"- PPO clip ratios: {reasons['PPO clip ratios']}" in text


def test_step_ticks_are_integers():
    fig = figure(demo_like_history(steps=3, collapse_at=2), "t")
    for ax in (ax for ax in fig.axes if ax.get_visible()):
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)


def test_completions_early_vs_late_and_identical_ones_said_once(tmp_path):
    early = [{"prompt": "Say a", "completion": f"x{i}", "rewards": {"char_fraction": i / 10}, "step": 1} for i in range(8)]
    late = [{"prompt": "Say a", "completion": "aaaa", "rewards": {"char_fraction": 1.0}, "step": 30} for _ in range(8)]
    text = write_report(write_state(tmp_path, demo_like_history()), recipe_name="s", completions=early + late,
                        plots=[]).read_text()
    section = text.split("## Sampled completions", 1)[1]
    assert "### Early: step 1 (8 completions, 8 distinct)" in section
    assert "### Late: step 30 (8 completions, 1 distinct)" in section
    first, last = section.split("### Early")[1].split("### Late")
    assert first.count("#### ") == 2 and "char_fraction 0.7" in first and "#### 2. char_fraction 0\n" in first  # best, worst
    assert last.count("#### ") == 1 and "All 8 completions at this step are the same text." in last
