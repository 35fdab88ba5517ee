"""Benchmark: grpokit's `accuracy` against math-verify `parse` + `verify` per sample (TRL's and open-r1's way).

    python bench/rewards.py            # 10,000 GSM8K-style samples, then 1,000 LaTeX ones, then hard batches
    python bench/rewards.py --n 2000   # quicker
    python bench/rewards.py --n 0 --n-latex 0   # only the hard batches (power towers that time out)

Prints figures; it is not a test. Everything is synthetic and built here (no download): GSM8K-style
gold solutions ending in `#### N`, and completions that reason for a few lines and then give an answer
in one of the formats models actually use, right about 60% of the time. The baseline gets the reduced
gold (`N`), as a GSM8K recipe would feed it, and calls math-verify exactly as `trl.rewards.accuracy_reward`
does on the main thread (same extraction config, same timeouts).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rewards.math import Accuracy, extract_answer  # noqa: E402

NAMES = ["Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy"]
THINGS = ["clips", "dollars", "pages", "cookies", "miles", "apples", "tickets", "stamps"]


def gsm8k_sample(rng: random.Random) -> tuple[str, str, str, str]:
    """(gold solution, reduced gold, completion, answer format)."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 60), rng.randint(1, 500)
    answer = a * b + c if rng.random() < 0.5 else a * b * rng.choice([1, 10, 100]) + c
    who, what = rng.choice(NAMES), rng.choice(THINGS)
    solution = (
        f"{who} had {a} boxes of {b} {what}, so {a}*{b} = <<{a}*{b}={a * b}>>{a * b} {what}.\n"
        f"Then {who} got {c} more, so {a * b}+{c} = <<{a * b}+{c}={answer}>>{answer}.\n#### {answer}"
    )
    given = answer if rng.random() < 0.6 else answer + rng.choice([-10, -1, 1, 2, 100])
    reasoning = (
        f"Let me work this out. {who} starts with {a} boxes and each box holds {b} {what}. "
        f"Multiplying, {a} times {b} gives {a * b}. Adding the extra {c} {what} gives the total. "
    ) * rng.randint(1, 3)
    fmt = rng.choices(
        ["boxed", "boxed_sep", "boxed_dollar", "boxed_decimal", "hashes", "answer_tag"],
        weights=[55, 10, 5, 5, 15, 10],
    )[0]
    shown = {
        "boxed": rf"\boxed{{{given}}}",
        "boxed_sep": rf"\boxed{{{given:,}}}",
        "boxed_dollar": rf"\boxed{{\${given}}}",
        "boxed_decimal": rf"\boxed{{{given}.00}}",
        "hashes": f"#### {given}",
        "answer_tag": f"<answer>{given}</answer>",
    }[fmt]
    tail = f"The final answer is {shown}." if fmt.startswith("boxed") else shown
    return solution, str(answer), reasoning + tail, fmt


def latex_sample(rng: random.Random) -> tuple[str, str, str, str]:
    n = rng.choice([2, 3, 5, 6, 7, 10, 11])
    k = rng.randint(2, 9)
    gold = rf"${k}\sqrt{{{n}}}$"  # with delimiters, as MATH-style solutions come: math-verify needs them
    given = rf"\sqrt{{{k * k * n}}}" if rng.random() < 0.6 else rf"{k + 1}\sqrt{{{n}}}"
    return gold, gold, f"Simplifying the radical, the answer is $\\boxed{{{given}}}$.", "latex"


def trl_accuracy(gold: str, completion: str) -> float | None:
    """`trl.rewards.accuracy_reward` for one sample, main-thread branch, without importing torch."""
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify

    gold_parsed = parse(gold, parsing_timeout=10)
    if not gold_parsed:
        return None
    answer_parsed = parse(
        completion,
        extraction_config=[LatexExtractionConfig(normalization_config=NormalizationConfig(units=True),
                                                 boxed_match_priority=0, try_extract_without_anchor=False)],
        extraction_mode="first_match",
        parsing_timeout=10,
    )
    return float(verify(gold_parsed, answer_parsed, timeout_seconds=5))


