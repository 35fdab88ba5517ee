"""Real GRPO steps on a CUDA GPU next to the memory plan: live tensors per moment, and the allocator's peaks.

    python bench/gpu_memory.py                          # every case, under a 16 GiB cap; ~8 min on an H200
    python bench/gpu_memory.py --cases 3b-lora,7b-qlora --out $OUT
    python bench/gpu_memory.py --dry-run                # CPU, tiny config: the whole path, measures no GPU

After the cases, a shipped recipe (`--recipe`, default recipes/smoke.yaml) through launch.py: `--probe`, then two
steps that measure themselves (grpokit.trainer.watch), so the first session lent a GPU measures both at once.

The same accounting as bench/plan_vs_measured.py (its models, inputs, trainer and
`grpokit.planning.measure.LiveTensors`), so a GPU case is one more row of the same table: live tensor bytes
per moment and component against `memory.plan(device="cuda")`. What the CPU harness cannot see is read
here at every moment change: `torch.cuda.max_memory_allocated` (live tensors plus what kernels allocate
inside one operator, rounded to the allocator's blocks) and `max_memory_reserved` (plus fragmentation),
and the CUDA context (the device's used memory beyond what PyTorch reserved).

For each case: a random-weight model of a shipped architecture (the shipped config.json, bf16 on the GPU;
4-bit NF4 through `from_pretrained` with `grpokit.trainer.models.quantization_config`), the process capped at
`--cap-gib` with `torch.cuda.set_per_process_memory_fraction`, and `--steps` real optimizer steps of TRL's
`GRPOTrainer` with completions forced to full length. Results go to `<out>/gpu_memory-<date>.json` and
`.md` after every case, so a run cut short still leaves its results; `memory.validation_note()` quotes the
newest non-dry-run file's summary line once one is committed in bench/results.

Running it on the device machine (its image has torch, transformers, accelerate and peft, but not trl,
datasets or bitsandbytes): here, once, `echo /.benchsite/ >> .git/info/exclude` and
`python bench/gpu_memory.py --pack-deps .benchsite`, which copies trl, datasets, dill and bitsandbytes (its
CUDA 13.0 library only) from this venv. multiprocess is version-specific: add the cp312 wheel's contents
(`pip download --no-deps --python-version 3.12 --only-binary=:all: multiprocess==0.70.18 -d /tmp/w` and
unzip it into .benchsite). Then run with carry [".benchsite"] and
`PYTHONPATH=.benchsite:. PYTHONUNBUFFERED=1 python3 bench/gpu_memory.py --out $OUT`, timeout_s 560.
If datasets refuses the image's pyarrow, pack an older datasets (TRL 1.16 needs >= 4.7).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import date
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent), str(BENCH)]  # run from anywhere: grpokit and the CPU harness are the repo's
import plan_vs_measured as pvm  # noqa: E402

from grpokit import files  # noqa: E402
from grpokit.config.sections import LORA_DEFAULTS  # noqa: E402
from grpokit.planning import memory  # noqa: E402
from labs.outputs import add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

GIB = memory.GIB
LORA = {k: v for k, v in LORA_DEFAULTS.items() if k != "task_type"}  # a recipe's `lora:` with grpokit's defaults
# The shipped recipes' shape: 8 completions of 1024 tokens per prompt, prompts of 256, 4 prompts per generation.
RUN = dict(dtype="bfloat16", optim="adamw_bnb_8bit", per_device_train_batch_size=8, gradient_accumulation_steps=4,
           num_generations=8, prompt_length=256, max_completion_length=1024, lora=LORA)
# Most important first: a run cut short by the time budget still answers "do 3B LoRA and 7B QLoRA fit".
CASES = [
    pvm.Setting("3b-lora", "Qwen/Qwen2.5-3B-Instruct", **RUN),
    pvm.Setting("7b-qlora", "Qwen/Qwen2.5-7B-Instruct", **{**RUN, "quantization": "4bit", "per_device_train_batch_size": 4,
                                                            "gradient_accumulation_steps": 8}),
    pvm.Setting("1.5b-lora", "Qwen/Qwen2.5-1.5B-Instruct", **RUN),
    pvm.Setting("0.5b-lora", "Qwen/Qwen2.5-0.5B-Instruct", **RUN),
]
SECONDS_ESTIMATE = {"3b-lora": 140, "7b-qlora": 220, "1.5b-lora": 90, "0.5b-lora": 70}  # to skip what cannot finish


class Allocator:
    """The CUDA allocator's peaks per moment, read at each moment change; inert on CPU (dry run)."""

    def __init__(self, cap_gib: float):
        import torch

        self.torch, self.cuda, self.cap = torch, torch.cuda.is_available(), cap_gib * GIB
        self.peaks: dict[str, dict] = {}
        self.context = 0

    def start(self):
        """Cap the allocator and forget earlier peaks; the CUDA context is what the driver uses beyond it."""
        if self.cuda:
            t = self.torch
            gc.collect()
            t.cuda.empty_cache()
            t.cuda.synchronize()
            free, total = t.cuda.mem_get_info()
            self.context = (total - free) - t.cuda.memory_reserved()
            t.cuda.set_per_process_memory_fraction(min(1.0, self.cap / total))
            t.cuda.reset_peak_memory_stats()

    def moment(self, ending: str, starting: str):
        if not self.cuda:
            return
        t = self.torch
        t.cuda.synchronize()
        seen = self.peaks.setdefault(ending, {"allocated": 0, "reserved": 0})
        seen["allocated"] = max(seen["allocated"], t.cuda.max_memory_allocated())
        seen["reserved"] = max(seen["reserved"], t.cuda.max_memory_reserved())
        t.cuda.reset_peak_memory_stats()

    def stop(self):
        if self.cuda:
            self.torch.cuda.set_per_process_memory_fraction(1.0)


