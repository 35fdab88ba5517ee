"""The real-model lab's pieces (labs/algorithms.py) on the tiny model and on made-up run logs, not the real runs.

The real runs take hours on 2 cores; their figures are in bench/results/lab/. Here: each lab recipe trains a
step on the tiny model, a lab of one run goes end to end (train, eval, KL, page), a stopped lab resumes the
way it says, the KL measurement is 0 for an untouched adapter and positive for a moved one, and the verdicts
and figures follow the numbers they are given.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from grpokit import cli
from labs import algorithms as lab
from labs import claims

TINY = ["model.name_or_path=builtin:tiny-llama", "trainer.max_completion_length=16", "trainer.save_strategy=no"]


@pytest.mark.slow
@pytest.mark.parametrize("task, algorithm", [(t, a) for t in lab.LABS for a in lab.ALGORITHMS])
def test_each_lab_recipe_trains_a_step_on_the_tiny_model(task, algorithm, tmp_path):
    setup = lab.LABS[task]
    assert cli.main(["--recipe", str(setup.algorithms[algorithm]), *TINY, "trainer.max_steps=2",
                     f"trainer.output_dir={tmp_path / 'run'}"]) == 0
    state = json.loads((tmp_path / "run" / "trainer_state.json").read_text())
    logged = [h for h in state["log_history"] if "loss" in h]
    assert len(logged) == 2
    assert ("kl" in logged[0]) == (algorithm == "grpo_kl")  # TRL logs KL only with a KL term
    if algorithm == "dapo":
        assert "sampling/rounds" in logged[0] and "rewards/overlong_penalty/mean" in logged[0]
        # the accuracy the steps-to-threshold claim reads is the lab's own pass reward, of everything generated
        assert f"sampling/generated/rewards/{setup.reward}/mean" in logged[0]
    summary = claims.summarize_run(lab.history(tmp_path / "run"), None, setup.reward, setup.threshold)
    assert summary["curves"]["accuracy"][0] is not None
    # The completion metrics come with each generation (every 2nd step here), the loss-side ones every step.
    assert summary["steps"] == 2 and summary["curves"]["length"][0] is not None
    assert None not in summary["curves"]["entropy"]


@pytest.mark.slow
def test_a_lab_of_one_run_trains_measures_and_writes_its_page(tmp_path, capsys):
    # 8 of the 48 held-out prompts: the base eval, the run's eval and the KL measurement each read them
    argv = ["--algorithms", "grpo_kl", "--seeds", "0", "--parallel", "1", "--out", str(tmp_path),
            *sum((["--set", o] for o in [*TINY, "trainer.max_steps=2", "dataset.eval_limit=8"]), [])]
    assert lab.main(argv) == 0
    measures = json.loads((tmp_path / "measures" / "grpo_kl-seed-0.json").read_text())
    assert 0 <= measures["pass@1"] <= 1 and measures["kl_to_reference"]["kl_k3"] >= 0
    assert measures["kl_to_reference"]["tokens"] > 0
    page = (tmp_path / "README.md").read_text()
    assert "python labs/algorithms.py --algorithms grpo_kl" in page and "| grpo_kl | 1 |" in page
    assert {p.name for p in tmp_path.glob("claim-*.png")} == {f"claim-{c.key}.png" for c in claims.CLAIMS}
    # Again: nothing is trained or measured twice.
    log = (tmp_path / "runs" / "grpo_kl" / "seed-0.log").read_text()
    assert lab.main(argv) == 0
    assert (tmp_path / "runs" / "grpo_kl" / "seed-0.log").read_text() == log


def test_a_stopped_run_resumes_and_one_stopped_before_its_checkpoint_starts_over(tmp_path):
    job = lab.Job("dapo", 1)
    run = job.run_dir(tmp_path)
    assert "--resume" not in lab.launch_args(job, tmp_path, []) and "--overwrite" not in lab.launch_args(job, tmp_path, [])
    run.mkdir(parents=True)
    assert lab.launch_args(job, tmp_path, [])[-1] == "--overwrite"  # grpokit removes only what it wrote
    (run / "checkpoint-10").mkdir()
    (run / "checkpoint-10" / "trainer_state.json").write_text("{}")
    argv = lab.launch_args(job, tmp_path, ["trainer.max_steps=4"])
    assert argv[-2:] == ["trainer.max_steps=4", "--resume"] and "trainer.seed=1" in argv
    assert not lab.finished(job, tmp_path)


@pytest.mark.slow
def test_kl_to_the_base_model_is_zero_for_an_untouched_adapter_and_positive_for_a_moved_one(tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model

    from grpokit.config import load, validate
    from grpokit.trainer.models import load_model, model_source

    # 8 held-out prompts: zero and positive hold on any of them, and each costs a generation and two forward passes
    recipe = validate(load(str(lab.ALGORITHMS["grpo"]), [*TINY, "dataset.eval_limit=8", f"trainer.output_dir={tmp_path}"]))
    model = get_peft_model(load_model(model_source(recipe)[0], recipe), LoraConfig(r=4, target_modules="all-linear"))
    model.save_pretrained(tmp_path / "untouched")  # LoRA's B starts at zero: the policy is the base model
    assert lab.kl_to_reference(recipe, tmp_path / "untouched")["kl_k3"] == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "moved")
    assert lab.kl_to_reference(recipe, tmp_path / "moved")["kl_k3"] > 1e-3


def test_steps_to_threshold_uses_the_trailing_window():
    assert claims.steps_to([0.0] * 3 + [1.0] * 10, threshold=1.0) == 3 + claims.WINDOW  # the first step whose last WINDOW all reach it
    assert claims.steps_to([1.0, 1.0]) == 1  # fewer steps than a window: the mean of what there is
    assert claims.steps_to([0.5] * 20) is None
    # Accuracy comes once per generation (every 2nd step in the lab): the window is over logged points, and the
    # step returned is the step of the point that completes it.
    assert claims.steps_to([0.0, None] * 3 + [1.0, None] * 10, threshold=1.0) == 2 * (3 + claims.WINDOW) - 1
    assert claims.steps_to([0.8, None] * 10) == 1
    assert claims.window_mean([1, 2, 3, 4, 5, 6, 7], last=False) == 3 and claims.window_mean([None, 2.0], last=True) == 2.0


CLAIM = next(c for c in claims.CLAIMS if c.key == "length_growth")  # grpo higher than dr_grpo and dapo


@pytest.mark.parametrize("figures, state", [
    ({"grpo": [5, 6, 7], "dr_grpo": [1, 2, 3], "dapo": [0, 1, 2]}, "held"),  # every seed beats every seed
    ({"grpo": [5, 6, 7], "dr_grpo": [1, 2, 6], "dapo": [0, 1, 2]}, "leans"),  # the means only
    ({"grpo": [1, 2, 3], "dr_grpo": [5, 6, 7], "dapo": [0, 1, 2]}, "not shown"),
    ({"grpo": [5, 6, 7], "dapo": [0, 1, 2]}, "no data"),
    ({"grpo": [7], "dr_grpo": [1], "dapo": [0]}, "too few seeds"),  # one seed a side has no spread to judge by
    ({"grpo": [5, 6, 7], "dr_grpo": [1, 2], "dapo": [0, 1, 2]}, "too few seeds"),
    ({"grpo": [5, 6, 7], "dr_grpo": [None, None, None], "dapo": [0, 1, 2]}, "never reached"),
])
def test_a_verdict_says_held_only_when_the_seeds_do_not_overlap(figures, state):
    assert claims.verdict(CLAIM, figures)["state"] == state


def test_a_lower_is_better_claim_and_its_sentence_give_the_difference_and_the_spread():
    kl = next(c for c in claims.CLAIMS if c.key == "kl_to_reference")
    result = claims.verdict(kl, {"grpo_kl": [0.01, 0.02, 0.03], "grpo": [0.1, 0.2, 0.3]})
    assert result["state"] == "held"
    text = claims.sentence(kl, result)
    assert text.startswith("**Held here.**") and "grpo_kl minus grpo: -0.18" in text and "±0.01 / ±0.1" in text
    # Equal seeds have no spread, not a float's rounding of one (0.1 three times is not "± 1.7e-17").
    assert claims.spread([0.1, 0.1, 0.1]) == 0.0 and claims.spread([1.0, 3.0]) == pytest.approx(2 ** 0.5)


def test_a_verdict_from_too_few_seeds_or_a_figure_never_reached_says_so_and_not_held():
    steps = next(c for c in claims.CLAIMS if c.key == "steps_to_threshold")  # dapo fewer steps than grpo
    one = claims.sentence(steps, claims.verdict(steps, {"dapo": [12], "grpo": [20]}))
    assert one.startswith("**Not judged yet: too few seeds.**") and "1 and 1 seeds" in one and "at least 3" in one
    never = claims.sentence(steps, claims.verdict(steps, {"dapo": [None, None, None], "grpo": [None, None, None]}))
    assert never.startswith("**Not shown at this scale.**") and "no seed of dapo or grpo reached it" in never
    assert "no runs yet" not in never


def test_a_threshold_some_seeds_never_reached_counts_them_one_step_past_their_run():
    steps = next(c for c in claims.CLAIMS if c.key == "steps_to_threshold")  # dapo fewer steps than grpo
    # Every dapo seed reached it, no grpo seed did within 30 steps: the claim holds, it is not "not shown".
    held = claims.verdict(steps, {"dapo": [12, 20, 25], "grpo": [None, None, None]}, censor=31)
    assert held["state"] == "held"
    text = claims.sentence(steps, held)
    assert text.startswith("**Held here.**") and "dapo reached it in 3 of 3 seeds, grpo in 0 of 3" in text
    assert "a seed that never reached it counts as step 31" in text
    # One dapo seed reached it: better in the mean, yet its other seeds tie grpo's at the censor.
    leans = claims.verdict(steps, {"dapo": [25, None, None], "grpo": [None, None, None]}, censor=31)
    assert leans["state"] == "leans" and leans["comparisons"][0]["difference"] == pytest.approx(-2.0)
    # The other way round: grpo reached it, dapo never did.
    assert claims.verdict(steps, {"dapo": [None] * 3, "grpo": [10, 12, 14]}, censor=31)["state"] == "not shown"
    # Nobody reached it: still said as such, with or without a censor.
    assert claims.verdict(steps, {"dapo": [None] * 3, "grpo": [None] * 3}, censor=31)["state"] == "never reached"


def fake_run(runs: Path, job: lab.Job, lengths: list[float], accuracy: list[float]) -> None:
    run = job.run_dir(runs)
    run.mkdir(parents=True)
    history = [{"step": i + 1, "loss": 0.0, "completions/mean_length": n, "entropy": 1.0 - 0.01 * i,
                claims.ACCURACY: a, "frac_reward_zero_std": 0.25} for i, (n, a) in enumerate(zip(lengths, accuracy))]
    (run / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": len(history)}))


def test_the_report_draws_every_claim_and_says_which_held(tmp_path):
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        fake_run(runs, lab.Job("grpo", seed), [10 + 2 * i for i in range(12)], [0.1 * i for i in range(12)])
        fake_run(runs, lab.Job("dr_grpo", seed), [10.0] * 12, [0.1 * i for i in range(12)])
        fake_run(runs, lab.Job("dapo", seed), [10 - 0.1 * i for i in range(12)], [0.2 * i for i in range(12)])
    jobs = [lab.Job(a, s) for a in lab.ALGORITHMS for s in (0, 1, 2)]
    report = lab.write_report(jobs, runs, tmp_path, "python labs/algorithms.py")
    states = {v["claim"]: v["state"] for v in report["verdicts"]}
    assert states == {"length_growth": "held", "entropy_kept": "not shown", "steps_to_threshold": "held",
                      "kl_to_reference": "no data"}  # no KL measured, no grpo_kl run
    assert report["runs"]["grpo"][0]["length_growth"] == pytest.approx(2 * (12 - claims.WINDOW))
    page = (tmp_path / "README.md").read_text()
    assert page.count("**Held here.**") == 2 and "**Not measured yet.**" in page
    assert "| grpo | 3 |" in page and "| grpo_kl |" not in page
    # Every claim says which way each curve went: grpo's lengths 10..32 (every step logged), dr_grpo's flat.
    assert "grpo 14 → 28 (3 seeds); dr_grpo 10 → 10 (3 seeds); dapo 9.8 → 9.1 (3 seeds)." in page
    assert "grpo_kl no runs; grpo not logged." in page  # the KL curve: no grpo_kl run, grpo logs no KL
    for claim in claims.CLAIMS:
        assert (tmp_path / f"claim-{claim.key}.png").read_bytes()[:4] == b"\x89PNG"


def test_a_task_lab_reads_its_own_reward_and_threshold_and_says_so_on_its_page(tmp_path):
    """The chain_sum lab: accuracy is task_score's training mean, its own threshold (set before any run) decides the
    steps-to-threshold figure, the table and the page; its runs use its own four recipes, not the additions lab's."""
    assert lab.LABS["chain_sum"].threshold == 0.5 and lab.LABS["chain_sum"].reward == "task_score"
    setup = replace(lab.LABS["chain_sum"], threshold=0.3)  # a threshold this test's made-up curves cross
    assert lab.Job("dapo", 1, setup).recipe == lab.RECIPES / "chain_sum" / "dapo-lab.yaml"
    assert "recipes/smollm2-135m/lab/chain_sum/grpo-lab.yaml" in " ".join(lab.launch_args(lab.Job("grpo", 0, setup), tmp_path, []))
    steps = [{"step": i + 1, "loss": 0.0, "rewards/task_score/mean": a, "rewards/accuracy/mean": 0.0}
             for i, a in enumerate([0.1, 0.2, 0.4, 0.5, 0.5, 0.5])]
    assert claims.summarize_run(steps, None, "task_score", 0.3)["steps_to_threshold"] == 4  # (0.1+..+0.5)/4 = 0.3
    assert claims.summarize_run(steps, None)["steps_to_threshold"] is None  # the additions lab's key and 0.75
    runs = tmp_path / "runs"
    for seed in (0, 1, 2):
        for algorithm, rise in (("grpo", 0.05), ("dapo", 0.1)):
            run = lab.Job(algorithm, seed, setup).run_dir(runs)
            run.mkdir(parents=True)
            history = [{"step": i + 1, "loss": 0.0, "completions/mean_length": 30.0, "entropy": 1.0,
                        "rewards/task_score/mean": rise * i} for i in range(10)]
            (run / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 10}))
    report = lab.write_report([lab.Job(a, s, setup) for a in lab.ALGORITHMS for s in (0, 1, 2)], runs, tmp_path, "cmd")
    assert report["task"] == "chain_sum" and report["accuracy_reward"] == "task_score" and report["threshold"] == 0.3
    # dapo's trailing 5-point mean first reaches 0.3 at step 6 (0.1..0.5), grpo's at step 9 (0.2..0.4)
    assert [r["steps_to_threshold"] for r in report["runs"]["dapo"]] == [6] * 3
    assert [r["steps_to_threshold"] for r in report["runs"]["grpo"]] == [9] * 3
    assert next(v for v in report["verdicts"] if v["claim"] == "steps_to_threshold")["state"] == "held"
    page = (tmp_path / "README.md").read_text()
    assert page.startswith("# The chapter's claims on SmolLM2-135M-Instruct, on reasoning-gym's chain_sum")
    assert "(recipes/smollm2-135m/lab/chain_sum/)" in page and "training mean of reward `task_score`" in page
    assert "steps to accuracy 0.3" in page and "reaches 0.3" in page and "0.75" not in page


