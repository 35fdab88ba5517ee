"""report.md tells the truth about a run: the learning signal judged over a window of steps, how much of the run had
no gradient, a reward that fell from its best, held-out pass@1 per scored checkpoint and a held-out drop; and
`--plot RUN --compare RUN2 ...` draws runs on shared axes into RUN only. Fast: synthetic trainer states, no training."""

import json
import math
import random
from pathlib import Path

import pytest

from grpokit.cli import main
from grpokit.reporting.report import write_report

# --- synthetic runs: (step -> log entry) -----------------------------------------------------------------------------


def two_prompts_per_step(steps=80):
    """The real 80-step SmolLM2 arithmetic run's shape: 2 prompts per step, so the share of groups without spread is
    0, 0.5 or 1 and the reward swings between 0 and 1; half the steps have every group unanimous (all right or all
    wrong), the last one included, at reward 1.0."""
    cycle = [(0.0, 0.5), (1.0, 0.0), (0.5, 0.6), (1.0, 1.0)]  # (frac_reward_zero_std, reward), ending unanimous at 1
    return [{"step": s, "frac_reward_zero_std": cycle[(s - 1) % 4][0], "reward": cycle[(s - 1) % 4][1],
             "reward_std": 0.0 if cycle[(s - 1) % 4][0] == 1.0 else 0.3, "completions/mean_length": 40.0 + s / 10,
             "entropy": 0.6, "learning_rate": 1e-5} for s in range(1, steps + 1)]


def healthy(steps=40):
    """Reward climbs from 0.2 to about 0.8 with a little noise; a fifth of the groups unanimous, never all."""
    return [{"step": s, "frac_reward_zero_std": 0.125 + 0.125 * (s % 2), "reward": 0.2 + 0.6 * s / steps + 0.03 * (-1) ** s,
             "completions/mean_length": 60.0 - s / 4, "entropy": 1.2 - s / 100, "kl": 0.001 * s,
             "clip_ratio/region_mean": 0.0} for s in range(1, steps + 1)]


def collapsing(steps=60):
    """Reward rises to 0.8 by step 30, then falls; from step 45 every group is unanimous (wrong) and entropy is gone."""
    out = []
    for s in range(1, steps + 1):
        reward = 0.8 * s / 30 if s <= 30 else max(0.05, 0.8 - 0.05 * (s - 30))
        dead = s >= 45
        out.append({"step": s, "reward": reward, "rewards/accuracy/mean": reward, "rewards/format/mean": 1.0 - s / 100,
                    "frac_reward_zero_std": 1.0 if dead else 0.2, "entropy": 0.02 if dead else 1.5 - s / 40,
                    "completions/mean_length": 30.0 + s})
    return out


def stalled_tool_run(steps=30, dead_from=16, logging_steps=1):
    """The shipped calculator's 30-step runs: 4 prompts a step, the call rate up to 1.00 by step 10, then entropy down
    to 0.02 and, from step 16, every group of 4 alike at a reward below the run's best (right or wrong, unchanged)."""
    out = []
    for s in range(logging_steps, steps + 1, logging_steps):
        dead = s >= dead_from
        out.append({"step": s, "reward": (0.5, 0.75, 0.5, 0.25)[s % 4] if dead else min(0.9, 0.1 + s / 16),
                    "frac_reward_zero_std": 1.0 if dead else (0.25, 0.5, 0.75)[s % 3],
                    "entropy": 0.02 if s >= 12 else 1.25 - s / 10, "tools/call_frequency": min(1.0, 0.4 + s / 16)})
    return out


def noisy_flat(steps=80, seed=0):
    """2 prompts per step and nothing learnt: each step's reward is 0, 0.5 or 1 at random, a fifth of the groups
    unanimous. Its best window is above its last by chance alone."""
    rng = random.Random(seed)
    return [{"step": s, "reward": rng.choice((0.0, 0.5, 1.0)), "frac_reward_zero_std": rng.choice((0.0, 0.0, 0.0, 0.5))}
            for s in range(1, steps + 1)]


def write_state(folder, history, **extra):
    folder.mkdir(parents=True, exist_ok=True)
    steps = history[-1]["step"]
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": steps,
                                                           "max_steps": steps, **extra}))
    return folder


def write_eval(folder, passed, prompts=48, heldout="data/arithmetic-heldout.jsonl"):
    """An eval.json as `--eval` writes it (the fields the report reads)."""
    folder.mkdir(parents=True, exist_ok=True)
    name = "eval-base.json" if folder.name == "base" else "eval.json"
    target = folder.parent if name == "eval-base.json" else folder
    (target / name).write_text(json.dumps({
        "prompts": prompts, "heldout": heldout, "pass_reward": "accuracy",
        "greedy": {"pass@1": passed / prompts, "passed": passed, "rewards": {"accuracy": passed / prompts, "reward": passed / prompts}},
        "measured": "greedy decoding of each held-out prompt"}))