def run_case(case: pvm.Setting, steps: int, cap_gib: float, device: str) -> dict:
    """Measure one case: live tensors (same accounting as the CPU harness) and the allocator, then compare."""
    import torch

    allocator = Allocator(cap_gib)
    allocator.start()
    status = "ok"
    try:
        measured = pvm.measure(case, steps, device=device, on_moment=allocator.moment)
    except torch.OutOfMemoryError as e:  # under the cap: the verdict the plan should have given
        measured = None
        status = f"OOM under the {cap_gib:g} GiB cap: {str(e).splitlines()[0][:200]}"
    finally:
        allocator.stop()
    record = {"setting": asdict(case), "describe": case.describe(), "status": status, "context_bytes": allocator.context}
    if measured is None:
        return record
    record["measured"] = measured
    record["comparison"] = pvm.compare(case, measured, device)
    record["allocator"] = allocator_phases(allocator.peaks, measured)
    return record


def allocator_phases(peaks: dict, measured: dict) -> dict:
    """Per phase, the allocator's highest peak over the phase's moments (zeros on a dry run)."""
    from grpokit.planning.measure import GENERATION, TRAINING_MOMENTS

    out = {}
    for phase, moments in (("generation", [GENERATION]), ("training", TRAINING_MOMENTS)):
        seen = [peaks[m] for m in moments if m in peaks]
        out[phase] = {k: max((p[k] for p in seen), default=0) for k in ("allocated", "reserved")}
        live = measured["phases"][phase]["bytes"]
        out[phase]["kernel_and_rounding"] = out[phase]["allocated"] - live if out[phase]["allocated"] else None
    return out


def summary_line(results: dict) -> str:
    """What `memory.validation_note()` quotes once a GPU run is committed: live-tensor error and allocator."""
    rows = [r for r in results["cases"] if "comparison" in r]
    if not rows:
        return "no case measured"
    s = pvm.summary(rows)
    extra = [(r["allocator"][ph]["reserved"] + r["context_bytes"]) / max(1, r["comparison"]["phases"][ph]["planned"]) - 1
             for r in rows for ph in ("generation", "training") if r["allocator"][ph]["reserved"]]
    gpu = results["versions"].get("gpu", "CPU (dry run)")
    line = f"live tensors within {s['worst_abs_error']:.1%} of the plan over {s['settings']} cases on {gpu}"
    if extra:
        line += f"; allocator reserved + context {max(extra):+.0%} over the live-tensor plan at worst"
    return line


