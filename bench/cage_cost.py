"""What the cage's design costs: the same scoring and tool calls on two checkouts, measured in turn on one machine.

    .venv/bin/python bench/cage_cost.py --before /tmp/before          # this checkout against another (e.g. a worktree
                                                                      # of an earlier commit), 5 rounds each, in turn
    .venv/bin/python bench/cage_cost.py --before /tmp/before --rounds 3

Each round runs one fresh process per checkout (this one, then --before's, then this one, ...), so a machine that
slows down mid-bench slows both alike. A process measures, warm (its cage started and every problem built before the
timing):
- scored completions a second: `task_score` on chain_sum (a plain compare) and countdown (its scorer evaluates the
  answer with sympy, in the cage), 64 completions a call (16 problems x 4 answers), and `accuracy` on LaTeX answers
  that go to math-verify (64 a call, all distinct); the median of 5 calls;
- the Python tool: a rollout's first call (its interpreter forked warm, then the call) and a kept interpreter's later
  call; the median of 12.
Writes bench/results/cage_cost.json (--out) and prints a table: each figure's median over the rounds, and after/before.
Nothing here trains; it needs reasoning-gym and math-verify, and no network.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from offline import ROOT  # noqa: E402  (before grpokit: sets the environment)

from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402


# One round's measurements, run in a fresh process with a checkout's root first on sys.path (argv[1]). Only what both
# designs share is used: the rewards' and the tool's public faces.
MEASURE = r'''
import json, os, statistics, sys, time
sys.path.insert(0, sys.argv[1])
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import logging
logging.getLogger("math_verify").setLevel(logging.ERROR)
import rewards
from grpokit.prompts import tasks
from grpokit.tools.environments import PythonTool
from rewards.math import Accuracy

out = {}
reward = rewards.build("task_score")
for name, config in (("chain_sum", {}), ("countdown", {"min_numbers": 3, "max_numbers": 3})):
    source, _ = tasks.check_source({"tasks": [{"name": name, "config": config}], "size": 16, "seed": 1})
    rows = tasks.generate(source).rows
    completions = [f"<think>so</think><answer>{r['answer'] if k % 2 else k}</answer>" for k in range(4) for r in rows]
    items = [r["task_item"] for _ in range(4) for r in rows]
    reward(completions=completions, task_item=items)  # workers up, problems built
    took = []
    for _ in range(5):
        start = time.perf_counter()
        reward(completions=completions, task_item=items)
        took.append(time.perf_counter() - start)
    out[name] = len(completions) / statistics.median(took)
accuracy = Accuracy()
def latex(round_):  # radicals: no plain number, so every one goes to math-verify; distinct in every round
    return ([rf"Simplifying, the answer is $\boxed{{\sqrt{{{(k + 2) ** 2 * (round_ + 2)}}}}}$." for k in range(64)],
            [rf"${k + 2}\sqrt{{{round_ + 2}}}$" for k in range(64)])
completions, golds = latex(99)
accuracy(completions=completions, answer=golds)  # workers up
took = []
for round_ in range(5):
    completions, golds = latex(round_)
    start = time.perf_counter()
    accuracy(completions=completions, answer=golds)
    took.append(time.perf_counter() - start)
out["math_verify_latex"] = 64 / statistics.median(took)
first = PythonTool()
first.reset()
first.python("1")  # the cage up
fresh, kept = [], []
for _ in range(12):
    t = PythonTool()
    t.reset()
    start = time.perf_counter()
    t.python("x = 271 * 43\nprint(x)")
    fresh.append(time.perf_counter() - start)
    start = time.perf_counter()
    t.python("print(x * 18)")
    kept.append(time.perf_counter() - start)
    t.reset()
out["tool_first_call_ms"] = 1000 * statistics.median(fresh)
out["tool_later_call_ms"] = 1000 * statistics.median(kept)
print(json.dumps(out))
'''

FIGURES = [  # (key, what, higher is better)
    ("chain_sum", "chain_sum: scored completions/s", True),
    ("countdown", "countdown: scored completions/s", True),
    ("math_verify_latex", "math-verify LaTeX: scored completions/s", True),
    ("tool_first_call_ms", "Python tool: a rollout's first call, ms", False),
    ("tool_later_call_ms", "Python tool: a later call, ms", False),
]


def measure(root: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(root)], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"cage_cost: measuring {root} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="the other checkout's root (e.g. a git worktree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="results file (default runs/bench/cage_cost.json; labs/outputs.py)")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    out, before = out_path(opts, "cage_cost.json"), Path(opts.before).resolve()
    check_outputs([out])
    load = os.getloadavg()[0]
    runs: dict[str, list] = {"after": [], "before": []}
    for r in range(opts.rounds):
        for side, root in (("after", ROOT), ("before", before)):
            runs[side].append(measure(root))
            print(f"round {r + 1}/{opts.rounds} {side}: {json.dumps({k: round(v, 2) for k, v in runs[side][-1].items()})}",
                  flush=True)
    medians = {side: {key: statistics.median(run[key] for run in got) for key, _, _ in FIGURES}
               for side, got in runs.items()}
    commit = lambda root: subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],  # noqa: E731
                                         capture_output=True, text=True).stdout.strip()
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, load average {load:.1f} at the start",
        "when": time.strftime("%Y-%m-%d"),
        "after": {"checkout": commit(ROOT), "rounds": runs["after"], "median": medians["after"]},
        "before": {"checkout": commit(before), "rounds": runs["before"], "median": medians["before"]},
        "after_over_before": {key: round(medians["after"][key] / medians["before"][key], 3) for key, _, _ in FIGURES},
    }
    files.write_text(out, json.dumps(result, indent=2) + "\n", key="--out")
    print(f"\n{'':42s} {'before':>9s} {'after':>9s}  after/before  (median of {opts.rounds} rounds, in turn)")
    for key, what, _ in FIGURES:
        print(f"{what:42s} {medians['before'][key]:9.2f} {medians['after'][key]:9.2f}  "
              f"{result['after_over_before'][key]:.3f}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
