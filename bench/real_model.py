"""A real model learns: held-out pass@1 of SmolLM2-135M-Instruct before and after the arithmetic recipe, per seed.

    nice -n 10 .venv/bin/python bench/real_model.py --seeds 0 1 2 3 4 --commit-results   # 5 seeds, twice their steps
    .venv/bin/python bench/real_model.py --seeds 0 --steps 5               # a quick look at the pipeline

What it runs, all through the recipe (recipes/smollm2-135m/arithmetic.yaml) and grpokit's own code:
1. `--eval` of the base model on the held-out split (greedy, so one run serves every seed).
2. for each seed: train the recipe with `trainer.seed=<seed>` (every other knob as shipped) for twice its
   `max_steps` N, saving a checkpoint at step N, then `--eval` both on the same held-out prompts: the
   checkpoint is the recipe as shipped, the end is "trained twice as long". The checkpoint at N is exactly
   the N-step run because the recipe's learning-rate schedule does not depend on max_steps (constant: the
   bench refuses any other) and nothing else reads max_steps before step N.
Writes real_model.json (every figure, per seed, with how it was measured) and real_model.png (the per-step mean
reward of each seed's training batches, and held-out pass@1 before vs after) in runs/bench/, or with
`--commit-results` in bench/results/ with this bench's section of bench/README.md (labs/outputs.py's rule). Wall time per step is the trainer's own `train_runtime` over its steps.

`--threads` sets torch's intra-op threads (default: torch's own choice). On a CPU shared with other jobs,
1 thread is much faster than 2 (spinning OpenMP workers wait on each other): say which was used.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)

from grpokit import files  # noqa: E402
from grpokit.errors import Problem, RecipeError  # noqa: E402
from labs.claims import window_mean  # noqa: E402
from labs.outputs import COMMITTED, add_commit_flag, out_path, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml"
QUOTED = COMMITTED / "real_model.json"  # the results bench/README.md quotes (N and 2N of the arithmetic recipe)
TARGET_RISE = 0.25  # the bar: held-out pass@1 up by >= 25 points on every seed, at N and at 2N steps
STEADY_SCHEDULES = ("constant", "constant_with_warmup")  # a checkpoint at N of a 2N-step run is the N-step run


def load_recipe(overrides: list[str], recipe: Path = RECIPE):
    from grpokit.config import load, validate

    return validate(load(str(recipe), overrides))


def shipped_steps(trainer: dict, steps: int | None, recipe: Path = RECIPE) -> int:
    """N: the recipe's max_steps (or --steps); refuses a schedule under which step N of 2N differs from an N-step run."""
    if trainer.get("lr_scheduler_type", "linear") not in STEADY_SCHEDULES:
        raise RecipeError([Problem("trainer.lr_scheduler_type", "depends on max_steps, so a checkpoint of a longer run "
                                   "is not the shipped run", trainer.get("lr_scheduler_type"),
                                   allowed=", ".join(STEADY_SCHEDULES), file=str(recipe))])
    return steps or trainer["max_steps"]


def train_seed(seed: int, steps: int, run_dir: Path, once: bool = False, recipe: Path = RECIPE) -> None:
    """Train the recipe for one seed into run_dir for 2 x `steps` (`once`: `steps`), keeping the checkpoint at `steps`."""
    from grpokit.run import training
    from grpokit.run.request import Request

    overrides = [f"trainer.seed={seed}", f"trainer.output_dir={run_dir}", f"trainer.max_steps={(1 if once else 2) * steps}",
                 f"trainer.save_steps={steps}", "trainer.save_total_limit=2"]
    training.train(load_recipe(overrides, recipe), Request(overwrite=True))


def trained_state(run_dir: Path) -> tuple[Path, dict]:
    """(adapter dir, trainer state): the finished run's, else its latest checkpoint's (a run stopped early)."""
    from grpokit.checkpoints.rundir import latest_checkpoint

    where = run_dir if (run_dir / "adapter_config.json").is_file() and (run_dir / "trainer_state.json").is_file() else None
    where = where or (Path(latest_checkpoint(run_dir)) if latest_checkpoint(run_dir) else None)
    if where is None:
        raise files.problem(run_dir, "holds no finished run and no checkpoint to score", "--report-only",
                            "train the seed first (drop --report-only)")
    return where, read_state(where / "trainer_state.json")