def test_the_steps_figure_drawn_and_tabled_is_the_one_the_verdict_compares():
    """A seed that never reached the threshold counts as step `censor` in the verdict; the picture draws it there
    (hollow) with its side's bar at that mean, and the table's cell says how many seeds it holds - seen on the
    chain_sum lab, whose grpo bar stood at 28 (2 seeds drawn) while the verdict compared 29."""
    steps = next(c for c in claims.CLAIMS if c.key == "steps_to_threshold")
    row = dict.fromkeys((key for key, _ in claims.TABLE), 1.0)
    results = {"dapo": [{**row, steps.key: v} for v in (15, 21, 25)], "grpo": [{**row, steps.key: v} for v in (27, 29, None)]}
    result = claims.verdict(steps, {a: [r[steps.key] for r in rows] for a, rows in results.items()}, censor=31)
    dots = claims.compared_seeds(steps, results, censor=31)
    assert dots["grpo"] == {"reached": [27, 29], "never": 1, "mean": pytest.approx(29.0)}
    assert dots["dapo"]["mean"] - dots["grpo"]["mean"] == pytest.approx(result["comparisons"][0]["difference"])
    # Nobody reached it: nothing is counted at the censor (the verdict says "never reached" then).
    none = claims.compared_seeds(steps, {"dapo": [{steps.key: None}], "grpo": [{steps.key: None}]}, censor=31)
    assert none["dapo"] == {"reached": [], "never": 0, "mean": None}
    # Without a censor (a claim whose figure is not a first step) a missing figure is left out, as before.
    assert claims.compared_seeds(steps, results)["grpo"] == {"reached": [27, 29], "never": 0, "mean": pytest.approx(28.0)}
    line = next(line for line in claims.table(results, None) if line.startswith("| grpo |"))
    assert line.endswith("| 28 ± 1.4 (2 of 3) |") and "| 1 ± 0 |" in line  # a figure every seed has: no count
