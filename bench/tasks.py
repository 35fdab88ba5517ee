"""Real tasks offline: held-out greedy pass@1 of SmolLM2-135M-Instruct before and after each reasoning-gym recipe.

    nice -n 10 .venv/bin/python bench/tasks.py --commit-results  # train and score every task, 3 seeds each
    .venv/bin/python bench/tasks.py --report-only --commit-results   # the page and the figure from the committed results

Each recipe in TASKS (recipes/smollm2-135m/<task>.yaml, a reasoning-gym task scored by its own score_answer) goes
through bench/real_model.py `--once` as shipped: its seeds trained for the recipe's max_steps, then the base model
and every seed scored on the recipe's held-out problems (another range of seeds: no held-out question is a
training question). Writes tasks/<task>.{json,png} (real_model.py's) and tasks.png (every task's pass@1, base vs
each seed) in runs/bench/, or with `--commit-results` in bench/results/ with bench/README.md's section on the tasks
(labs/outputs.py's rule). Runs go to tasks/runs/ beside them (not committed). A task whose rise is under TARGET_RISE on some seed is reported as such: that is a result too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)
from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

TASKS = ("chain_sum", "basic_arithmetic", "leg_counting")
README = ROOT / "bench" / "README.md"
BEGIN, END = "<!-- tasks.py writes this section from results/tasks/*.json -->", "<!-- end of tasks.py's section -->"
TARGET_RISE = 0.10  # a rise read as learning: 10 points of held-out pass@1 on every seed (the noise of ~70 prompts is ~5)


def recipe(task: str) -> Path:
    return ROOT / "recipes" / "smollm2-135m" / f"{task}.yaml"


def run_task(task: str, seeds: list[int], how: str, out: Path) -> None:
    """real_model.py --once on one task recipe: train the seeds, score base and seeds, write its json and png in
    `out`."""
    import real_model  # a bench beside this one

    code = real_model.main(["--recipe", str(recipe(task)), "--seeds", *map(str, seeds), "--once",
                            "--runs", str(out / "runs" / task), "--out", str(out / f"{task}.json"), "--how", how])
    if code:
        raise SystemExit(code)


WANTED_SEEDS = 3


def verdict(result: dict) -> str:
    rises = [s["rise"] for s in result["seeds"]]
    every, any_ = ("every seed", "any seed") if len(rises) > 1 else ("it", "it")
    if all(r >= TARGET_RISE for r in rises):
        low, high = f"{min(rises) * 100:+.0f}", f"{max(rises) * 100:+.0f}"
        span = low if low == high else f"{low} to {high}"  # "+14", not "+14 to +14", when every seed rose alike
        reading = f"learns: up {span} points on {every}"
    elif all(r <= 0 for r in rises):
        reading = f"no rise on {any_}"
    elif all(r < TARGET_RISE for r in rises):
        reading = f"under +{TARGET_RISE * 100:.0f} points on {every}"
    else:
        reading = f"mixed: {sum(r >= TARGET_RISE for r in rises)} of {len(rises)} seeds up {TARGET_RISE * 100:.0f}+ points"
    if len(rises) < WANTED_SEEDS:  # fewer seeds than wanted: a reading, not a verdict
        return f"{len(rises)} of {WANTED_SEEDS} seeds so far; {reading}"
    return reading


def markdown(results: dict[str, dict]) -> str:
    first = next(iter(results.values()))
    lines = [f"`tasks.py`: SmolLM2-135M-Instruct on {len(results)} reasoning-gym task(s), each recipe as shipped "
             f"({first['steps']} steps of {first['completions_per_step']} completions), scored by held-out greedy pass@1 "
             "(a pass: the task's own score_answer at full credit) on problems from another range of seeds than "
             "training's. Where and how each task was measured is under the table.", "",
             "| task | held-out problems | base pass@1 | after, per seed | rise (points) | s/step | reading |",
             "|---|---:|---:|---|---|---:|---|"]
    for task, r in results.items():
        after = ", ".join(f"{s['after']['pass@1']:.3f}" for s in r["seeds"])
        rises = ", ".join(f"{s['rise'] * 100:+.1f}" for s in r["seeds"])
        pace = sum(s["seconds_per_step"] for s in r["seeds"]) / len(r["seeds"])
        lines.append(f"| [{task}](../recipes/smollm2-135m/{task}.yaml) | {r['base']['prompts']} | {r['base']['pass@1']:.3f} "
                     f"| {after} | {rises} | {pace:.0f} | {verdict(r)} |")
    lines.append("")
    for task, r in results.items():  # machines differ between sessions (a CPU without bf16 trains in float32)
        lines.append(f"- {task}: seed{'s' * (len(r['seeds']) > 1)} {', '.join(str(s['seed']) for s in r['seeds'])}; base in {r['dtype']}; "
                     f"{r['machine']}. {r.get('when', '')}".rstrip())
    lines += ["", f"A rise counts as learning at +{TARGET_RISE * 100:.0f} points on every seed, of {WANTED_SEEDS} "
              "(with ~70-100 held-out problems one prompt is 1-1.5 points). s/step is the "
              "trainer's own runtime over its steps, under the load described for its task. Per task: `results/tasks/<task>.json` "
              "(every figure, how it was measured) and `results/tasks/<task>.png` (per-step reward of each seed); all "
              "tasks side by side: `results/tasks.png`."]
    missing = [t for t in TASKS if t not in results]
    if missing:
        lines += ["", f"Not measured yet: {', '.join(missing)} (their recipes train; `bench/tasks.py --tasks "
                  f"{' '.join(missing)}` measures them)."]
    return "\n".join(lines)


def plot(results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / (1 + max(len(r["seeds"]) for r in results.values()))
    for t, (task, r) in enumerate(results.items()):
        ax.bar(t, r["base"]["pass@1"], width=width, color="grey", label="base" if t == 0 else None)
        for i, s in enumerate(r["seeds"]):
            ax.bar(t + (i + 1) * width, s["after"]["pass@1"], width=width, color=f"C{i}",
                   label=f"seed {s['seed']}, {r['steps']} steps" if t == 0 else None)
    ax.set_xticks([t + width * len(r["seeds"]) / 2 for t, r in enumerate(results.values())], list(results))
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out greedy pass@1")
    ax.set_title("SmolLM2-135M-Instruct on reasoning-gym tasks, offline: base vs trained")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        files.save_figure(fig, path, key="--report-only", dpi=110)
    finally:
        plt.close(fig)


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--report-only", action="store_true", help="write the page and figure from results/tasks/*.json")
    parser.add_argument("--how", default="", help="how the seeds were trained, for the results")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    home = results_dir(opts)
    out = home / "tasks"
    check_outputs([home / "tasks.png"] + [out / f"{t}.{ext}" for t in opts.tasks for ext in ("json", "png")])
    if not opts.report_only:
        for task in opts.tasks:
            run_task(task, opts.seeds, opts.how, out)
    results = {t: files.read_json(out / f"{t}.json", dict) for t in opts.tasks if (out / f"{t}.json").is_file()}
    if not results:
        raise files.problem(out, "holds no task results", "--report-only", "train and score the tasks first")
    plot(results, home / "tasks.png")
    if opts.commit_results:  # the page quotes the committed results only
        files.replace_section(README, BEGIN, END, markdown(results))
    for task, r in results.items():
        print(f"{task}: pass@1 {r['base']['pass@1']:.3f} -> " + ", ".join(f"{s['after']['pass@1']:.3f}" for s in r["seeds"])
              + f" ({verdict(r)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