def run(label: str, samples, batch: int) -> None:
    golds_full = [s[0] for s in samples]
    golds = [s[1] for s in samples]
    completions = [s[2] for s in samples]
    formats = [s[3] for s in samples]

    reward = Accuracy()
    reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"])  # start the worker pool outside the timing
    trl_accuracy("1", r"\boxed{1}")  # import math-verify and warm its caches outside the timing

    start = time.perf_counter()
    ours: list = []
    for i in range(0, len(samples), batch):
        ours += reward(completions=completions[i : i + batch], answer=golds_full[i : i + batch])
    t_ours = time.perf_counter() - start

    start = time.perf_counter()
    theirs = [trl_accuracy(g, c) for g, c in zip(golds, completions)]
    t_theirs = time.perf_counter() - start

    n = len(samples)
    print(f"\n== {label}: {n:,} samples, accuracy called in batches of {batch}")
    print(f"grpokit accuracy        {t_ours:8.2f} s   {n / t_ours:10,.0f} samples/s")
    print(f"math-verify per sample  {t_theirs:8.2f} s   {n / t_theirs:10,.0f} samples/s")
    print(f"speed-up                {t_theirs / t_ours:8.1f}x")
    print(f"mean reward             grpokit {sum(v or 0 for v in ours) / n:.3f}   "
          f"math-verify {sum(v or 0 for v in theirs) / n:.3f}")
    disagree = [i for i in range(n) if ours[i] != theirs[i]]
    print(f"verdicts that differ    {len(disagree):,} of {n:,}")
    per_format = Counter(formats)
    differ = Counter(formats[i] for i in disagree)
    print("  by answer format:     " + ", ".join(f"{f} {differ[f]}/{c}" for f, c in sorted(per_format.items())))
    by_kind = Counter((formats[i], ours[i], theirs[i]) for i in disagree)
    for (fmt, a, b), count in by_kind.most_common():
        print(f"  {count:6,}  answer format {fmt!r}: grpokit {a}, math-verify {b}  ({WHY.get(fmt, 'see samples')})")
    rng = random.Random(1)
    for i in rng.sample(disagree, min(3, len(disagree))):
        print(f"  e.g. gold {golds[i]!r}, answer {extract_answer(completions[i])!r} "
              f"(...{completions[i][-60:]!r}): grpokit {ours[i]}, math-verify {theirs[i]}")