def read_state(path: Path) -> dict:
    """A trainer_state.json with its log_history list and global_step, or one line naming it."""
    state = files.read_json(path, dict)
    if not (isinstance(state.get("log_history"), list) and all(isinstance(h, dict) for h in state["log_history"])
            and isinstance(state.get("global_step"), int)):
        raise files.problem(path, "is not a trainer state (a log_history list of objects and a global_step)")
    return state


def timing(state: dict) -> dict:
    history = state["log_history"]
    per_step = [h for h in history if "reward" in h]
    n_steps = max((h.get("step", 0) for h in per_step), default=0)
    final = next((h for h in history if "train_runtime" in h), None)
    step_times = [h["step_time"] for h in per_step if "step_time" in h]
    seconds = final["train_runtime"] if final else sum(step_times)
    truncated = [h.get("completions/clipped_ratio") for h in per_step]
    calls = [h["tools/call_frequency"] for h in per_step if "tools/call_frequency" in h]
    alike = [h["frac_reward_zero_std"] for h in per_step if "frac_reward_zero_std" in h]
    entropy = [h["entropy"] for h in per_step if "entropy" in h]
    return {"steps": n_steps, "finished": final is not None, "rewards": [round(pass_reward_mean(h), 4) for h in per_step],
            "truncated": [None if t is None else round(t, 4) for t in truncated],
            "seconds_training": round(seconds, 1), "seconds_per_step": round(seconds / max(1, n_steps), 1),
            **({"tool_calls": [round(c, 4) for c in calls]} if calls else {}),
            **({"zero_std_groups": [round(a, 4) for a in alike]} if alike else {}),
            **({"entropy": [round(e, 4) for e in entropy]} if entropy else {}),
            # the pass reward's spread over the step's completions: 0 where all of them scored alike on the task itself
            "rewards_std": [round(pass_reward_mean(h, "std"), 4) for h in per_step]}


README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- real_model.py writes this section from results/real_model.json -->", "<!-- end of real_model.py's section -->"