def report(run, **kwargs) -> str:
    return write_report(run, recipe_name="t", completions=[], plots=[], **kwargs).read_text()


def said(text: str) -> str:
    """The report's "What the curves say" section, joined into one paragraph run."""
    return text.split("## What the curves say", 1)[1].split("\n## ", 1)[0]


# --- the sentences a user reads, per kind of run --------------------------------------------------------------------

CASES = {
    # 2 prompts per step: the last step is unanimous at reward 1 and half the run had no gradient; checkpoint-40
    # scored 0.458 held-out and the final model 0.125.
    "two-prompts-per-step": dict(
        history=two_prompts_per_step(), evals={"base": 11, "checkpoint-40": 22, ".": 6},
        says=["**Held-out pass@1 fell from 0.458 (checkpoint-40) to 0.125 (final)**: the run overfit or collapsed "
              "after step 40; use checkpoint-40",
              "**The learning signal was thin**: over the last 10 logged steps (steps 71–80) 65% of the groups on "
              "average had rewards without spread",
              "At 40 of 80 logged steps (50% of the run) every group's completions got the same reward",
              "The last logged step (step 80) had no spread in any group; one step among 80 is not a collapse",
              "Averaged over 10 logged steps, the mean reward went from 0.47 (steps 1–10) to 0.58 (steps 71–80).",
              "more prompts per step", "`trainer.save_steps`"],
        never=["The learning signal held", "collapsed at step", "fell from its best"]),
    # a run that learns: the signal held, nothing fell, a later checkpoint scored higher than an earlier one
    "healthy": dict(
        history=healthy(), evals={"base": 10, "checkpoint-20": 19, ".": 26},
        says=["The learning signal held: over the last 5 logged steps (steps 36–40) 18% of the groups on average had "
              "rewards without spread", "No logged step had every group without spread; over the whole run 19% of the "
              "groups had none on average.",
              "Averaged over 5 logged steps, the mean reward went from 0.239 (steps 1–5) to 0.776 (steps 36–40)."],
        never=["thin", "collapsed", "fell", "What to change", "To keep the best model"]),
    # noise is not a fall: a reward that swings step to step around one level, over several seeds
    **{f"noisy-flat-seed{seed}": dict(history=noisy_flat(seed=seed), evals={}, says=["The learning signal held"],
                                      never=["fell from its best"]) for seed in range(5)},
    # a run that learnt, then lost it: the reward and `accuracy` fell from their best, the groups went unanimous
    # (wrong), and held-out pass@1 fell between two scored checkpoints
    "collapsing": dict(
        history=collapsing(), evals={"checkpoint-30": 24, "checkpoint-60": 2},
        says=["**Held-out pass@1 fell from 0.500 (checkpoint-30) to 0.042 (checkpoint-60)**: the run overfit or "
              "collapsed after step 30; use checkpoint-30", ", not checkpoint-60.",
              "**The run collapsed at step 45: from step 45 of 60 on, every group's completions scored alike",
              "1.00 at every one of 16 logged steps): the last 16 steps (27% of the run) gave no gradient.**",
              "the groups are unanimous, right or wrong",
              "At 16 of 60 logged steps (27% of the run) every group's completions got the same reward",
              "**The mean reward fell from its best**: averaged over 8 logged steps it peaked at 0.731 (steps 25–32) "
              "and ended at 0.05 (steps 53–60), 0.681 lower.",
              "**Reward `format` fell from its best**", "`sampling.dynamic: true`", "`trainer.save_steps`"],
        never=["The learning signal held", "signal was thin", "at the top of the run's range", "the mean reward went",
               "Reward `accuracy` fell"]),  # `accuracy` is the total here: said once
    # the last half of a run gave no gradient: said plainly, in the run's steps and as a share of them, with the
    # recipe keys that keep groups mixed longer
    "stalled-tool-run": dict(
        history=stalled_tool_run(), evals={},
        says=["**The run collapsed at step 16: from step 16 of 30 on, every group's completions scored alike "
              "(`frac_reward_zero_std`, the console's zero-std groups, 1.00 at every one of 15 logged steps): the last "
              "15 steps (50% of the run) gave no gradient.**", "Entropy fell from 1.15 to 0.02",
              "a higher `trainer.temperature`", "a larger `trainer.num_generations`", "a smaller `trainer.learning_rate`"],
        never=["The learning signal held", "signal was thin", "solved"]),
    # logged every 5 steps: a logged point stands for the 5 steps up to it, so the dead stretch first logged at step
    # 20 began at step 16
    "stalled-logged-every-5": dict(
        history=stalled_tool_run(logging_steps=5), evals={},
        says=["from step 16 of 30 on, every group's completions scored alike", "1.00 at every one of 3 logged steps",
              "the last 15 steps (50% of the run) gave no gradient"],
        never=["The learning signal held", "solved"]),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_report_says_what_the_run_did(tmp_path, case):
    c = CASES[case]
    run = write_state(tmp_path / "run", c["history"])
    for where, passed in c["evals"].items():
        write_eval(run / where if where not in (".",) else run, passed)
    text = report(run)
    verdict = said(text)
    for sentence in c["says"]:
        assert sentence in verdict, sentence
    for words in c["never"]:
        assert words not in verdict, words


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_no_sentence_contradicts_the_figures(tmp_path, case):
    # The final-figures table shows the last logged share without spread; a verdict of "held" never stands next to
    # a closing window where half the groups or more had no spread, and "no step" never next to a step that had none.
    history = CASES[case]["history"]
    text = report(write_state(tmp_path / "run", history))
    verdict = said(text)
    zero = [h["frac_reward_zero_std"] for h in history]
    tail = zero[-max(3, math.ceil(len(zero) / 8)):]
    if "The learning signal held" in verdict:
        assert sum(tail) / len(tail) < 0.5
    if "No logged step had every group without spread" in verdict:
        assert max(zero) < 0.99
    last = f"| share of groups with zero reward std (`frac_reward_zero_std`) | {zero[0]:g} (step {history[0]['step']}) | {zero[-1]:g} (step {history[-1]['step']})"
    assert last in text


def test_heldout_table_lists_every_scored_checkpoint_in_step_order(tmp_path):
    run = write_state(tmp_path / "run", two_prompts_per_step())
    for where, passed in {"base": 11, "checkpoint-40": 22, "checkpoint-80": 6, ".": 6}.items():
        write_eval(run / where if where != "." else run, passed)
    (run / "checkpoint-120").mkdir()  # not scored: no row
    (run / "checkpoint-9").mkdir()
    (run / "checkpoint-9" / "eval.json").write_text("{not json")  # damaged: named, not a traceback
    table = report(run).split("## Held-out eval", 1)[1]
    columns = next(line for line in table.splitlines() if line.startswith("| "))
    assert columns == "| | before (base model) | checkpoint-40 | checkpoint-80 | after (this run) |"
    assert "| pass@1 (greedy) | 0.229 | 0.458 | 0.125 | 0.125 |" in table and "| prompts passed | 11/48 | 22/48 |" in table
    # each point of the run against the base: a checkpoint's change is what its steps did
    assert "| change in pass@1 | — | +0.229 (40 GRPO steps) | -0.104 (80 GRPO steps) | -0.104 (GRPO) |" in table
    assert "Not read (not `--eval` output): `checkpoint-9/eval.json`" in table


def test_one_scored_model_says_how_to_score_checkpoints(tmp_path):
    run = write_state(tmp_path / "run", healthy())
    write_eval(run, 30)
    text = report(run)
    assert "--eval RUN_DIR/checkpoint-N" in text.split("## Held-out eval", 1)[1]
    assert "Held-out pass@1 fell" not in text


def test_a_one_prompt_dip_is_not_a_heldout_drop(tmp_path):
    # 0.479 -> 0.458 on 48 prompts is one prompt: noise, not a verdict
    run = write_state(tmp_path / "run", healthy())
    write_eval(run / "checkpoint-20", 23)
    write_eval(run, 22)
    assert "Held-out pass@1 fell" not in report(run)


# --- --plot RUN --compare RUN2 ---------------------------------------------------------------------------------------


def snapshot(folder):
    return {p.relative_to(folder): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


def test_plot_compare_draws_runs_on_shared_axes_into_run_only(tmp_path, capsys):
    run = write_state(tmp_path / "thin", two_prompts_per_step())
    write_eval(run / "checkpoint-40", 22)
    write_eval(run, 6)
    other = write_state(tmp_path / "healthy", healthy())
    third = write_state(tmp_path / "collapsing", collapsing())
    before = {f: snapshot(f) for f in (other, third)}
    assert main(["--plot", str(run), "--compare", str(other), str(third)]) == 0
    assert {f: snapshot(f) for f in (other, third)} == before  # the compared runs are read, never written
    png = run / "plots" / "compare.png"
    assert str(png) in capsys.readouterr().out
    import matplotlib.image

    height, width = matplotlib.image.imread(png).shape[:2]
    assert 800 <= width <= 4000 and 500 <= height <= 4000
    text = (run / "report.md").read_text()
    section = text.split("## Compared with other runs", 1)[1]
    assert "![compare](plots/compare.png)" in section
    rows = {line.split(" | ")[0].strip("| `"): line for line in section.splitlines() if line.startswith("| `")}
    assert list(rows) == [str(run), str(other), str(third)]
    assert "| 80 | 1 |" in rows[str(run)] and "| 40 of 80 |" in rows[str(run)]
    assert "0.125 (final); best 0.458 (checkpoint-40) ⚠ fell" in rows[str(run)]
    assert "| 0 of 40 | — |" in rows[str(other)] and "| 16 of 60 |" in rows[str(third)]
    # a second --plot replaces its own compare.png (grpokit wrote it) and the report without --compare drops the section
    assert main(["--plot", str(run), "--compare", str(other)]) == 0
    assert main(["--plot", str(run)]) == 0
    assert "## Compared with other runs" not in (run / "report.md").read_text()


def test_compare_figure_names_each_run_folder(tmp_path):
    from grpokit.reporting.compare import figure, load_runs

    runs = load_runs(write_state(tmp_path / "a", healthy()), [write_state(tmp_path / "b", collapsing())])
    fig = figure(runs)
    titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
    assert titles == ["Reward", "Completion length", "Entropy", "PPO clip ratio (region)", "KL to reference (k3)",
                      "Groups with zero reward std"]
    notes = {ax.get_title(): [t.get_text().replace("\n", " ") for t in ax.texts] for ax in fig.axes if ax.get_visible()}
    assert notes["KL to reference (k3)"] == [f"not logged by {tmp_path / 'b'}"] and notes["Reward"] == []
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [f"{tmp_path / 'a'} (this report)", str(tmp_path / "b")]


@pytest.mark.parametrize("argv, message", [
    # a compared folder that holds no run: named, exit 2, nothing written into RUN
    (["--plot", "{run}", "--compare", "{empty}"], "no trainer_state.json in '{empty}'"),
    # the same folder twice
    (["--plot", "{run}", "--compare", "{run}"], "is the same folder as"),
    # --compare alone: it compares with the run --plot reports on
    (["--compare", "{run}"], "--plot RUN_DIR --compare RUN2"),
])
def test_compare_refuses_clearly(tmp_path, capsys, argv, message):
    paths = {"run": write_state(tmp_path / "run", healthy()), "empty": tmp_path / "empty"}
    paths["empty"].mkdir()
    assert main([a.format(**paths) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message.format(**paths) in err and "Traceback" not in err
    assert sorted(p.name for p in paths["run"].iterdir()) == ["trainer_state.json"]
    assert list(paths["empty"].iterdir()) == []


def test_compare_png_the_user_owns_is_not_replaced(tmp_path, capsys):
    run = write_state(tmp_path / "run", healthy())
    other = write_state(tmp_path / "other", collapsing())
    assert main(["--plot", str(run)]) == 0  # grpokit's plots/ ...
    (run / "plots" / "compare.png").write_bytes(b"mine")  # ... with a file of the user's inside
    assert main(["--plot", str(run), "--compare", str(other)]) == 2
    assert "compare.png" in capsys.readouterr().err
    assert (run / "plots" / "compare.png").read_bytes() == b"mine"


def test_scoring_a_checkpoint_refreshes_its_runs_report(tmp_path, monkeypatch, capsys):
    # `--eval RUN/checkpoint-N` writes checkpoint-N/eval.json; RUN's report (grpokit's) gains its row and the verdict.
    from grpokit.run import evaluate
    from tests.helpers import with_trainer, write_recipe

    recipe = write_recipe(tmp_path, with_trainer(tmp_path))
    run = write_state(tmp_path / "run", two_prompts_per_step())
    write_eval(run, 6)
    (run / "checkpoint-40").mkdir()
    assert main(["--plot", str(run)]) == 0

    def scored(recipe, run_dir, samples=0, out=None):  # stands in for the model's greedy pass over held-out prompts
        write_eval(Path(run_dir), 22)
        return {"greedy": {"pass@1": 22 / 48, "passed": 22}, "prompts": 48, "pass_reward": "accuracy"}

    monkeypatch.setattr(evaluate, "evaluate", scored)
    assert main(["--recipe", str(recipe), "--eval", str(run / "checkpoint-40")]) == 0
    text = (run / "report.md").read_text()
    assert "| | checkpoint-40 | after (this run) |" in text and "| pass@1 (greedy) | 0.458 | 0.125 |" in text
    assert "**Held-out pass@1 fell from 0.458 (checkpoint-40) to 0.125 (final)**" in said(text)
