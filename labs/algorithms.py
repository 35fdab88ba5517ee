"""The chapter's claims on a real model: GRPO, Dr. GRPO, DAPO and GRPO with a KL term, on SmolLM2-135M-Instruct.

    nice .venv/bin/python labs/algorithms.py                 # 4 recipes x 3 seeds, 2 runs at a time; resumes
    .venv/bin/python labs/algorithms.py --report-only        # figures and page from the runs there are
    .venv/bin/python labs/algorithms.py --algorithms grpo dapo --seeds 0 --set trainer.max_steps=4   # a quick look

Every run is a plain grpokit run of one of recipes/smollm2-135m/lab/*.yaml with `trainer.seed=<seed>`, started
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
over seeds). `<out>` is bench/results/lab by default; the runs go to `<out>/runs` (not committed).
"""

from __future__ import annotations

import argparse
import json
import math
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

RECIPES = ROOT / "recipes" / "smollm2-135m" / "lab"
ALGORITHMS = {  # name -> recipe: the name is what the page, the table and --algorithms say
    "grpo": RECIPES / "grpo-lab.yaml",
    "dr_grpo": RECIPES / "dr_grpo-lab.yaml",
    "dapo": RECIPES / "dapo-lab.yaml",
    "grpo_kl": RECIPES / "grpo-kl-lab.yaml",
}
OUT = ROOT / "bench" / "results" / "lab"
SEEDS = (0, 1, 2)
WINDOW = 5  # steps averaged at the start and at the end of a run (one step's 16 completions are noisy)
THRESHOLD = 0.75  # training accuracy (WINDOW-step mean) that counts as "reached"; fixed before any run
ACCURACY = "rewards/accuracy/mean"
# With dynamic sampling the trained batch holds only groups with a spread, so its accuracy is biased toward
# 1/2; the accuracy of everything the policy generated in a step is logged apart (grpokit/dynamic_sampling.py).
GENERATED_ACCURACY = "sampling/generated/rewards/accuracy/mean"
STEP = re.compile(r"step (\d+)/(\d+)")


@dataclass(frozen=True)
class Job:
    algorithm: str
    seed: int

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
    argv = [sys.executable, str(ROOT / "launch.py"), "--recipe", str(ALGORITHMS[job.algorithm]),
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
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(argv)}\n")
        out.flush()
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=child_env(threads), cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(argv[1:4])} ...; see {log}")


