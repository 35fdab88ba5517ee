"""What the test suite takes: `make test`'s own command, timed whole, with the slowest tests named.

    .venv/bin/python bench/suite_time.py --commit-results   # run the suite once, write bench/results/suite_time.json
    .venv/bin/python bench/suite_time.py                    # the same into runs/bench/suite_time.json
    .venv/bin/python bench/suite_time.py --report --commit-results   # print the committed measurement

Runs `python -m pytest -q -n 2` (the command `make test` runs after its set-up) with `--durations=30`, and keeps the
wall time, the pass line, the machine (cores, CPU), the load average before and after, and the CPU the rest of the
machine used meanwhile (/proc/stat's busy time less the suite's own, its processes included): a figure is called
idle only where that was under 5 % of the machine. tests/conftest.py prints this figure when a suite starts, beside
the machine's load at that moment, so a newcomer can tell a slow run from a busy machine; README.md quotes it
(tests/test_readme.py holds the two together).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import resource
import subprocess
import sys
import time

from offline import ROOT  # noqa: E402  (before grpokit: sets the environment)

from grpokit import files  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402

COMMAND = [sys.executable, "-m", "pytest", "-q", "-n", "2"]
IDLE_SHARE = 0.05  # idle: other work took under 5 % of the machine's CPU while the suite ran


def minutes(seconds: float) -> str:
    """'6 min 26 s'."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: every state but idle and iowait)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def measure() -> dict:
    load_before = os.getloadavg()
    busy_before, start = busy_cpu_s(), time.monotonic()
    done = subprocess.run([*COMMAND, "--durations=30"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - start
    own = resource.getrusage(resource.RUSAGE_CHILDREN)  # the suite and every process it waited for
    others = max(0.0, busy_cpu_s() - busy_before - own.ru_utime - own.ru_stime)
    share = others / (wall * (os.cpu_count() or 1))
    out = done.stdout.splitlines()
    summary = next((line.strip("= ") for line in reversed(out) if re.search(r"\d+ (passed|failed)", line)), "")
    slowest = [line.strip() for line in out if re.match(r"\s*\d+\.\d+s (call|setup|teardown)\s", line)]
    failed = sorted({m.group(1) for line in out if (m := re.match(r"(?:FAILED|ERROR) (\S+)", line))})
    return {
        "command": "python -m pytest -q -n 2", "exit_code": done.returncode, "wall_s": round(wall, 1),
        "summary": summary, "failed": failed, "slowest": slowest,
        "cores": os.cpu_count(), "cpu": cpu_name(), "machine": platform.machine(),
        "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
        "suite_cpu_s": round(own.ru_utime + own.ru_stime, 1), "others_cpu_share": round(share, 3),
        "idle": share < IDLE_SHARE, "date": datetime.date.today().isoformat(),
    }


def describe(result: dict) -> str:
    state = ("idle" if result["idle"] else "not idle") + f" (other work: {result['others_cpu_share']:.0%} of the CPU)"
    return (f"{minutes(result['wall_s'])} ({result['summary']}) on {result['cores']} cores, {state}, "
            f"{result['date']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--report", action="store_true", help="print the last measurement and stop")
    parser.add_argument("--out", help="results file (default runs/bench/suite_time.json; labs/outputs.py)")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    out = out_path(opts, "suite_time.json")
    if opts.report:
        print(describe(files.read_json(out)))
        return 0
    print(f"running {' '.join(COMMAND[1:])} (load average {os.getloadavg()[0]:.1f} now) ...", flush=True)
    result = measure()
    files.write_text(out, json.dumps(result, indent=1) + "\n")
    print(describe(result))
    print("slowest:", *result["slowest"][:15], sep="\n  ")
    return result["exit_code"]


if __name__ == "__main__":
    sys.exit(main())