def versions() -> dict:
    import torch

    v = pvm.versions() | {"cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        v["gpu"], v["gpu_memory_gib"] = props.name, round(props.total_memory / GIB, 1)
    return v


def outputs(out: Path, stem: str) -> list[Path]:
    """The results files a run writes: `<stem>.json` and `<stem>.md` in `out`."""
    return [out / f"{stem}.json", out / f"{stem}.md"]


def write(results: dict, out: Path, stem: str):
    check_outputs(outputs(out, stem))  # both, before either is written
    results["summary_line"] = summary_line(results)
    files.write_text(out / f"{stem}.json", json.dumps(results, indent=1, default=str) + "\n", key="--out")
    rows = [r for r in results["cases"] if "comparison" in r]
    lines = [f"# GRPO steps on {results['versions'].get('gpu', 'CPU (dry run)')} vs grpokit's plan ({results['date']})", "",
             results["note"], "", results["summary_line"], "", *pvm.table(rows), "",
             "| case | status | allocated gen / train (GiB) | reserved + context gen / train (GiB) | plan total (GiB) |",
             "|---|---|---|---|---|"]
    for r in results["cases"]:
        a = r.get("allocator")
        if a is None:
            lines.append(f"| {r['setting']['name']} | {r['status']} | | | |")
            continue
        ctx = r["context_bytes"]
        lines.append(f"| {r['setting']['name']} | {r['status']} | {a['generation']['allocated'] / GIB:.2f} / "
                     f"{a['training']['allocated'] / GIB:.2f} | {(a['generation']['reserved'] + ctx) / GIB:.2f} / "
                     f"{(a['training']['reserved'] + ctx) / GIB:.2f} | {r.get('plan_total_gib', 0):.2f} |")
    files.write_text(out / f"{stem}.md", "\n".join(lines) + "\n", key="--out")


def pack_deps(target: Path):
    """Copy what the device image lacks (trl, datasets, dill, bitsandbytes for CUDA 13.0) into `target`."""
    import importlib.util

    ownership = files.ownership
    if target.is_symlink():
        raise files.problem(target, "is reached through a symbolic link; grpokit never writes through one", "--pack-deps",
                            "give the folder's real path")
    if ownership.holds_run(target.resolve()):
        raise files.problem(target, "is (or holds) a training run's folder", "--pack-deps", "choose a folder of its own")
    others = ownership.foreign(target)  # a folder of one's own only: a package copied there earlier is replaced
    if others:
        raise files.problem(target, f"holds {ownership.describe(others)}, which this script did not write", "--pack-deps",
                            "choose a new folder")
    files.remove(target, ownership.entries(target), "--pack-deps")
    target.mkdir(parents=True, exist_ok=True)
    recorder = ownership.Recorder(target)
    for name in ("trl", "datasets", "dill", "bitsandbytes", "yaml"):  # yaml: launch.py reads recipes
        src = Path(importlib.util.find_spec(name).origin).parent
        dst = target / name
        keep_so = ("libbitsandbytes_cuda130.so", "libbitsandbytes_cpu.so")
        shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names if n == "__pycache__" or (
            n.startswith("libbitsandbytes_") and n not in keep_so)])
        for info in src.parent.glob(f"{name}-*.dist-info"):  # so importlib.metadata reports the version
            shutil.copytree(info, target / info.name, dirs_exist_ok=True)
    recorder.record()
    size = sum(f.stat().st_size for f in target.rglob("*") if f.is_file())
    print(f"packed into {target}: {size / 2**20:.0f} MiB; add multiprocess for Python 3.12 (see the docstring)")


RECIPE = BENCH.parent / "recipes" / "smoke.yaml"  # offline on any machine: the tiny model, built locally
RECIPE_SECONDS = 120  # --probe, then two steps, each a launch.py of its own (a fresh CUDA context)


def run_recipe(recipe: Path, work: Path) -> dict:
    """A shipped recipe through launch.py on this GPU, as a user runs it: `--probe` (one step at its largest shapes:
    fits, or the phase that does not), then a two-step run that measures itself (its `memory, step` lines and
    `memory/*` metrics: CUDA's peaks per phase against the plan at each step's shapes)."""
    import subprocess

    launch = [sys.executable, str(BENCH.parent / "launch.py"), "--recipe", str(recipe)]
    env = dict(os.environ, TMPDIR=str(work))
    probe = subprocess.run([*launch, "--probe"], capture_output=True, text=True, timeout=300, env=env)
    run_dir = work / "run"
    run = subprocess.run([*launch, f"trainer.output_dir={run_dir}", "trainer.max_steps=2", "trainer.save_strategy=no"],
                         capture_output=True, text=True, timeout=300, env=env)
    state = run_dir / "trainer_state.json"
    history = files.read_json(state, dict, key="--recipe").get("log_history", []) if state.is_file() else []
    said = lambda done, mark: [line for line in (done.stdout + done.stderr).splitlines() if mark in line][:20]  # noqa: E731
    return {"recipe": str(recipe.relative_to(BENCH.parent)), "probe_exit": probe.returncode,
            "probe_lines": said(probe, "probe"), "run_exit": run.returncode, "run_lines": said(run, "memory"),
            "run_metrics": [{k: v for k, v in h.items() if k.startswith("memory/")} for h in history
                            if any(k.startswith("memory/") for k in h)]}


