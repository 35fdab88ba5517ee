"""Does the base model ever make a second tool call? Sampled rollouts of a tool recipe's held-out prompts.

    .venv/bin/python bench/sampled_calls.py --threads 2            # every variant below, 8 prompts x 8 samples each

GRPO can only reinforce what the policy samples: a recipe whose problems want two calls learns nothing from groups in
which no completion makes a second one. This runs `launch.py --eval --eval-samples K` on each
variant: K rollouts of every held-out prompt, sampled as training samples them (TRL's own loop, the recipe's tools,
rewards and few-shot, at the recipe's temperature or the variant's), and reads back the calls per rollout
(0 / 1 / 2 / 3+), how calls ended, pass@K and the share of rollouts scored right (mean@K). Each variant is a shipped recipe with overrides (the
same `section.key=value` a user passes to launch.py), so what ran is on the command line of the results.

Writes results/sampled_calls.json and prints a line per variant. Nothing here is a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: no hub, grpokit from this checkout)

from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

THREE_FACTORS = ("dataset.reasoning_gym.tasks=[{name: products, config: {min_terms: 3, max_terms: 3, min_digits: 2, "
                 "max_digits: 3}}]")
ASK = "Solve the following multiplication: 271 * 43 * 18. Give only the result as your final answer."
# name: (recipe, overrides, temperature): problems that want two calls of a two-argument tool, and the shipped
# Python-tool recipe, whose problems one cell answers
VARIANTS = {
    "calculator, three factors, a worked first call": (
        "recipes/smollm2-135m/calculator.yaml",
        [THREE_FACTORS, "trainer.max_tool_calling_iterations=2", "trainer.max_completion_length=160",
         f'dataset.few_shot=[{{role: user, content: "{ASK}"}}, '
         '{role: assistant, tool_calls: [{name: multiply, arguments: {a: 271, b: 43}}]}]'], 1.0),
    "calculator, three factors, a worked exchange of two calls": (
        "recipes/smollm2-135m/calculator.yaml",
        [THREE_FACTORS, "trainer.max_tool_calling_iterations=2", "trainer.max_completion_length=160",
         f'dataset.few_shot=[{{role: user, content: "{ASK}"}}, '
         '{role: assistant, tool_calls: [{name: multiply, arguments: {a: 271, b: 43}}]}, '
         '{role: tool, name: multiply, content: "11653"}, '
         '{role: assistant, tool_calls: [{name: multiply, arguments: {a: 11653, b: 18}}]}, '
         '{role: tool, name: multiply, content: "209754"}, {role: assistant, content: "209754"}]'], 1.0),
    "python_tool as shipped": ("recipes/smollm2-135m/python_tool.yaml", [], None),
}


def sample(recipe: Path, overrides: list[str], prompts: int, samples: int, threads: int | None = None,
           temperature: float | None = None) -> dict:
    """`launch.py --eval --eval-samples` on `prompts` held-out prompts of the recipe with `overrides`: the calls of the
    sampled rollouts (0 / 1 / 2 / 3+), how they ended, mean@K and pass@K, and the greedy pass@1 and calls beside.
    Raises SystemExit with launch.py's code when it refuses (its message already printed)."""
    from grpokit import cli

    with tempfile.TemporaryDirectory() as scratch:
        eval_out = Path(scratch) / "eval.json"
        started = time.perf_counter()
        code = cli.main(["--recipe", str(recipe), *(["--threads", str(threads)] if threads else []), "--eval",
                         "--eval-samples", str(samples), "--eval-out", str(eval_out),
                         f"dataset.reasoning_gym.eval_size={prompts}", f"trainer.output_dir={scratch}/run", *overrides,
                         *([f"trainer.temperature={temperature}"] if temperature else [])])
        if code:
            raise SystemExit(code)
        got = files.read_json(eval_out, dict)
    sampled = got["sampled"]
    return {"completions": prompts * samples, "seconds": round(time.perf_counter() - started, 1),
            "calls_distribution": sampled["tools"]["calls_distribution"],
            "call_outcomes": sampled["tools"]["call_outcomes"], "right": sampled[f"mean@{samples}"],
            f"pass@{samples}": sampled[f"pass@{samples}"],
            "greedy": {"pass@1": got["greedy"]["pass@1"], "calls_distribution": got["tools"]["calls_distribution"]}}


def described(row: dict) -> str:
    """One line: the sampled calls' distribution and the share scored right."""
    share = row["calls_distribution"]
    return (f"calls per completion 0/1/2/3+ = {share['0']:.2f}/{share['1']:.2f}/{share['2']:.2f}/{share['3+']:.2f}; "
            f"right {row['right']:.3f} ({row['completions']} sampled completions)")


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8, help="held-out prompts per variant")
    parser.add_argument("--samples", type=int, default=8, help="sampled completions per prompt")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=sorted(VARIANTS))
    parser.add_argument("--out", help="results file (default runs/bench/sampled_calls.json; labs/outputs.py)")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    out = out_path(opts, "sampled_calls.json")
    check_outputs([out])
    results = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "when": time.strftime("%Y-%m-%d"),
               "measured": f"launch.py --eval --eval-samples {opts.samples} on {opts.prompts} held-out prompts (seeds "
                           "apart from training's): that many rollouts of each, sampled as training samples them "
                           "(TRL's tool loop), the base model; right = mean@K (rollouts scored right)", "variants": {}}
    for name in opts.variants:
        recipe, overrides, temperature = VARIANTS[name]
        results["variants"][name] = {"recipe": recipe, "overrides": overrides,
                                     "temperature": temperature or "the recipe's",
                                     **sample(ROOT / recipe, overrides, opts.prompts, opts.samples, opts.threads,
                                              temperature)}
        print(f"{name}: {described(results['variants'][name])}", flush=True)
    files.write_text(out, json.dumps(results, indent=2) + "\n", key="--out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
