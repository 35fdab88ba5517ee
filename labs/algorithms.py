"""The chapter's claims on a real model: GRPO, Dr. GRPO, DAPO and GRPO with a KL term, on SmolLM2-135M-Instruct.

    nice .venv/bin/python labs/algorithms.py --commit-results   # 4 recipes x 3 seeds, 2 at a time, into bench/results/lab
    nice .venv/bin/python labs/algorithms.py --task chain_sum --commit-results   # the same lab on reasoning-gym's chain_sum
    .venv/bin/python labs/algorithms.py --report-only --commit-results   # figures and page from the runs there are
    .venv/bin/python labs/algorithms.py --algorithms grpo dapo --seeds 0 --set trainer.max_steps=4   # a look: runs/bench/lab

Every run is a plain grpokit run of one of the lab's four recipes (recipes/smollm2-135m/lab/*.yaml for additions,
recipes/smollm2-135m/lab/<task>/*.yaml for a reasoning-gym task: `--task`) with `trainer.seed=<seed>`, started
as `launch.py` in a process of its own (one torch thread per run when runs share the cores), logged to
`<runs>/<algorithm>/seed-<seed>.log`. A stopped lab starts again where it stopped: a finished run is not
trained again, a run with a checkpoint resumes from it (`--resume`), a measured run is not measured again.

Measured per run, after training (files under `<out>/measures/`):
- held-out greedy pass@1, by `launch.py --eval` (the base model's once, the same for every run);
- KL[pi_theta || pi_ref] of the trained policy to the base model: the mean over the tokens of the trained
  policy's own greedy held-out completions of k3 = rho - 1 - log rho, rho = pi_ref / pi_theta (the estimator
  TRL uses, at temperature 1), the same measurement for every algorithm, with or without a KL term.
Per step, from each run's trainer_state.json: mean completion length, entropy, clip ratios, share of
zero-spread groups, KL (runs with beta > 0), training accuracy; steps to an accuracy threshold.

Writes `<out>/lab.json` (every figure and how it was measured), `<out>/table.md`, one PNG per claim and
`<out>/README.md`, the lab's page: per claim, whether it held here, by how much, and how sure (the spread
over seeds). `<out>` is runs/bench/lab by default (runs/bench/lab-<task> with `--task`), the committed bench/results/lab
(-<task>) with `--commit-results` (labs/outputs.py's rule); the runs go to `<out>/runs` and the measures to `<out>/measures`,
neither committed: a fresh checkout has neither, so it trains and measures every run again, and the measures always
belong to the runs beside them (lab.json holds every figure the page shows).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpokit import files  # noqa: E402
from grpokit.errors import RecipeError  # noqa: E402
from labs.claims import (  # noqa: E402
    CLAIMS, WINDOW, claims_for, curve_summary, plot_claim, sentence, summarize_run, table, verdict)
from labs.outputs import add_commit_flag, results_dir  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

RECIPES = ROOT / "recipes" / "smollm2-135m" / "lab"
FILES = {"grpo": "grpo-lab.yaml", "dr_grpo": "dr_grpo-lab.yaml", "dapo": "dapo-lab.yaml", "grpo_kl": "grpo-kl-lab.yaml"}


@dataclass(frozen=True)
class Lab:
    """One lab: the four algorithms' recipes on one task, where its results go, and what its accuracy claim reads."""

    task: str
    recipes: Path  # the folder of the four recipes (FILES)
    folder: str  # its results' folder in labs/outputs.py's results folder (bench/results/<folder> when committed)
    subject: str = ""  # the page's title says the lab is on this (the additions lab's title names no task)
    reward: str = "accuracy"  # the reward whose training mean is the accuracy the steps-to-threshold claim reads
    threshold: float = 0.75  # that claim's threshold, set before any run (never from the runs it judges)
    why_threshold: str = ""  # how it was set, for the page

    @property
    def algorithms(self) -> dict[str, Path]:  # name -> recipe: the name is what the page, the table and --algorithms say
        return {name: self.recipes / f for name, f in FILES.items()}