def markdown(results: dict) -> str:
    """bench/README.md's section on the real model, from the results alone (so the page cannot drift from them)."""
    n, base = results["steps"], results["base"]
    lines = [f"`real_model.py` ({results['recipe']} as shipped, {results['model']}): held-out greedy pass@1 on the "
             f"{base['prompts']} held-out additions, base model **{base['pass@1']:.3f}** ({base['passed']}/{base['prompts']}); "
             f"each seed trained for {2 * n} steps and scored at its step-{n} checkpoint (the recipe as shipped) and at the end. "
             f"Machine: {results['machine']}. {results.get('when', '')}".rstrip(), "",
             f"| seed | pass@1 at step {n} | rise | pass@1 at step {2 * n} | rise | truncated, last 5 steps | s/step |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for run in results["seeds"]:
        cut = window_mean(run.get("truncated", []), last=True)  # the lab's 5-step window
        lines.append(f"| {run['seed']} | {run['after']['pass@1']:.3f} | {run['rise'] * 100:+.1f} | {run['after_2x']['pass@1']:.3f} "
                     f"| {run['rise_2x'] * 100:+.1f} | {'-' if cut is None else f'{cut:.2f}'} | {run['seconds_per_step']:.1f} |")
    rises = [min(r["rise"], r["rise_2x"]) for r in results["seeds"]]
    held = sum(1 for r in rises if r >= TARGET_RISE)
    lines += ["", f"Rise in points (pass@1 x 100). The bar, +{TARGET_RISE * 100:.0f} points at both step {n} and step {2 * n}: "
              f"**{held} of {len(rises)} seeds** (smallest rise per seed: " + ", ".join(f"{r * 100:+.1f}" for r in rises) + "). "
              f"Truncated = the share of a step's completions that reached the {results['cap']}-token cap (TRL's "
              "`completions/clipped_ratio`). Per-step curves: `results/real_model.png`; every figure and how it was "
              "measured: `results/real_model.json`."]
    return "\n".join(lines)


def check_readme(readme: Path = README) -> None:
    """The section's markers are in `readme` once each (checked before any work, and again when writing)."""
    page = files.read_text(readme)
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise files.problem(readme, f"must hold the markers {BEGIN!r} and {END!r} once each; the section was not written")


def write_readme_section(text: str, readme: Path = README) -> None:
    """Put `text` between the section's markers in bench/README.md, a page people write: the rest stays as it is."""
    check_readme(readme)
    files.replace_section(readme, BEGIN, END, text)


def pass_reward_mean(logged: dict, figure: str = "mean") -> float:
    """A step's mean (or std) of the reward that decides a pass (grpokit.run.evaluate's rule), else of its total reward."""
    from grpokit.run.evaluate import PASS_REWARDS

    return next((logged[f"rewards/{n}/{figure}"] for n in PASS_REWARDS if f"rewards/{n}/{figure}" in logged),
                logged["reward" if figure == "mean" else "reward_std"])


def eval_run(run_dir: Path | None, out: Path, recipe_path: Path = RECIPE, home: Path | None = None) -> dict:
    """Held-out figures of a run, or (`run_dir` None) of the model its runs start from: the recipe's model, or for a
    warm-start recipe the warm start the run folder `home` holds, scored as `launch.py --eval HOME/warm_start` scores it
    (GRPO's rise is counted from it)."""
    from grpokit.run import evaluate
    from grpokit.warm_start import section as warmstart

    recipe = load_recipe([], recipe_path)
    if run_dir is None and recipe.warm_start and home is not None:
        run_dir = warmstart.made(home)
    if out.is_file():  # scored already (e.g. by `launch.py --eval` run in parallel): greedy, so the same figures
        saved = files.read_json(out, dict)
        warm = _warm_start(recipe, run_dir)
        if (saved.get("model") == recipe.model["name_or_path"] and saved.get("heldout") == evaluate._heldout_name(recipe.dataset)
                and saved.get("run_dir") == (str(run_dir) if run_dir else None) and saved.get("warm_start") == warm):
            print(f"reusing {out}: " + evaluate.summary(saved), flush=True)
            return saved
    recipe = load_recipe([f"trainer.output_dir={run_dir or home or out.parent / 'base'}"], recipe_path)
    result = evaluate.evaluate(recipe, str(run_dir) if run_dir else None, out=str(out))
    print(evaluate.summary(result), flush=True)
    return result


def _warm_start(recipe, run_dir: Path | None) -> str | None:
    """The warm start a run's adapter goes on (grpokit.warm_start.section), as `evaluate` records it; None for a recipe without
    one, for the recipe's model and for the warm start itself."""
    from grpokit.warm_start import section as warmstart

    found = warmstart.of_run(run_dir) if recipe.warm_start and run_dir else None
    return str(found) if found else None


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [2, 1]})
    for run in results["seeds"]:
        steps, rewards = range(1, len(run["rewards"]) + 1), run["rewards"]
        line = ax1.plot(steps, rewards, marker=".", linestyle="none", alpha=0.35)[0]
        # a step's few completions make each point noisy (a binary reward's std error is up to 0.5 / sqrt(n)): a 5-step mean
        smooth = [sum(rewards[max(0, i - 4) : i + 1]) / len(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
        ax1.plot(steps, smooth, color=line.get_color(), label=f"seed {run['seed']} (5-step mean)")
    ax1.set_xlabel("step")
    ax1.set_ylabel(f"mean {results.get('pass_reward', 'accuracy')} of the step's {results['completions_per_step']} completions")
    # the recipe's sampling temperature (results written before it was recorded: the arithmetic recipes' 1.0)
    ax1.set_title(f"training reward (sampled, temperature {results.get('temperature', 1.0):g})")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend()
    base = results["base"]["pass@1"]
    labels = [f"seed {r['seed']}" for r in results["seeds"]]
    x = range(len(labels))
    ax2.bar([i - 0.27 for i in x], [base] * len(labels), width=0.27, label="base")
    ax2.bar(list(x), [r["after"]["pass@1"] for r in results["seeds"]], width=0.27, label=f"{results['steps']} steps (shipped)")
    if all(r["after_2x"] for r in results["seeds"]):  # not with --once: N steps only
        ax2.bar([i + 0.27 for i in x], [r["after_2x"]["pass@1"] for r in results["seeds"]], width=0.27,
                label=f"{2 * results['steps']} steps")
    ax2.axhline(base + TARGET_RISE, color="grey", linestyle=":", label=f"base + {TARGET_RISE:.2f}")
    ax2.set_xticks(list(x), labels)
    ax2.set_ylim(0, 1)
    ax2.set_title(f"held-out greedy pass@1 ({results['base']['prompts']} prompts)")
    ax2.legend()
    fig.suptitle(f"{results['model']}: {results['recipe']}")
    fig.tight_layout()
    try:
        files.save_figure(fig, path, key="--out", dpi=110)
    finally:
        plt.close(fig)


def header(recipe, recipe_path: Path, steps: int, how: str) -> dict:
    """What every seed of these results shares: the model, its dtype on this CPU, the recipe and how it was measured."""
    import torch

    from grpokit.config.trainer_args import resolved_dtype
    from grpokit.cpu import cpu_computes_bf16

    knobs = recipe.trainer
    return {
        "model": "builtin:smollm2-135m-instruct (SmolLM2-135M-Instruct, Q4_1 GGUF dequantized)",
        "dtype": resolved_dtype(recipe.model, lora=recipe.lora is not None) + " (the frozen base; the LoRA adapter float32)",
        "threads": f"torch {torch.get_num_threads()} intra-op thread(s), OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}",
        "recipe": str(recipe_path.relative_to(ROOT)) if recipe_path.is_relative_to(ROOT) else str(recipe_path),
        "steps": steps,
        "completions_per_step": knobs["per_device_train_batch_size"] * knobs.get("gradient_accumulation_steps", 1),
        "cap": knobs["max_completion_length"],
        "temperature": knobs.get("temperature", 1.0),  # TRL's default where the recipe sets none
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible"
                   + (", bf16 instructions" if cpu_computes_bf16() else ", no bf16 instructions")
                   + f", torch {torch.__version__}, cuda={torch.cuda.is_available()}",  # the training processes' threads: --threads, said in `when`
        "measured": ("held-out greedy pass@1 by grpokit.run.evaluate (a pass: the recipe's accuracy reward > 0, or "
                     "task_score at full credit 1.0) on the recipe's held-out set, before training, at the checkpoint of step N (the recipe as shipped) and at "
                     "the end of the 2N-step run (or its latest checkpoint when stopped early: see steps / finished); "
                     "rewards per step from trainer_state.json (mean over the step's completions); seconds per step = "
                     "train_runtime (or the sum of step_time) / steps"),
        "when": f"Measured {time.strftime('%Y-%m-%d')}" + (f"; {how}" if how else "") + ".",
        "seeds": [],
    }


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default=str(RECIPE), help="the recipe the seeds train (default: the arithmetic recipe)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="N: override trainer.max_steps (default: the recipe's)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--train-only", action="store_true", help="train the seeds, score nothing (one process per seed)")
    parser.add_argument("--report-only", action="store_true",
                        help="score what the seeds' runs hold (checkpoint N, and the end or latest checkpoint) and write the results")
    parser.add_argument("--once", action="store_true", help="train each seed N steps only and score it there (no 2N run)")
    parser.add_argument("--runs", help="where the seeds' runs go (default real_model_runs/ beside the results)")
    parser.add_argument("--out", help="results file (default runs/bench/real_model.json; labs/outputs.py)")
    add_commit_flag(parser)
    parser.add_argument("--how", default="", help="how the seeds were trained, for the results (e.g. '2 parallel processes, 1 thread each')")
    parser.add_argument("--keep", action="store_true",
                        help="keep the seeds --out already holds that --seeds does not score (measured earlier on the same "
                             "recipe, steps and held-out set, base figures equal; their runs may be gone)")
    opts = parser.parse_args(argv)
    out, recipe_path = out_path(opts, "real_model.json"), Path(opts.recipe).resolve()
    quoted = out.resolve() == QUOTED.resolve()
    if (opts.once or recipe_path != RECIPE) and quoted:
        raise RecipeError([Problem("--once", "scores N steps only, and bench/README.md quotes N and 2N from "
                                   "results/real_model.json (the arithmetic recipe, N and 2N): give --out FILE for these figures")])
    if not opts.train_only:  # before any training or scoring: the results files are new or grpokit's
        check_outputs([out, out.with_suffix(".png")])
        if quoted:
            check_readme()
    import torch

    if opts.threads:
        torch.set_num_threads(opts.threads)
    recipe = load_recipe([], recipe_path)
    steps = shipped_steps(recipe.trainer, opts.steps, recipe_path)
    runs = Path(opts.runs or results_dir(opts) / "real_model_runs").resolve()  # scored paths are named relative to the repository
    runs.mkdir(parents=True, exist_ok=True)
    if not opts.report_only:
        for seed in opts.seeds:
            train_seed(seed, steps, runs / f"seed-{seed}", once=opts.once, recipe=recipe_path)
    if opts.train_only:
        return 0
    results = header(recipe, recipe_path, steps, opts.how)
    # greedy: the same for every seed; a warm-start recipe's "before" is the warm start (the first seed's run holds one;
    # every seed's is made alike, from the same seed and examples: see each seed's warm_start record)
    home = runs / f"seed-{min(opts.seeds)}" if recipe.warm_start else None
    base = eval_run(None, runs / "base-eval.json", recipe_path, home)
    results["base"] = {"pass@1": base["greedy"]["pass@1"], "passed": base["greedy"]["passed"], "prompts": base["prompts"],
                       **({"tools": base["tools"]} if base.get("tools") else {})}
    results["heldout"], results["pass_reward"] = base["heldout"], base["pass_reward"]
    if opts.keep:
        results["seeds"] = kept_seeds(files.read_json(out, dict), results, opts.seeds) if out.is_file() else []
    for seed in opts.seeds:
        run_dir = runs / f"seed-{seed}"
        end, state = trained_state(run_dir)
        shipped = score(end if opts.once else run_dir / f"checkpoint-{steps}", results["base"]["pass@1"], recipe_path)
        doubled = None if opts.once else score(end, results["base"]["pass@1"], recipe_path)
        made = run_dir / "warm_start" / "warm_start.json"  # grpokit.warm_start.section's record of the run's warm start
        warm = {"warm_start": files.read_json(made, dict)} if made.is_file() else {}
        results["seeds"].append({"seed": seed, **timing(state), **warm, "after": shipped, "after_2x": doubled,
                                 "rise": shipped["rise"], "rise_2x": doubled and doubled["rise"],
                                 "reached_target": min(shipped["rise"], (doubled or shipped)["rise"]) >= TARGET_RISE})
        results["seeds"].sort(key=lambda r: r["seed"])
        # after each seed: a killed bench keeps what it measured
        files.write_text(out, json.dumps(results, indent=2) + "\n", key="--out")
        plot(results, out.with_suffix(".png"))
        print(f"seed {seed}: pass@1 {results['base']['pass@1']:.3f} -> {shipped['pass@1']:.3f} ({shipped['rise']:+.3f}) at "
              f"step {steps}" + (f", {doubled['pass@1']:.3f} ({doubled['rise']:+.3f}) at step {doubled['step']}" if doubled
                                 else ""), flush=True)
    if quoted:
        write_readme_section(markdown(results))
    rises = [min(r["rise"], r["rise_2x"] if r["rise_2x"] is not None else r["rise"]) for r in results["seeds"]]
    print(f"held-out pass@1 {results['base']['pass@1']:.3f}; smallest rise per seed (N or 2N steps) "
          + ", ".join(f"{r:+.3f}" for r in rises) + f"; wrote {out} and {out.with_suffix('.png')}")
    return 0


SAME = ("recipe", "dtype", "steps", "completions_per_step", "cap", "heldout", "pass_reward", "base")


def kept_seeds(previous: dict, results: dict, scoring: list[int]) -> list[dict]:
    """The seeds an earlier call measured and this one does not score, when both measured the same thing: the recipe,
    the base model's dtype (a CPU without bf16 instructions trains in float32), its steps, the held-out set, the pass
    rule and the base model's figures (greedy, so equal when nothing changed). Anything else would mix two
    measurements under one heading: refused, naming what differs."""
    differ = [k for k in SAME if previous.get(k) != results.get(k)]
    if differ:
        raise RecipeError([Problem("--keep", f"the seeds in the --out file were measured otherwise ({', '.join(differ)}: "
                                   + "; ".join(f"{k} {previous.get(k)!r} there, {results.get(k)!r} now" for k in differ)
                                   + ")", allowed="score every seed again, or give another --out")])
    return [r for r in previous.get("seeds", []) if r["seed"] not in scoring]


def score(adapter: Path, base: float, recipe_path: Path = RECIPE) -> dict:
    """Held-out greedy pass@1 of one adapter (a checkpoint or a finished run), with its step and rise over the base."""
    if not (adapter / "trainer_state.json").is_file():
        raise files.problem(adapter, "holds no trainer state to score", "--steps", "was the run trained with this N?")
    after = eval_run(adapter, adapter / "eval.json", recipe_path)
    step = read_state(adapter / "trainer_state.json")["global_step"]
    return {"scored": str(adapter.relative_to(ROOT)) if adapter.is_relative_to(ROOT) else str(adapter), "step": step, "pass@1": after["greedy"]["pass@1"],
            "passed": after["greedy"]["passed"], "rise": round(after["greedy"]["pass@1"] - base, 4),
            "examples": after["examples"][:2], **({"tools": after["tools"]} if after.get("tools") else {})}


if __name__ == "__main__":
    sys.exit(main())
