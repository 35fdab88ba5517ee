"""What the Python tool costs: calls per second on this machine, one at a time and a batch of rollouts at once.

    .venv/bin/python bench/python_tool.py                 # prints the figures, writes results/python_tool_cost.json
    .venv/bin/python bench/python_tool.py --rollouts 32   # a larger batch

Every figure is wall time of `grpokit.tools.environments.PythonTool` calls from this process, as TRL makes them:
- the cage's start: the first call of a process (bootstrap, namespaces, the zygote importing sympy and numpy);
- a rollout's first call: its interpreter forked from the warm zygote, then the call;
- a kept interpreter's later calls (`print(x * 18)` on a name an earlier call defined);
- a batch: `--rollouts` rollouts of two calls each, one call after another in one thread (what TRL 1.16 does: it calls
  a synchronous tool inline, rollout by rollout), and the same rollouts from one thread each (what an async tool
  served by the pool could do), with each rollout's interpreter ended at its next reset.
Repeats: `--repeats` rounds of each, the median reported with min and max. Nothing here trains.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpokit import files  # noqa: E402
from grpokit.tools.environments import PythonTool  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

FIRST, SECOND = "x = 271 * 43\nprint(x)", "print(x * 18)"


def rollout(tool: PythonTool) -> None:
    tool.reset()
    assert tool.python(FIRST) == "11653\n"
    assert tool.python(SECOND) == "209754\n"


def batch(tools: list[PythonTool], threaded: bool) -> float:
    """Seconds for every rollout's two calls, one after another or one thread a rollout."""
    start = time.perf_counter()
    if threaded:
        workers = [threading.Thread(target=rollout, args=(t,)) for t in tools]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    else:
        for t in tools:
            rollout(t)
    return time.perf_counter() - start


def spread(values: list[float]) -> dict:
    return {"median": round(statistics.median(values), 5), "min": round(min(values), 5), "max": round(max(values), 5)}


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts in a batch (a step of the recipe: 8 or 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="results file (default runs/bench/python_tool_cost.json; labs/outputs.py)")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    out = out_path(opts, "python_tool_cost.json")
    check_outputs([out])
    started = time.perf_counter()
    first = PythonTool()
    first.reset()
    first.python("1")
    cage_start = time.perf_counter() - started
    fresh, kept = [], []
    for _ in range(opts.repeats * 4):
        t = PythonTool()
        t.reset()
        s = time.perf_counter()
        t.python(FIRST)
        fresh.append(time.perf_counter() - s)
        s = time.perf_counter()
        t.python(SECOND)
        kept.append(time.perf_counter() - s)
        t.reset()
    tools = [PythonTool() for _ in range(opts.rollouts)]
    one_by_one = [batch(tools, threaded=False) for _ in range(opts.repeats)]
    threaded = [batch(tools, threaded=True) for _ in range(opts.repeats)]
    for t in tools:
        t.reset()
    calls = 2 * opts.rollouts
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs visible, load average {os.getloadavg()[0]:.1f} at the end",
        "when": time.strftime("%Y-%m-%d"),
        "cage_start_s": round(cage_start, 3),
        "rollout_first_call_s": spread(fresh),
        "kept_call_s": spread(kept),
        "batch": {"rollouts": opts.rollouts, "calls": calls,
                  "one_after_another_s": spread(one_by_one), "threads_s": spread(threaded),
                  "calls_per_s_one_after_another": round(calls / statistics.median(one_by_one), 1),
                  "calls_per_s_threads": round(calls / statistics.median(threaded), 1)},
    }
    files.write_text(out, json.dumps(result, indent=2) + "\n", key="--out")
    b = result["batch"]
    print(f"cage start {cage_start:.2f} s; a rollout's first call {result['rollout_first_call_s']['median'] * 1000:.1f} ms "
          f"(its interpreter forked warm), a kept interpreter's call {result['kept_call_s']['median'] * 1000:.2f} ms; "
          f"{opts.rollouts} rollouts x 2 calls: {b['one_after_another_s']['median']:.3f} s one after another "
          f"({b['calls_per_s_one_after_another']} calls/s), {b['threads_s']['median']:.3f} s a thread each "
          f"({b['calls_per_s_threads']} calls/s); {result['machine']}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
