"""Several tool calls a rollout, learned by GRPO from a warm start: recipes/smollm2-135m/multi_call.yaml as shipped.

    nice -n 10 .venv/bin/python bench/multi_call.py --seeds 0 1 2 --threads 1 --commit-results   # 3 seeds, scored
    nice -n 10 .venv/bin/python bench/multi_call.py --sample RUN_DIR   # a run's warm start's sampled calls (runs/bench/)
    .venv/bin/python bench/multi_call.py --report-only --commit-results   # the page from the committed results

SmolLM2-135M-Instruct never makes a second tool call when sampled (results/sampled_calls.json: 0 in 192 rollouts),
so GRPO on problems that want two gets groups that all score alike and learns nothing. The recipe's `warm_start`
section (grpokit/warm_start/) makes each run start where ReTool and DeepSeek-R1 start: a short supervised pass over
worked two-call exchanges on problems apart from training's and the held-out set's, merged, then GRPO from it, in one
`launch.py` run. This bench only runs and reads that: the seeds through `bench/tool_use.py --recipe multi_call` (the
shipped recipe as is, trained and scored by `bench/real_model.py --once`; the "before" row is the first seed's warm
start, every seed's being made alike), and, with `--sample`, a warm start's calls sampled as training samples them on
tuning prompts (seeds TUNE_SEED.., neither training's nor held-out) -- how the recipe's warm-start settings were chosen.
Writes multi_call.json (tool_use.py's) and multi_call_warm_start.json (each warm start tried: how it was made and its
sampled calls) in runs/bench/, or with `--commit-results` in bench/results/ with bench/README.md's sections
(labs/outputs.py's rule).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

import yaml

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)

from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "multi_call.yaml"
WARM_RESULTS = "multi_call_warm_start.json"  # in labs/outputs.py's results folder
README = ROOT / "bench" / "README.md"
WARM_BEGIN = "<!-- multi_call.py writes this table from results/multi_call_warm_start.json -->"
WARM_END = "<!-- end of multi_call.py's table -->"
TUNE_SEED = 200_000  # the problems a warm start's sampled calls are counted on: neither training's nor held-out


def record(name: str, model: str, made: dict | None, opts) -> None:
    """Sample `model`'s calls on the recipe's tuning prompts and keep them, with how it was made, under `name` (in the
    committed results and the page with `--commit-results`, else in runs/bench/)."""
    import sampled_calls

    row = sampled_calls.sample(RECIPE, [f"model.name_or_path={model}", f"dataset.reasoning_gym.eval_seed={TUNE_SEED}"],
                               opts.prompts, opts.samples, opts.threads)
    print(f"{name}, sampled: {sampled_calls.described(row)}", flush=True)
    warm_results = results_dir(opts) / WARM_RESULTS
    tried = files.try_json(warm_results, dict)[0] or {}
    tried.setdefault("warm_starts", {})
    tried["machine"], tried["when"] = f"{platform.machine()}, {os.cpu_count()} CPUs", time.strftime("%Y-%m-%d")
    tried["warm_starts"][name] = {
        "made": made or tried["warm_starts"].get(name, {}).get("made"),
        "sampled": {"measured": f"launch.py --eval --eval-samples {opts.samples} on {opts.prompts} tuning prompts "
                                f"(seeds {TUNE_SEED}.., neither training's nor held-out), model.name_or_path = {model}",
                    "when": time.strftime("%Y-%m-%d"), **row}}
    files.write_text(warm_results, json.dumps(tried, indent=2) + "\n")
    if opts.commit_results:  # the page quotes the committed results only
        files.replace_section(README, WARM_BEGIN, WARM_END, warm_markdown(tried))


def warm_markdown(tried: dict) -> str:
    """The warm starts tried (and the base), each with its sampled calls on the tuning prompts."""
    rows = ["| model | worked exchanges seen: steps x batch, learning rate | last loss | sampled rollouts with 0 / 1 / 2 / "
            "3+ calls | right (mean@K) | pass@K | greedy pass@1 | measured |", "|---|---|---:|---|---:|---:|---:|---|"]
    sampled = {name: entry for name, entry in tried["warm_starts"].items() if entry.get("sampled")}

    def order(name: str) -> tuple[bool, int]:  # the recipe's own model first, then the warm starts by their steps
        steps = re.search(r"-steps(\d+)-", name)
        return name != "base", int(steps.group(1)) if steps else 0

    for name, entry in sorted(sampled.items(), key=lambda kv: order(kv[0])):
        made, got = entry.get("made"), entry["sampled"]
        k = next(key.split("@")[1] for key in got if key.startswith("pass@"))
        how = (f"{made['steps']} x {made.get('batch', made.get('batch_size'))}, {made['learning_rate']:g}" if made else
               "- (the recipe's own model)" if name == "base" else "- (made before its record was kept)")
        loss = f"{made['loss'][-1]:.3f}" if made else "-"
        dist = " / ".join(f"{got['calls_distribution'][c]:.2f}" for c in ("0", "1", "2", "3+"))
        rows.append(f"| {name} | {how} | {loss} | {dist} | {got['right']:.3f} | {got[f'pass@{k}']:.3f} | "
                    f"{got['greedy']['pass@1']:.3f} | {got.get('when', tried['when'])} |")
    first = next(iter(sampled.values()))["sampled"]
    k = int(next(key.split("@")[1] for key in first if key.startswith("pass@")))
    return "\n".join([f"Each model's calls, sampled as training samples them: `launch.py --eval --eval-samples {k}` on "
                       f"{first['completions'] // k} tuning prompts (reasoning-gym seeds {TUNE_SEED}.., neither training's "
                       f"nor held-out), {first['completions']} sampled rollouts a model, and its greedy pass@1 on the "
                       f"same prompts; {tried['machine']}:", "", *rows])


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sample", type=Path, metavar="RUN_DIR", help="sample the calls of the warm start this run made")
    parser.add_argument("--base", action="store_true", help="sample the calls of the recipe's own model (no warm start)")
    parser.add_argument("--prompts", type=int, default=8, help="tuning prompts whose sampled calls are counted")
    parser.add_argument("--samples", type=int, default=8, help="sampled rollouts a prompt")
    parser.add_argument("--seeds", type=int, nargs="*", default=[], help="seeds of the shipped recipe to train and score")
    parser.add_argument("--report-only", action="store_true", help="the page from the results files")
    parser.add_argument("--threads", type=int, default=None)
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    warm_results = results_dir(opts) / WARM_RESULTS
    if opts.report_only:
        text = warm_markdown(files.read_json(warm_results, dict))
        if opts.commit_results:
            files.replace_section(README, WARM_BEGIN, WARM_END, text)
        print(text)
    if opts.sample or opts.base:
        check_outputs([warm_results])
    if opts.base:
        record("base", yaml.safe_load(RECIPE.read_text())["model"]["name_or_path"], None, opts)
    if opts.sample:
        from grpokit.warm_start import section as warmstart

        warm = warmstart.made(opts.sample)
        if warm is None:
            raise SystemExit(f"{opts.sample} holds no warm start ({warmstart.FOLDER}/{warmstart.RECORD}): train the recipe first")
        made = files.read_json(warm / warmstart.RECORD, dict)
        name = f"warm_start-n{made['examples']}-steps{made['steps']}-lr{made['learning_rate']:g}-seed{made['seed']} (the recipe's section)"
        record(name, str(warm), made, opts)
    if opts.seeds or opts.report_only:
        import tool_use

        return tool_use.main(["--recipe", "multi_call", *(["--report-only"] if opts.report_only else
                                                           ["--seeds", *map(str, opts.seeds)]),
                              *(["--threads", str(opts.threads)] if opts.threads else []),
                              *(["--commit-results"] if opts.commit_results else []),
                              "--how", "the shipped recipe: its warm_start section, then GRPO, in each seed's run"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