LABS = {
    "additions": Lab("additions", RECIPES, "lab"),
    # reasoning-gym's chain_sum (two one-digit numbers), where the model may talk its way to the sum: before any lab
    # run, the base model's sampled groups on 16 training prompts x 8 were 0.25 right, 75 % mixed, 36 of 64 tokens
    # long on average (25 % cut at the cap): room for length to move, groups to learn from. The recipe has the rest.
    "chain_sum": Lab("chain_sum", RECIPES / "chain_sum", "lab-chain_sum",
                     subject="reasoning-gym's chain_sum", reward="task_score", threshold=0.5,
                     why_threshold="set before any run at twice the base model's sampled training accuracy (0.25 on "
                                   "16 training prompts x 8)"),
}
ALGORITHMS = LABS["additions"].algorithms
SEEDS = (0, 1, 2)
STEP = re.compile(r"step (\d+)/(\d+)")
REMEASURE = "remove it, and the lab measures the run again"
_LOGS = threading.Lock()  # the runs' logs of one algorithm share a folder's manifest: one thread updates it at a time


@dataclass(frozen=True)
class Job:
    algorithm: str
    seed: int
    lab: Lab = LABS["additions"]

    @property
    def recipe(self) -> Path:
        return self.lab.algorithms[self.algorithm]

    @property
    def name(self) -> str:
        return f"{self.algorithm} seed {self.seed}"

    def run_dir(self, runs: Path) -> Path:
        return runs / self.algorithm / f"seed-{self.seed}"

    def log(self, runs: Path) -> Path:
        return runs / self.algorithm / f"seed-{self.seed}.log"

    def measures(self, out: Path) -> Path:
        return out / "measures" / f"{self.algorithm}-seed-{self.seed}.json"


# -- running ---------------------------------------------------------------------------------------------------


def launch_args(job: Job, runs: Path, overrides: list[str]) -> list[str]:
    """launch.py's command line for a job: a fresh run, or `--resume` of what a stopped lab left."""
    run_dir = job.run_dir(runs)
    argv = [sys.executable, str(ROOT / "launch.py"), "--recipe", str(job.recipe),
            f"trainer.seed={job.seed}", f"trainer.output_dir={run_dir}", *overrides]
    if (run_dir / "trainer_state.json").is_file() or any(run_dir.glob("checkpoint-*/trainer_state.json")):
        argv.append("--resume")  # a finished run is left as it is (grpokit says so), a stopped one goes on
    elif run_dir.exists():
        argv.append("--overwrite")  # stopped before its first checkpoint: grpokit removes only what it wrote
    return argv


def finished(job: Job, runs: Path) -> bool:
    """The run saved its final state (the trainer writes trainer_state.json in output_dir only at the end)."""
    run_dir = job.run_dir(runs)
    return (run_dir / "trainer_state.json").is_file() and (run_dir / "adapter_config.json").is_file()


def child_env(threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def run_logged(argv: list[str], log: Path, threads: int) -> None:
    """Run `argv`, its output appended to `log`, a log grpokit keeps (a file of the user's there is refused)."""
    with _LOGS:
        out = files.open_log(log, key="--out")
    try:
        with out:
            out.write(f"\n$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(threads), cwd=ROOT)
    finally:
        with _LOGS:  # recorded as it is now, grown: the next step of the run appends to it again
            files.ownership.claim_file(log)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(argv[1:4])} ...; see {log}")


def base_eval(lab: Lab, out: Path, runs: Path, overrides: list[str], threads: int) -> Path:
    """The base model's held-out figures, once (greedy: the same for every seed and algorithm)."""
    path = out / "measures" / "base-eval.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        run_logged([sys.executable, str(ROOT / "launch.py"), "--recipe", str(lab.algorithms["grpo"]), "--eval",
                    f"trainer.output_dir={runs / 'base'}", "--eval-out", str(path), *overrides],
                   runs / "base-eval.log", threads)
    return path


def run_job(job: Job, runs: Path, out: Path, overrides: list[str], threads: int) -> None:
    """Train (or resume), then measure: held-out pass@1 and KL to the base model. Each part only once."""
    log = job.log(runs)
    if not finished(job, runs):
        run_logged(launch_args(job, runs, overrides), log, threads)
    measures = job.measures(out)
    if measures.is_file():
        return
    eval_out = measures.with_name(measures.stem + "-eval.json")
    if not eval_out.is_file():
        run_logged([sys.executable, str(ROOT / "launch.py"), "--recipe", str(job.recipe),
                    "--eval", str(job.run_dir(runs)), f"trainer.output_dir={job.run_dir(runs)}",
                    "--eval-out", str(eval_out), *overrides], log, threads)
    run_logged([sys.executable, str(Path(__file__).resolve()), "--measure-kl", str(job.run_dir(runs)),
                "--algorithms", job.algorithm, "--task", job.lab.task, "--out", str(out),
                *sum((["--set", o] for o in overrides), [])],
               log, threads)


