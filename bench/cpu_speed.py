"""Seconds per training step of the real-model recipe on this CPU, for the settings that decide it.

    nice -n 0 .venv/bin/python bench/cpu_speed.py                 # every setting, idle and beside a busy neighbour
    .venv/bin/python bench/cpu_speed.py --steps 3 --only bfloat16  # a quick look

Each setting is one real run of recipes/smollm2-135m/arithmetic.yaml (`launch.py`, every knob as shipped but
max_steps and saving) in a process of its own, with the environment a user would set:
- model.dtype float32 or bfloat16 (the frozen base; the LoRA adapter and its optimizer stay float32),
- torch intra-op threads (OMP_NUM_THREADS) 1 .. the cores,
- OpenMP's wait policy: ACTIVE (idle threads spin: OpenMP's default) or PASSIVE (they sleep),
and each twice: on an idle machine, and beside one busy neighbour (a process spinning on one core, as a second
job on a shared machine would). Seconds per step are the trainer's own `step_time` (trainer_state.json): the
first step (it warms the kernels up) apart, the rest averaged; the 30-step estimate is first + 29 x the rest.
The 1-minute load average before each run is recorded beside it: a figure taken on a machine that was not idle
says so.
Writes bench/results/cpu_speed.json and cpu_speed.md; no timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpokit import files  # noqa: E402
from grpokit.files import reading  # noqa: E402
from labs.outputs import add_commit_flag, out_path  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPE = ROOT / "recipes" / "smollm2-135m" / "arithmetic.yaml"
SHIPPED_STEPS = 30


def settings(cores: int, only: list[str]) -> list[dict]:
    """Every (dtype, threads, wait policy) to measure, those matching `only` (substrings of their label)."""
    out = []
    for dtype, threads, wait in itertools.product(("float32", "bfloat16"), sorted({1, cores}), ("ACTIVE", "PASSIVE")):
        one = {"dtype": dtype, "threads": threads, "wait": wait, "label": f"{dtype}, {threads} thread(s), {wait.lower()}"}
        if not only or any(o in one["label"] for o in only):
            out.append(one)
    return out


def neighbour() -> subprocess.Popen:
    """One busy neighbour: a process that spins on one core until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def run_one(setting: dict, steps: int, work: Path) -> dict:
    """Train `steps` steps with `setting`; the trainer's step times, or why the run failed."""
    out = work / f"run-{setting['dtype']}-{setting['threads']}-{setting['wait']}"
    env = dict(os.environ, OMP_NUM_THREADS=str(setting["threads"]), OMP_WAIT_POLICY=setting["wait"],
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    argv = [sys.executable, str(ROOT / "launch.py"), "--recipe", str(RECIPE), f"trainer.max_steps={steps}",
            "trainer.save_strategy=no", f"trainer.output_dir={out}", f"model.dtype={setting['dtype']}", "--overwrite"]
    load_before = os.getloadavg()[0]
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.time() - start
    state, why = reading.try_json(out / "trainer_state.json")
    if done.returncode != 0 or state is None:
        return {"failed": (done.stderr or done.stdout)[-600:] or why, "wall_s": round(wall, 1)}
    times = [e["step_time"] for e in state.get("log_history", []) if isinstance(e, dict) and "step_time" in e]
    if not times:
        return {"failed": "no step_time in trainer_state.json", "wall_s": round(wall, 1)}
    rest = times[1:] or times
    per_step = sum(rest) / len(rest)
    return {"step_times_s": [round(t, 2) for t in times], "first_s": round(times[0], 2), "per_step_s": round(per_step, 2),
            f"est_{SHIPPED_STEPS}_steps_min": round((times[0] + (SHIPPED_STEPS - 1) * per_step) / 60, 1),
            "process_wall_s": round(wall, 1), "load_average_before": round(load_before, 2)}


def table(results: dict) -> list[str]:
    lines = ["| setting | idle: s/step | idle: 30 steps | beside a busy neighbour: s/step | neighbour: 30 steps |",
             "|---|---|---|---|---|"]
    for row in results["rows"]:
        cells = []
        for where in ("idle", "neighbour"):
            r = row.get(where)
            if r is None:
                cells += ["-", "-"]
            elif "failed" in r:
                cells += ["failed", "-"]
            else:
                cells += [f"{r['per_step_s']:.1f} (first {r['first_s']:.1f}; load {r['load_average_before']:.1f})",
                          f"{r[f'est_{SHIPPED_STEPS}_steps_min']:.1f} min"]
        lines.append(f"| {row['label']} | " + " | ".join(cells) + " |")
    return lines


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="steps per run: the first warms up, the rest are averaged")
    parser.add_argument("--only", nargs="*", default=[], help="measure only settings whose label holds one of these")
    parser.add_argument("--where", choices=("idle", "neighbour", "both"), default="both")
    parser.add_argument("--out", help="results file (default runs/bench/cpu_speed.json; labs/outputs.py)")
    add_commit_flag(parser)
    opts = parser.parse_args(argv)
    out = out_path(opts, "cpu_speed.json")
    check_outputs([out, out.with_suffix(".md")])
    cores = len(os.sched_getaffinity(0))
    rows = [dict(s) for s in settings(cores, opts.only)]
    wheres = ("idle", "neighbour") if opts.where == "both" else (opts.where,)
    results = {
        "machine": f"{platform.machine()}, {cores} cores visible, {platform.processor() or platform.platform()}",
        "recipe": str(RECIPE.relative_to(ROOT)),
        "measured": ("the trainer's step_time per step (trainer_state.json) of a real run of the recipe with every "
                     "knob as shipped but max_steps and saving; the first step apart, the rest averaged; 30-step "
                     "estimate = first + 29 x the rest. Neighbour: one process spinning on one core for the whole run"),
        "steps": opts.steps, "when": time.strftime("%Y-%m-%d"), "rows": rows,
    }
    with tempfile.TemporaryDirectory(prefix="cpu-speed-") as work:
        for where in wheres:
            for row in rows:
                busy = neighbour() if where == "neighbour" else None
                try:
                    print(f"{where}: {row['label']} ...", flush=True)
                    row[where] = run_one(row, opts.steps, Path(work))
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
                r = row[where]
                print(f"  {r.get('per_step_s', 'failed')} s/step" + (f" ({r['failed'][-200:]})" if "failed" in r else ""), flush=True)
                files.write_text(out, json.dumps(results, indent=1) + "\n", key="--out")  # a killed bench keeps what it measured
    files.write_text(out.with_suffix(".md"), "\n".join([f"# CPU speed ({results['when']})", "", results["machine"], "",
                                                        results["measured"], ""] + table(results)) + "\n", key="--out")
    print("\n".join(table(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