def base_eval(out: Path, runs: Path, overrides: list[str], threads: int) -> Path:
    """The base model's held-out figures, once (greedy: the same for every seed and algorithm)."""
    path = out / "measures" / "base-eval.json"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        run_logged([sys.executable, str(ROOT / "launch.py"), "--recipe", str(ALGORITHMS["grpo"]), "--eval",
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
        run_logged([sys.executable, str(ROOT / "launch.py"), "--recipe", str(ALGORITHMS[job.algorithm]),
                    "--eval", str(job.run_dir(runs)), f"trainer.output_dir={job.run_dir(runs)}",
                    "--eval-out", str(eval_out), *overrides], log, threads)
    run_logged([sys.executable, str(Path(__file__).resolve()), "--measure-kl", str(job.run_dir(runs)),
                "--algorithms", job.algorithm, "--out", str(out), *sum((["--set", o] for o in overrides), [])],
               log, threads)


def progress_line(jobs: list[Job], runs: Path, out: Path, running: set[Job], started: float) -> str:
    done = sum(1 for j in jobs if j.measures(out).is_file())
    parts = []
    for job in sorted(running, key=lambda j: j.name):
        log = job.log(runs)
        tail = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
        steps = STEP.findall(tail)
        parts.append(f"{job.name} " + (f"step {steps[-1][0]}/{steps[-1][1]}" if steps else "starting"))
    return f"lab [{time.time() - started:6.0f} s] {done}/{len(jobs)} runs measured" + ("; " + ", ".join(parts) if parts else "")


def run_all(jobs: list[Job], runs: Path, out: Path, overrides: list[str], parallel: int, every: float = 30.0) -> list[str]:
    """Run the jobs, `parallel` at a time, printing progress every `every` seconds; the failures' messages."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // parallel)
    started, running, failures, lock = time.time(), set(), [], threading.Lock()
    print(f"lab: {len(jobs)} runs, {parallel} at a time, {threads} torch thread(s) each; logs in {runs}", flush=True)
    base_eval(out, runs, overrides, cores)

    def one(job: Job) -> None:
        with lock:
            running.add(job)
        try:
            run_job(job, runs, out, overrides, threads)
        except RuntimeError as err:
            with lock:
                failures.append(f"{job.name}: {err}")
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
    from grpokit.data import heldout_dataset
    from grpokit.evaluate import generate_ids, prompt_text
    from grpokit.models import load_model, load_tokenizer, model_source

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


def measure_kl(run_dir: Path, algorithm: str, out: Path, overrides: list[str]) -> Path:
    """Write the run's measures file: its held-out eval (already there) and its KL to the base model."""
    from grpokit import ownership
    from grpokit.config import load, validate

    recipe = validate(load(str(ALGORITHMS[algorithm]), [f"trainer.output_dir={run_dir}", *overrides]))
    seed = int(run_dir.name.split("-")[-1])
    path = Job(algorithm, seed).measures(out)
    heldout = json.loads(path.with_name(path.stem + "-eval.json").read_text())
    figures = {"algorithm": algorithm, "seed": seed, "pass@1": heldout["greedy"]["pass@1"],
               "passed": heldout["greedy"]["passed"], "prompts": heldout["prompts"],
               "examples": heldout["examples"][:2], "kl_to_reference": kl_to_reference(recipe, run_dir)}
    ownership.write_text(path, json.dumps(figures, indent=2) + "\n")
    return path


# -- the figures -----------------------------------------------------------------------------------------------


def history(run_dir: Path) -> list[dict]:
    """The run's per-step log (finished run, else its latest checkpoint's)."""
    from grpokit.reporting.plots import load_log_history

    return [h for h in load_log_history(run_dir)[1]["log_history"] if "loss" in h and "step" in h]


def series(steps: list[dict], key: str) -> list[float | None]:
    return [h.get(key) for h in steps]


def accuracy_series(steps: list[dict]) -> list[float | None]:
    """Training accuracy of what the policy generated each step (unfiltered under dynamic sampling)."""
    return [h.get(GENERATED_ACCURACY, h.get(ACCURACY)) for h in steps]


def window_mean(values: list[float | None], last: bool) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    part = kept[-WINDOW:] if last else kept[:WINDOW]
    return sum(part) / len(part) if part else None


def steps_to(values: list[float | None], threshold: float = THRESHOLD) -> int | None:
    """The first step whose WINDOW-step trailing mean reaches `threshold`; None if none does."""
    for i in range(len(values)):
        part = [v for v in values[max(0, i - WINDOW + 1) : i + 1] if v is not None]
        if len(part) == min(WINDOW, i + 1) and sum(part) / len(part) >= threshold:
            return i + 1
    return None


def summarize_run(steps: list[dict], measures: dict | None) -> dict:
    """One run's figures: per-step curves and the numbers the claims compare."""
    length = series(steps, "completions/mean_length")
    entropy = series(steps, "entropy")
    accuracy = accuracy_series(steps)
    return {
        "steps": len(steps),
        "curves": {"length": length, "entropy": entropy, "accuracy": accuracy, "kl": series(steps, "kl"),
                   "zero_spread": series(steps, "frac_reward_zero_std"),
                   "clip_high": series(steps, "clip_ratio/high_mean"), "clip_low": series(steps, "clip_ratio/low_mean")},
        "length_growth": _delta(length),
        "entropy_end": window_mean(entropy, last=True),
        "entropy_kept": _ratio(entropy),
        "steps_to_threshold": steps_to(accuracy),
        "zero_spread_mean": window_mean(series(steps, "frac_reward_zero_std"), last=True),
        "clip_high_mean": _mean(series(steps, "clip_ratio/high_mean")),
        "clip_low_mean": _mean(series(steps, "clip_ratio/low_mean")),
        "pass@1": measures and measures["pass@1"],
        "kl_to_reference": measures and measures["kl_to_reference"]["kl_k3"],
    }


def _mean(values) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _delta(values) -> float | None:
    start, end = window_mean(values, last=False), window_mean(values, last=True)
    return None if start is None or end is None else end - start


def _ratio(values) -> float | None:
    start, end = window_mean(values, last=False), window_mean(values, last=True)
    return None if not start or end is None else end / start


# -- the claims ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    key: str  # the PNG's stem and the figure compared (a summarize_run key)
    title: str
    says: str  # the claim, as docs/grpo.md and the README state it
    curve: str  # the per-step curve drawn
    ylabel: str
    claimed: str  # the algorithm the claim favours
    against: tuple[str, ...]
    higher: bool  # the claim holds when `claimed`'s figure is higher (else lower) than the others'
    figure: str  # how the compared figure is read, for the page
    caveat: str  # what else differs between the recipes compared, or why the effect may not show here


CLAIMS = (
    Claim("length_growth", "Length under per-sequence vs per-token losses",
          "per-sequence averaging (loss_type: grpo) lets completion length drift upward; the token-level losses of "
          "Dr. GRPO and DAPO remove that bias", "length", "mean completion length (tokens)", "grpo",
          ("dr_grpo", "dapo"), True, f"growth of the mean completion length, last {WINDOW} steps minus first {WINDOW}",
          "DAPO also adds the overlong penalty, which pushes length down on its own; Dr. GRPO also drops the std"),
    Claim("entropy_kept", "Entropy with and without clip-higher",
          "clip-higher (epsilon_high 0.28 > epsilon 0.2) keeps the policy's entropy from collapsing", "entropy",
          "mean token entropy (nats)", "dapo", ("grpo",), True,
          f"entropy kept: mean of the last {WINDOW} steps over the first {WINDOW}",
          "the DAPO recipe changes more than the clip (token-level loss, dynamic sampling, overlong penalty); the "
          "clip acts only on the off-policy second step of each generation"),
    Claim("steps_to_threshold", "Steps to a training accuracy with and without dynamic sampling",
          "dynamic sampling (drop all-right / all-wrong groups, refill) reaches a reward in fewer steps", "accuracy",
          "training accuracy of the step's generated completions", "dapo", ("grpo",), False,
          f"first step whose {WINDOW}-step mean training accuracy reaches {THRESHOLD}",
          "dynamic sampling generates more per step (up to 2 rounds), so fewer steps is not less compute; the DAPO "
          "recipe also differs in its loss and clip"),
    Claim("kl_to_reference", "Distance from the base model with and without a KL term",
          "a KL term (beta 0.04) holds the policy near the reference", "kl", "KL to the base model", "grpo_kl",
          ("grpo",), False, "KL[pi_theta || pi_ref] after training (k3, the trained policy's greedy held-out completions)",
          "beta 0.04 is DeepSeekMath's value; over a short run the policy moves little either way"),
)


def spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def verdict(claim: Claim, figures: dict[str, list[float]]) -> dict:
    """Whether the claim held here: `held` when every seed of the favoured algorithm beats every seed of each other,
    `leans` when only the means do, `not shown` otherwise (or `no data`); with the difference of means and the
    seed spread (sample standard deviation) of each side."""
    mine = [v for v in figures.get(claim.claimed, []) if v is not None]
    sign = 1 if claim.higher else -1
    rows, states = [], []
    for other in claim.against:
        theirs = [v for v in figures.get(other, []) if v is not None]
        if not mine or not theirs:
            rows.append({"against": other, "state": "no data"})
            states.append("no data")
            continue
        diff = sum(mine) / len(mine) - sum(theirs) / len(theirs)
        if sign * min(mine, key=lambda v: sign * v) > sign * max(theirs, key=lambda v: sign * v):
            state = "held"
        elif sign * diff > 0:
            state = "leans"
        else:
            state = "not shown"
        rows.append({"against": other, "state": state, "difference": diff, "seeds": (len(mine), len(theirs)),
                     "spread": (spread(mine), spread(theirs))})
        states.append(state)
    overall = next(s for s in ("no data", "not shown", "leans", "held") if s in states)
    return {"claim": claim.key, "state": overall, "comparisons": rows}


def sentence(claim: Claim, result: dict) -> str:
    parts = []
    for row in result["comparisons"]:
        if row["state"] == "no data":
            parts.append(f"against {row['against']}: no runs yet")
            continue
        (n1, n2), (s1, s2) = row["seeds"], row["spread"]
        parts.append(f"{claim.claimed} minus {row['against']}: {row['difference']:+.3g} "
                     f"(seed spread ±{s1:.2g} / ±{s2:.2g}, {n1} and {n2} seeds): {row['state']}")
    word = {"held": "Held here", "leans": "Leans the claimed way, within the seed spread",
            "not shown": "Not shown at this scale", "no data": "Not measured yet"}[result["state"]]
    return f"**{word}.** {claim.figure}: " + "; ".join(parts) + "."


# -- writing ---------------------------------------------------------------------------------------------------


def collect(jobs: list[Job], runs: Path, out: Path) -> dict[str, list[dict]]:
    """Per algorithm, the summary of each run that has a trainer state (measured or not yet)."""
    found: dict[str, list[dict]] = {}
    for job in jobs:
        run_dir = job.run_dir(runs)
        try:
            steps = history(run_dir)
        except (ValueError, FileNotFoundError):
            continue
        measures = json.loads(job.measures(out).read_text()) if job.measures(out).is_file() else None
        found.setdefault(job.algorithm, []).append({"seed": job.seed, "finished": finished(job, runs),
                                                    **summarize_run(steps, measures)})
    return found


def plot_claim(claim: Claim, results: dict[str, list[dict]], path: Path) -> None:
    """The claim's curve per algorithm: the mean over seeds, a band from the lowest to the highest seed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5))
    ax = fig.add_subplot()
    for algorithm in (claim.claimed, *claim.against):
        curves = [r["curves"][claim.curve] for r in results.get(algorithm, [])]
        curves = [[v for v in c] for c in curves if any(v is not None for v in c)]
        if not curves:
            continue
        n = min(len(c) for c in curves)
        columns = [[c[i] for c in curves if c[i] is not None] for i in range(n)]
        steps = [i + 1 for i, col in enumerate(columns) if col]
        mean = [sum(col) / len(col) for col in columns if col]
        line = ax.plot(steps, mean, label=f"{algorithm} (mean of {len(curves)} seeds)")[0]
        ax.fill_between(steps, [min(col) for col in columns if col], [max(col) for col in columns if col],
                        color=line.get_color(), alpha=0.2)
    if claim.curve == "accuracy":
        ax.axhline(THRESHOLD, color="grey", linestyle=":", label=f"threshold {THRESHOLD}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(claim.ylabel)
    ax.set_title(f"{claim.title}\n(band: lowest to highest seed)", fontsize=10)
    if ax.lines:
        ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: Path) -> None:
    import io

    from grpokit import ownership

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    ownership.replace_text(path, buffer.getvalue())


def _cell(values: list, digits: int = 3) -> str:
    kept = [v for v in values if v is not None]
    if not kept:
        return "–"
    mean = sum(kept) / len(kept)
    return f"{mean:.{digits}g} ± {spread(kept):.2g}" if len(kept) > 1 else f"{mean:.{digits}g}"


TABLE = (("pass@1", "held-out pass@1 after"), ("length_growth", "length growth"), ("entropy_end", "entropy (end)"),
         ("entropy_kept", "entropy kept"), ("clip_high_mean", "clip high"), ("clip_low_mean", "clip low"),
         ("zero_spread_mean", "zero-spread groups (end)"), ("kl_to_reference", "KL to base"),
         ("steps_to_threshold", f"steps to accuracy {THRESHOLD}"))


def table(results: dict[str, list[dict]], base: dict | None) -> list[str]:
    head = "| algorithm | seeds | " + " | ".join(label for _, label in TABLE) + " |"
    lines = [head, "|" + "---|" * (len(TABLE) + 2)]
    for algorithm in ALGORITHMS:
        rows = results.get(algorithm, [])
        if rows:
            cells = [_cell([r[key] for r in rows]) for key, _ in TABLE]
            lines.append(f"| {algorithm} | {len(rows)} | " + " | ".join(cells) + " |")
    if base:
        lines.append(f"\nBase model, held-out greedy pass@1: {base['greedy']['pass@1']:.3f} "
                     f"({base['greedy']['passed']}/{base['prompts']}). Cells: mean ± sample standard deviation over "
                     "seeds; a step never reaching the threshold leaves that seed out of its cell.")
    return lines


def write_report(jobs: list[Job], runs: Path, out: Path, command: str) -> dict:
    from grpokit import ownership

    results = collect(jobs, runs, out)
    base_path = out / "measures" / "base-eval.json"
    base = json.loads(base_path.read_text()) if base_path.is_file() else None
    verdicts = []
    for claim in CLAIMS:
        figures = {a: [r[claim.key] for r in rows] for a, rows in results.items()}
        result = verdict(claim, figures)
        verdicts.append({**result, "sentence": sentence(claim, result)})
        plot_claim(claim, results, out / f"claim-{claim.key}.png")
    lab = {"command": command, "recipes": {a: str(p.relative_to(ROOT)) for a, p in ALGORITHMS.items()},
           "measured": __doc__.split("Measured per run, after training")[1].split("Writes")[0].strip(),
           "window": WINDOW, "threshold": THRESHOLD, "base": base and base["greedy"], "runs": results,
           "verdicts": verdicts}
    ownership.replace_text(out / "lab.json", json.dumps(lab, indent=1) + "\n")
    rows = table(results, base)
    ownership.replace_text(out / "table.md", "\n".join(rows) + "\n")
    ownership.replace_text(out / "README.md", page(command, rows, verdicts, results))
    return lab


def page(command: str, rows: list[str], verdicts: list[dict], results: dict) -> str:
    done = sum(len(v) for v in results.values())
    lines = ["# The chapter's claims on SmolLM2-135M-Instruct", "",
             "Written by `labs/algorithms.py` from the runs it measured; do not edit by hand. Command:", "",
             f"    {command}", "", f"{done} runs of {len(ALGORITHMS)} recipes (recipes/smollm2-135m/lab/); "
             "what each number is: the lab's docstring and `lab.json`.", "", "## Every run", "", *rows, ""]
    for claim, result in zip(CLAIMS, verdicts):
        lines += [f"## {claim.title}", "", f"Claim: {claim.says}.", "", f"![{claim.key}](claim-{claim.key}.png)", "",
                  result["sentence"], "", f"What else differs, or why it may not show here: {claim.caveat}.", ""]
    return "\n".join(lines)


# -- command line ----------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=list(ALGORITHMS))
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (default 2: one per core here)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe override for every run (e.g. trainer.max_steps=4)")
    parser.add_argument("--out", type=Path, default=OUT, help="results folder (default bench/results/lab)")
    parser.add_argument("--report-only", action="store_true", help="write the figures from the runs there are")
    parser.add_argument("--measure-kl", type=Path, metavar="RUN", help=argparse.SUPPRESS)  # one job's KL, in its own process
    opts = parser.parse_args(argv)
    if opts.parallel < 1:
        parser.error("--parallel must be at least 1")
    out = opts.out.resolve()
    if opts.measure_kl:
        print(f"wrote {measure_kl(opts.measure_kl, opts.algorithms[0], out, opts.set)}")
        return 0
    runs = out / "runs"
    jobs = [Job(a, s) for s in opts.seeds for a in opts.algorithms]  # seed-major: every algorithm has a seed early
    failures = [] if opts.report_only else run_all(jobs, runs, out, opts.set, opts.parallel)
    command = "python labs/algorithms.py " + " ".join(argv if argv is not None else sys.argv[1:])
    all_jobs = [Job(a, s) for a in ALGORITHMS for s in sorted({*opts.seeds, *SEEDS})]
    lab = write_report(all_jobs, runs, out, command.strip())
    for v in lab["verdicts"]:
        print(f"{v['claim']}: {v['state']}")
    print(f"wrote {out / 'README.md'}, {out / 'table.md'}, {out / 'lab.json'} and {len(CLAIMS)} PNGs")
    for failure in failures:
        print(f"failed: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