def progress_line(jobs: list[Job], runs: Path, out: Path, running: set[Job], started: float) -> str:
    done = sum(1 for j in jobs if j.measures(out).is_file())
    parts = []
    for job in sorted(running, key=lambda j: j.name):
        log = job.log(runs)
        data, _ = files.try_bytes(log)  # never waits on a FIFO there
        tail = (data or b"")[-4000:].decode(errors="replace")
        steps = STEP.findall(tail)
        parts.append(f"{job.name} " + (f"step {steps[-1][0]}/{steps[-1][1]}" if steps else "starting"))
    return f"lab [{time.time() - started:6.0f} s] {done}/{len(jobs)} runs measured" + ("; " + ", ".join(parts) if parts else "")


def run_all(jobs: list[Job], runs: Path, out: Path, overrides: list[str], parallel: int, every: float = 30.0) -> list[str]:
    """Run the jobs, `parallel` at a time, printing progress every `every` seconds; the failures' messages."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // parallel)
    started, running, failures, lock = time.time(), set(), [], threading.Lock()
    print(f"lab: {len(jobs)} runs, {parallel} at a time, {threads} torch thread(s) each; logs in {runs}", flush=True)
    base_eval(jobs[0].lab, out, runs, overrides, cores)

    def one(job: Job) -> None:
        with lock:
            running.add(job)
        try:
            run_job(job, runs, out, overrides, threads)
        except RuntimeError as err:
            with lock:
                failures.append(f"{job.name}: {err}")
        except RecipeError as err:  # refused (a log of the user's at the run's name): this run only, the others go on
            with lock:
                failures.append(f"{job.name}: " + "; ".join(p.format() for p in err.problems))
        finally:
            with lock:
                running.discard(job)
            print(progress_line(jobs, runs, out, set(running), started) + f"  ({job.name} ended)", flush=True)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        pending = {pool.submit(one, job) for job in jobs}
        while pending:
            _, pending = wait(pending, timeout=every)
            if pending:
                with lock:
                    print(progress_line(jobs, runs, out, set(running), started), flush=True)
    return failures


# -- the KL of a trained policy to its base model --------------------------------------------------------------


def token_logps(model, ids, prompt_len: int):
    """log pi(token) of every completion token of the single sequence `ids` (1 x T), at temperature 1."""
    import torch

    logits = model(input_ids=ids).logits[:, prompt_len - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)


def kl_to_reference(recipe, run_dir: Path, log=lambda m: None) -> dict:
    """k3 = rho - 1 - log rho (rho = pi_ref / pi_theta), averaged over the tokens of the trained policy's own greedy
    completions of the held-out prompts; pi_ref is the base model (the adapter switched off)."""
    import torch
    from peft import PeftModel

    from grpokit.config.trainer_args import grpo_args
    from grpokit.prompts.data import heldout_dataset
    from grpokit.run.evaluate import generate_ids, prompt_text
    from grpokit.trainer.models import load_model, load_tokenizer, model_source

    args = grpo_args(recipe)
    model_path, _ = model_source(recipe)
    tokenizer = load_tokenizer(model_path, recipe)
    rows = [dict(row) for row in heldout_dataset(recipe, tokenizer, log)]
    model = PeftModel.from_pretrained(load_model(model_path, recipe), str(run_dir)).eval()
    total, tokens = 0.0, 0
    for first in range(0, len(rows), 16):
        batch = rows[first : first + 16]
        for row, group in zip(batch, generate_ids(model, tokenizer, batch, args, k=1, sample=False)):
            prompt = tokenizer(prompt_text(tokenizer, row["prompt"]), add_special_tokens=False).input_ids
            ids = torch.tensor([prompt + group[0]])
            with torch.no_grad():
                policy = token_logps(model, ids, len(prompt))
                with model.disable_adapter():
                    reference = token_logps(model, ids, len(prompt))
            log_rho = reference - policy
            total += float((torch.exp(log_rho) - 1 - log_rho).sum())
            tokens += log_rho.numel()
    return {"kl_k3": total / max(1, tokens), "tokens": tokens, "prompts": len(rows),
            "measured": "mean over the completion tokens of k3 = rho - 1 - log rho, rho = pi_ref / pi_theta, on the "
                        "trained policy's greedy completions of the held-out prompts; pi_ref = the base model "
                        "(adapter off); temperature 1"}


def measure_kl(run_dir: Path, job: Job, out: Path, overrides: list[str]) -> Path:
    """Write the run's measures file: its held-out eval (already there) and its KL to the base model."""
    from grpokit.config import load, validate

    recipe = validate(load(str(job.recipe), [f"trainer.output_dir={run_dir}", *overrides]))
    path = job.measures(out)
    check_outputs([path])
    heldout = read_eval(path.with_name(path.stem + "-eval.json"))
    figures = {"algorithm": job.algorithm, "seed": job.seed, "pass@1": heldout["greedy"]["pass@1"],
               "passed": heldout["greedy"]["passed"], "prompts": heldout["prompts"],
               "examples": heldout["examples"][:2], "kl_to_reference": kl_to_reference(recipe, run_dir)}
    files.write_text(path, json.dumps(figures, indent=2) + "\n", key="--out")
    return path