def hard_batches(copies: int) -> None:
    """Batches of answers that make sympy compute a bignum power: every check runs into the time limit.

    Issue 13 measured 64 copies of one tower at 48-54 s (each timeout killed a worker and its replacement
    re-imported sympy, one after another). Now identical checks run once per call and a replacement is a
    warm fork; distinct towers still cost one time limit each, `workers` at a time.
    """
    import os

    reward = Accuracy()  # timeout 1.0 s, 2 workers: the defaults a recipe gets
    reward(completions=[r"\boxed{\sqrt{4}}"], answer=["2"])  # start the pool outside the timing
    print(f"\n== hard answers: accuracy(timeout={reward.timeout} s, workers={reward.workers}), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    cases = [
        (f"{copies} copies of \\boxed{{9^{{9^{{9^{{9}}}}}}}}", [r"\boxed{9^{9^{9^{9}}}}"] * copies),
        (f"{copies // 8} distinct towers", [rf"\boxed{{{b}^{{{b}^{{{b}^{{{b}}}}}}}}}" for b in range(3, 3 + copies // 8)]),
    ]
    for label, completions in cases:
        start = time.perf_counter()
        out = reward(completions=completions, answer=["42"] * len(completions))
        took = time.perf_counter() - start
        print(f"{label:34s} {took:6.2f} s   verdicts {dict(Counter(out))}")
    # After the timeouts the pool is whole again, and warm: a plain LaTeX check right after is quick.
    start = time.perf_counter()
    reward(completions=[r"\boxed{\sqrt{9}}", r"\boxed{\sqrt{16}}"], answer=["3", "4"])
    print(f"{'next call (2 easy LaTeX checks)':34s} {time.perf_counter() - start:6.2f} s")


def replacement_cost(rounds: int = 3) -> None:
    """Why the pool forks its workers from a warm zygote: a worker past its limit is killed, and what replaces it
    costs either a fork (the zygote has imported and warmed math-verify) or, without a zygote, a new process
    importing it -- what a fresh cage's first verdict costs."""
    import statistics

    from grpokit.untrusted.pool import Pool
    from rewards.math import MATH_VERIFY

    easy, tower = [["\\boxed{2}"], ["\\boxed{\\sqrt{4}}"]], [["\\boxed{42}"], ["\\boxed{9^{9^{9^{9}}}}"]]
    cold, warm = [], []
    for _ in range(rounds):
        pool = Pool(MATH_VERIFY, 1)
        start = time.perf_counter()
        pool.run([easy], 30)
        cold.append(time.perf_counter() - start)
        for _ in range(3):
            pool.run([tower], 0.3)  # killed at its limit: the worker is replaced
            start = time.perf_counter()
            pool.run([easy], 30)
            warm.append(time.perf_counter() - start)
        pool.close()
    print(f"{'a verdict from a new cage (cold)':34s} {statistics.median(cold):6.2f} s   (median of {len(cold)})")
    print(f"{'the next verdict after a timeout':34s} {statistics.median(warm):6.2f} s   (warm fork; median of {len(warm)})")


WHY = {
    "hashes": "math-verify's LaTeX extraction does not read GSM8K's '#### N' marker, so it finds no answer",
    "answer_tag": "math-verify's LaTeX extraction does not read <answer> tags without $...$ around the number",
}


def code_throughput(n: int, batch: int = 64) -> None:
    """code_tests candidates per second: code20's reference solutions and broken copies (half pass, half
    fail every assert), 3 asserts each, scored `batch` at a time (64 = 8 prompts x 8 completions)."""
    import json
    import os
    import resource

    from grpokit.untrusted import isolation
    from rewards.code import CodeTests

    rows = [json.loads(line) for line in (Path(__file__).resolve().parent.parent / "grpokit/assets/code20.jsonl").open()]
    completions, tests = [], []
    for i in range(n):
        row = rows[i % len(rows)]
        broken = "" if i % 2 == 0 else "\nimport builtins\nbuiltins.__dict__.clear()\n"  # every assert then raises
        completions.append(f"```python\n{row['solution']}{broken}```")
        tests.append(row["tests"])
    reward = CodeTests()
    cpu = lambda: sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)  # noqa: E731
                      for f in ("ru_utime", "ru_stime"))
    cpu0, start = cpu(), time.perf_counter()
    scores = [s for k in range(0, n, batch) for s in reward(completions=completions[k : k + batch], tests=tests[k : k + batch])]
    took, cpu_each = time.perf_counter() - start, (cpu() - cpu0) / n
    print(f"\ncode_tests: {n} candidates x 3 asserts, {batch} per call, workers={reward.workers}, {os.cpu_count()} cores")
    print(f"  {n / took:.1f} candidates/s ({took:.2f} s; {took / n * 1000:.1f} ms each); passed {sum(scores):.0f} of {n}")
    # CPU per candidate (this process and every sandbox process) does not move with other jobs' load.
    print(f"  {cpu_each * 1000:.1f} ms CPU per candidate -> at most {os.cpu_count() / cpu_each:.0f} candidates/s on idle cores")
    print(f"  sandbox layers: {', '.join(sorted(isolation()))}")


def task_throughput(rounds: int = 7) -> None:
    """task_score per scored completion, warm: 64 completions a call (16 problems x 4 answers, 48 distinct jobs, a
    third of them the gold) on chain_sum (a plain compare) and countdown (its scorer evaluates the answer with sympy's
    parse_expr, in the cage); the median of `rounds` calls. Then one answer that runs code on countdown: the worker
    that ran it is replaced (a warm fork), and the next call's time says what that costs."""
    import os
    import statistics

    import rewards
    from grpokit.prompts import tasks

    reward = rewards.build("task_score")
    print(f"\n== task_score, warm, 64 completions a call, workers={reward.fn.workers}, {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at start")
    for name, config in (("chain_sum", {}), ("countdown", {"min_numbers": 3, "max_numbers": 3})):
        source, problems = tasks.check_source({"tasks": [{"name": name, "config": config}], "size": 16, "seed": 1})
        rows = tasks.generate(source).rows
        completions = [f"<think>so</think><answer>{r['answer'] if k % 2 else k}</answer>" for k in range(4) for r in rows]
        items = [r["task_item"] for _ in range(4) for r in rows]
        reward(completions=completions, task_item=items)  # workers up, problems built: outside the timing
        took = []
        for _ in range(rounds):
            start = time.perf_counter()
            reward(completions=completions, task_item=items)
            took.append(time.perf_counter() - start)
        print(f"  {name:10s} {statistics.median(took) / len(completions) * 1000:6.3f} ms per scored completion "
              f"(median of {rounds} calls; min {min(took) / len(completions) * 1000:.3f})")
    hack = "<answer>__import__('os').getpid() or 1</answer>"
    start = time.perf_counter()
    reward(completions=[hack], task_item=[items[0]])
    after = time.perf_counter()
    reward(completions=["<answer>1 + 2</answer>"], task_item=[items[0]])
    print(f"  an answer that runs code: {(after - start) * 1000:.1f} ms; the next call, on the worker that replaced its "
          f"worker: {(time.perf_counter() - after) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--n", type=int, default=10_000, help="GSM8K-style samples (default 10,000)")
    parser.add_argument("--n-latex", type=int, default=1_000, help="LaTeX-answer samples that need math-verify")
    parser.add_argument("--batch", type=int, default=256, help="completions per accuracy call")
    parser.add_argument("--hard", type=int, default=64, help="copies of a power tower in the hard batch (0: skip)")
    parser.add_argument("--code", type=int, default=256, help="code_tests candidates for the throughput figure (0: skip)")
    parser.add_argument("--tasks", type=int, default=7, help="task_score calls timed per task (0: skip)")
    args = parser.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    rng = random.Random(0)
    if args.n:
        run("GSM8K-style, plain numeric answers", [gsm8k_sample(rng) for _ in range(args.n)], args.batch)
    if args.n_latex:
        run("LaTeX radicals (every one goes to math-verify)", [latex_sample(rng) for _ in range(args.n_latex)], args.batch)
    if args.hard:
        hard_batches(args.hard)
        replacement_cost()
    if args.code:
        code_throughput(args.code)
    if args.tasks:
        task_throughput(args.tasks)


if __name__ == "__main__":
    main()