@one_line_exit
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", default=",".join(c.name for c in CASES), help="comma-separated, from: "
                    + ", ".join(c.name for c in CASES))
    ap.add_argument("--steps", type=int, default=1, help="optimizer steps measured per case (after one that creates the optimizer states)")
    ap.add_argument("--cap-gib", type=float, default=16.0, help="the card to emulate")
    ap.add_argument("--budget-s", type=float, default=470, help="start no case that cannot end within this")
    ap.add_argument("--out", help="results folder (default runs/bench, bench/results with --commit-results; a temporary "
                                  "one for --dry-run)")
    add_commit_flag(ap)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny config, short sequences: the whole path")
    ap.add_argument("--pack-deps", metavar="DIR", help="copy the packages the device image lacks into DIR, and stop")
    ap.add_argument("--recipe", type=Path, default=RECIPE, help="a shipped recipe run after the cases through "
                    "launch.py: --probe, then two steps measuring themselves (default recipes/smoke.yaml)")
    ap.add_argument("--no-recipe", action="store_true", help="skip the recipe's --probe and run")
    a = ap.parse_args(argv)
    if a.pack_deps:
        pack_deps(Path(a.pack_deps))
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here downloads: random weights, shipped configs
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    names = a.cases.split(",")
    unknown = [n for n in names if n not in {c.name for c in CASES}]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(c.name for c in CASES)}")
    if not a.dry_run and not torch.cuda.is_available():
        ap.error("no CUDA device: run on a GPU, or pass --dry-run for the CPU path check")
    device = "cpu" if a.dry_run else "cuda"
    out = Path(a.out) if a.out else (Path(tempfile.mkdtemp(prefix="gpu_memory-dry-")) if a.dry_run else results_dir(a))
    stem = f"gpu_memory-{date.today().isoformat()}" + ("-dry-run" if a.dry_run else "")
    note = ("DRY RUN on CPU with the CPU harness's tiny config: the path is exercised, no GPU measured." if a.dry_run else
            f"Random weights under a {a.cap_gib:g} GiB cap (set_per_process_memory_fraction); completions forced to "
            "max_completion_length; plan = grpokit.planning.memory.plan(device='cuda') for the same settings.")
    check_outputs(outputs(out, stem))  # before the first case, not after it
    results = {"date": date.today().isoformat(), "versions": versions(), "cap_gib": a.cap_gib, "steps": a.steps,
               "device": device, "note": note, "cases": []}
    t0 = time.time()
    for case in (c for c in CASES if c.name in names):
        if a.dry_run:  # the CPU harness's tiny setting under this case's name and knobs
            case = replace(pvm.TINY, name=case.name, quantization="none", optim="adamw_torch")
        if time.time() - t0 + (0 if a.dry_run else SECONDS_ESTIMATE[case.name]) > a.budget_s:
            results["cases"].append({"setting": asdict(case), "status": f"skipped: would not end within --budget-s {a.budget_s:g}"})
            continue
        print(f"[{time.time() - t0:5.0f}s] {case.name}: {case.describe()}", flush=True)
        try:
            record = run_case(case, a.steps, a.cap_gib, device)
        except Exception as e:  # record and go on: one broken case must not lose the others
            record = {"setting": asdict(case), "status": f"error: {type(e).__name__}: {e}"[:400]}
        if "comparison" in record:
            p = pvm.plan(case, device)
            record["plan_total_gib"], record["plan_fits"] = p.total_gb, p.fits
            print("\n".join(pvm.components(record)), flush=True)
        print(f"         {record['status']}", flush=True)
        results["cases"].append(record)
        write(results, out, stem)
    if not a.no_recipe and not a.dry_run:  # the per-run measurement and the probe, as a user meets them
        if time.time() - t0 + RECIPE_SECONDS > a.budget_s:
            results["recipe"] = {"status": f"skipped: would not end within --budget-s {a.budget_s:g}"}
        else:
            with tempfile.TemporaryDirectory(prefix="gpu_memory-recipe-") as work:
                try:
                    results["recipe"] = run_recipe(a.recipe.resolve(), Path(work))
                except Exception as e:  # noqa: BLE001 - the cases' results are kept whatever this does
                    results["recipe"] = {"status": f"error: {type(e).__name__}: {e}"[:400]}
            print(json.dumps(results["recipe"], indent=1), flush=True)
            write(results, out, stem)
    print(f"results: {out / stem}.json and .md")
    bad = [r for r in results["cases"] if not (r["status"] == "ok" or r["status"].startswith(("skipped", "OOM")))]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