# -- reading back ----------------------------------------------------------------------------------------------


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_eval(path: Path) -> dict:
    """A held-out eval `launch.py --eval` wrote (greedy pass@1, passed, prompts, examples), or one line naming it."""
    heldout = files.read_json(path, dict, key="--out", fix=REMEASURE)
    greedy = heldout.get("greedy")
    if not (isinstance(greedy, dict) and _number(greedy.get("pass@1")) and _number(greedy.get("passed"))
            and _number(heldout.get("prompts")) and isinstance(heldout.get("examples", []), list)):
        raise files.problem(path, "is not a held-out eval of launch.py --eval (greedy pass@1 and passed, prompts)",
                            "--out", REMEASURE)
    return heldout


def read_measures(path: Path) -> dict:
    """A run's measures file (`measure_kl`), or one line naming it."""
    measures = files.read_json(path, dict, key="--out", fix=REMEASURE)
    kl = measures.get("kl_to_reference")
    if not (_number(measures.get("pass@1")) and isinstance(kl, dict) and _number(kl.get("kl_k3"))):
        raise files.problem(path, "is not a measures file of labs/algorithms.py (pass@1, kl_to_reference.kl_k3)",
                            "--out", REMEASURE)
    return measures


def read_command(path: Path) -> str | None:
    """The training command a lab.json records (None: there is none), or one line naming a damaged one."""
    if not os.path.lexists(path):
        return None
    command = files.read_json(path, dict, key="--out").get("command")
    if not isinstance(command, str):
        raise files.problem(path, "has no 'command' string, which the page quotes", "--out",
                            "run the lab (not --report-only) to write it again, or move it")
    return command


# -- writing ---------------------------------------------------------------------------------------------------


def history(run_dir: Path) -> list[dict]:
    """The run's per-step log (finished run, else its latest checkpoint's)."""
    from grpokit.reporting.plots import load_log_history

    return [h for h in load_log_history(run_dir)[1]["log_history"] if "loss" in h and "step" in h]


def collect(jobs: list[Job], runs: Path, out: Path) -> dict[str, list[dict]]:
    """Per algorithm, the summary of each run that has a trainer state (measured or not yet)."""
    found: dict[str, list[dict]] = {}
    for job in jobs:
        run_dir = job.run_dir(runs)
        try:
            steps = history(run_dir)
        except (ValueError, FileNotFoundError):
            continue
        measures = read_measures(job.measures(out)) if os.path.lexists(job.measures(out)) else None
        found.setdefault(job.algorithm, []).append({"seed": job.seed, "finished": finished(job, runs),
                                                    **summarize_run(steps, measures, job.lab.reward, job.lab.threshold)})
    return found


def report_files(out: Path) -> list[Path]:
    """What `write_report` writes: the page, the table, lab.json and one PNG per claim."""
    return [out / "lab.json", out / "table.md", out / "README.md", *(out / f"claim-{c.key}.png" for c in CLAIMS)]


def write_report(jobs: list[Job], runs: Path, out: Path, command: str) -> dict:
    check_outputs(report_files(out))  # before anything is drawn: a refusal leaves every file as it was
    setup = jobs[0].lab if jobs else LABS["additions"]
    results = collect(jobs, runs, out)
    base_path = out / "measures" / "base-eval.json"
    base = read_eval(base_path) if os.path.lexists(base_path) else None
    verdicts = []
    longest = max((r["steps"] for rows in results.values() for r in rows), default=0)
    for claim in claims_for(setup.threshold):
        figures = {a: [r[claim.key] for r in rows] for a, rows in results.items()}
        censor = longest + 1 if claim.censored else None
        result = verdict(claim, figures, censor=censor)
        verdicts.append({**result, "sentence": sentence(claim, result)})
        plot_claim(claim, results, out / f"claim-{claim.key}.png", setup.threshold, censor)
    lab = {"command": command, "task": setup.task,
           "recipes": {a: str(p.relative_to(ROOT)) for a, p in setup.algorithms.items()},
           "measured": __doc__.split("Measured per run, after training")[1].split("Writes")[0].strip(),
           "window": WINDOW, "accuracy_reward": setup.reward, "threshold": setup.threshold,
           "base": base and base["greedy"], "runs": results, "verdicts": verdicts}
    files.write_text(out / "lab.json", json.dumps(lab, indent=1) + "\n", key="--out")
    rows = table(results, base, setup.threshold)
    files.write_text(out / "table.md", "\n".join(rows) + "\n", key="--out")
    files.write_text(out / "README.md", page(setup, command, rows, verdicts, results), key="--out")
    return lab


def page(setup: Lab, command: str, rows: list[str], verdicts: list[dict], results: dict) -> str:
    done = sum(len(v) for v in results.values())
    folder = setup.recipes.relative_to(ROOT)
    lines = ["# The chapter's claims on SmolLM2-135M-Instruct" + (f", on {setup.subject}" if setup.subject else ""), "",
             "Written by `labs/algorithms.py` from the runs it measured; do not edit by hand. Command:", "",
             f"    {command}", "", f"{done} runs of {len(setup.algorithms)} recipes ({folder}/); "
             "what each number is: the lab's docstring and `lab.json`."
             + (f" Accuracy is the training mean of reward `{setup.reward}`." if setup.reward != "accuracy" else "")
             + (f" Its threshold {setup.threshold}: {setup.why_threshold}." if setup.why_threshold else ""),
             "", "## Every run", "", *rows, ""]
    for claim, result in zip(claims_for(setup.threshold), verdicts):
        lines += [f"## {claim.title}", "", f"Claim: {claim.says}.", "", f"![{claim.key}](claim-{claim.key}.png)", "",
                  result["sentence"], "", curve_summary(claim, results), "",
                  f"What else differs, or why it may not show here: {claim.caveat}.", ""]
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------------------------


@one_line_exit
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=list(LABS), default="additions",
                        help="the lab's task: additions (recipes/smollm2-135m/lab/) or a reasoning-gym task "
                             "(recipes/smollm2-135m/lab/<task>/)")
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2: one per core here)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every run (e.g. trainer.max_steps=4)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results folder (default runs/bench/lab, or runs/bench/lab-<task>; labs/outputs.py)")
    add_commit_flag(parser)
    parser.add_argument("--report-only", action="store_true", help="write the figures from the runs there are")
    parser.add_argument("--measure-kl", type=Path, metavar="RUN", help=argparse.SUPPRESS)  # one job's KL, in its own process
    opts = parser.parse_args(argv)
    if opts.parallel < 1:
        parser.error("--parallel must be at least 1")
    setup = LABS[opts.task]
    out = (opts.out or results_dir(opts) / setup.folder).resolve()
    if opts.measure_kl:
        job = Job(opts.algorithms[0], int(opts.measure_kl.name.split("-")[-1]), setup)
        print(f"wrote {measure_kl(opts.measure_kl, job, out, opts.set)}")
        return 0
    runs = out / "runs"
    jobs = [Job(a, s, setup) for s in opts.seeds for a in opts.algorithms]  # seed-major: every algorithm has a seed early
    command = "python labs/algorithms.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if opts.report_only:  # the page names the command that trained the runs
        command = read_command(out / "lab.json") or command
    check_outputs(report_files(out))  # before hours of training, not after
    failures = [] if opts.report_only else run_all(jobs, runs, out, opts.set, opts.parallel)
    all_jobs = [Job(a, s, setup) for a in ALGORITHMS for s in sorted({*opts.seeds, *SEEDS})]
    lab = write_report(all_jobs, runs, out, command.strip())
    for v in lab["verdicts"]:
        print(f"{v['claim']}: {v['state']}")
    print(f"wrote {out / 'README.md'}, {out / 'table.md'}, {out / 'lab.json'} and {len(lab['verdicts'])} PNGs")
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
