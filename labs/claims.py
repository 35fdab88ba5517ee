"""The chapter's claims and how the lab judges them: per-run figures, verdicts from the seed spread, the figures.

Pure functions of the runs' per-step logs (trainer_state.json's log_history) and measures, so they are tested on
made-up logs; labs/algorithms.py runs the lab and calls them.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

WINDOW = 5  # logged points averaged at the start and at the end of a run (one point's completions are noisy);
# a generation's figures (length, accuracy, zero-spread share) come once per generation, every 2nd step in the lab
THRESHOLD = 0.75  # training accuracy (the last WINDOW generations' mean) that counts as "reached"; set before any run
# (the additions lab's; a lab on another task sets its own, also before any run: labs/algorithms.py's LABS)
PASS_REWARD = "accuracy"  # the reward whose training mean is "accuracy" (a task lab's: task_score)
ACCURACY = f"rewards/{PASS_REWARD}/mean"


def series(steps: list[dict], key: str) -> list[float | None]:
    return [h.get(key) for h in steps]


def accuracy_series(steps: list[dict], reward: str = PASS_REWARD) -> list[float | None]:
    """Training accuracy (the mean of `reward`) of what the policy generated each step, unfiltered under dynamic
    sampling: there the trained batch holds only groups with a spread, so its accuracy is biased toward 1/2, and
    the accuracy of everything generated in a step is logged apart (grpokit/trainer/dynamic_sampling.py)."""
    trained, generated = f"rewards/{reward}/mean", f"sampling/generated/rewards/{reward}/mean"
    return [h.get(generated, h.get(trained)) for h in steps]


def window_mean(values: list[float | None], last: bool) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    part = kept[-WINDOW:] if last else kept[:WINDOW]
    return sum(part) / len(part) if part else None


def steps_to(values: list[float | None], threshold: float = THRESHOLD) -> int | None:
    """The first step whose trailing mean over the last WINDOW logged points (fewer at the start) reaches
    `threshold`; None if none does. Steps without a logged point (a generation's figures come once per
    generation) neither count in the window nor end it."""
    logged: list[float] = []
    for i, value in enumerate(values):
        if value is None:
            continue
        logged.append(value)
        part = logged[-WINDOW:]
        if sum(part) / len(part) >= threshold:
            return i + 1
    return None


def summarize_run(steps: list[dict], measures: dict | None, reward: str = PASS_REWARD,
                  threshold: float = THRESHOLD) -> dict:
    """One run's figures: per-step curves and the numbers the claims compare (accuracy: the mean of `reward`)."""
    length = series(steps, "completions/mean_length")
    entropy = series(steps, "entropy")
    accuracy = accuracy_series(steps, reward)
    return {
        "steps": len(steps),
        "curves": {"length": length, "entropy": entropy, "accuracy": accuracy, "kl": series(steps, "kl"),
                   "zero_spread": series(steps, "frac_reward_zero_std"),
                   "clip_high": series(steps, "clip_ratio/high_mean"), "clip_low": series(steps, "clip_ratio/low_mean")},
        "length_growth": _delta(length),
        "entropy_end": window_mean(entropy, last=True),
        "entropy_kept": _ratio(entropy),
        "steps_to_threshold": steps_to(accuracy, threshold),
        "zero_spread_mean": window_mean(series(steps, "frac_reward_zero_std"), last=True),
        "clip_high_mean": _mean(series(steps, "clip_ratio/high_mean")),
        "clip_low_mean": _mean(series(steps, "clip_ratio/low_mean")),
        "pass@1": measures and measures["pass@1"],
        "kl_to_reference": measures and measures["kl_to_reference"]["kl_k3"],
    }


def _mean(values) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def ends(values) -> tuple[float | None, float | None]:
    """The mean of the first WINDOW logged points and of the last WINDOW."""
    return window_mean(values, last=False), window_mean(values, last=True)


def _delta(values) -> float | None:
    start, end = ends(values)
    return None if start is None or end is None else end - start


def _ratio(values) -> float | None:
    start, end = ends(values)
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
    censored: bool = False  # the figure is a first step: a run without one never reached it (see verdict's censor)


def claims_for(threshold: float) -> tuple[Claim, ...]:
    """The four claims, the steps-to-threshold one reading `threshold` (each lab sets its own before any run)."""
    return (
        Claim("length_growth", "Length under per-sequence vs per-token losses",
              "per-sequence averaging (loss_type: grpo) lets completion length drift upward; the token-level losses of "
              "Dr. GRPO and DAPO remove that bias", "length", "mean completion length (tokens)", "grpo",
              ("dr_grpo", "dapo"), True,
              f"growth of the mean completion length, last {WINDOW} generations minus first {WINDOW}",
              "DAPO also adds the overlong penalty, which pushes length down on its own; Dr. GRPO also drops the std; and "
              "where every loss shortens the completions (a model learning to stop after its answer), there is no upward "
              "drift for a token-level loss to remove"),
        Claim("entropy_kept", "Entropy with and without clip-higher",
              "clip-higher (epsilon_high 0.28 > epsilon 0.2) keeps the policy's entropy from collapsing", "entropy",
              "mean token entropy (nats)", "dapo", ("grpo",), True,
              f"entropy kept: mean of the last {WINDOW} steps over the first {WINDOW}",
              "the DAPO recipe changes more than the clip (token-level loss, dynamic sampling, overlong penalty); the "
              "clip acts only on the off-policy second step of each generation"),
        Claim("steps_to_threshold", "Steps to a training accuracy with and without dynamic sampling",
              "dynamic sampling (drop all-right / all-wrong groups, refill) reaches a reward in fewer steps", "accuracy",
              "training accuracy of the step's generated completions", "dapo", ("grpo",), False,
              f"first step at which the mean training accuracy of the last {WINDOW} generations reaches {threshold}",
              "dynamic sampling generates more per step (up to 2 rounds), so fewer steps is not less compute; the DAPO "
              "recipe also differs in its loss and clip", censored=True),
        Claim("kl_to_reference", "Distance from the base model with and without a KL term",
              "a KL term (beta 0.04) holds the policy near the reference", "kl", "KL to the base model", "grpo_kl",
              ("grpo",), False,
              "KL[pi_theta || pi_ref] after training (k3, the trained policy's greedy held-out completions)",
              "beta 0.04 is DeepSeekMath's value: its pull is 0.04 x the KL per token, small beside advantages of "
              "order 1 (divided by the group's std), so over 30 steps it can slow the drift from the base model more "
              "than stop it"),
    )


CLAIMS = claims_for(THRESHOLD)  # the additions lab's


def spread(values: list[float]) -> float:
    """The sample standard deviation, 0 under two values; exact (statistics works in fractions), so equal seeds
    have none rather than a float's rounding error."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


MIN_SEEDS = 3  # seeds a side before a verdict: one or two seeds give no spread to judge a difference by
# The page's states, most telling first: the overall verdict of a claim is the first of these that any comparison has.
STATES = ("no data", "never reached", "too few seeds", "not shown", "leans", "held")


def seed_figures(figures: dict[str, list[float | None]], censor: float | None = None) -> dict[str, dict]:
    """Per algorithm, its seeds' figures as a verdict compares them: those it has (`reached`), how many seeds lack it
    yet count as step `censor` (`never`: only when some seed of these algorithms reached it, see `verdict`), and the
    figures compared (`compared`: the reached ones and `censor` once for each of those)."""
    counted = censor is not None and any(v is not None for values in figures.values() for v in values)
    sides = {}
    for algorithm, values in figures.items():
        reached = [v for v in values if v is not None]
        never = values.count(None) if counted else 0
        sides[algorithm] = {"reached": reached, "never": never, "compared": reached + [censor] * never}
    return sides


def verdict(claim: Claim, figures: dict[str, list[float | None]], censor: float | None = None) -> dict:
    """Whether the claim held here: `held` when every seed of the favoured algorithm beats every seed of each other,
    `leans` when only the means do, `not shown` otherwise; `too few seeds` under MIN_SEEDS a side, `never reached`
    when a side's runs have no figure (a threshold no seed reached), `no data` without runs. With the difference of
    means and the seed spread (sample standard deviation) of each side.

    `censor` is for a claim whose figure is a first step (`Claim.censored`): a seed without one never reached it
    within its run and counts as step `censor`, past every run, so a side that reached it beats one that never did,
    and two seeds that never did tie. Only when no seed of either side reached it is the comparison `never reached`."""
    sign = 1 if claim.higher else -1
    rows, states = [], []
    for other in claim.against:
        given = {claim.claimed: figures.get(claim.claimed, []), other: figures.get(other, [])}
        if not all(given.values()):
            rows.append({"against": other, "state": "no data"})
            states.append("no data")
            continue
        sides = seed_figures(given, censor)
        reached = {a: len(side["reached"]) for a, side in sides.items()}
        mine, theirs = (side["compared"] for side in sides.values())
        if not mine or not theirs:
            rows.append({"against": other, "state": "never reached", "without": [a for a, n in reached.items() if not n]})
            states.append("never reached")
            continue
        diff = sum(mine) / len(mine) - sum(theirs) / len(theirs)
        if min(len(mine), len(theirs)) < MIN_SEEDS:
            state = "too few seeds"
        elif sign * min(mine, key=lambda v: sign * v) > sign * max(theirs, key=lambda v: sign * v):
            state = "held"
        elif sign * diff > 0:
            state = "leans"
        else:
            state = "not shown"
        row = {"against": other, "state": state, "difference": diff, "seeds": (len(mine), len(theirs)),
               "spread": (spread(mine), spread(theirs))}
        if censor is not None:
            row.update(censor=censor, reached=(reached[claim.claimed], reached[other]))
        rows.append(row)
        states.append(state)
    overall = next(s for s in STATES if s in states)
    return {"claim": claim.key, "state": overall, "comparisons": rows}


def sentence(claim: Claim, result: dict) -> str:
    parts = []
    for row in result["comparisons"]:
        if row["state"] == "no data":
            parts.append(f"against {row['against']}: no runs yet")
            continue
        if row["state"] == "never reached":
            parts.append(f"against {row['against']}: no seed of {' or '.join(row['without'])} reached it within its run")
            continue
        (n1, n2), (s1, s2) = row["seeds"], row["spread"]
        state = f"a verdict needs at least {MIN_SEEDS} seeds a side" if row["state"] == "too few seeds" else row["state"]
        reached = ""
        if "censor" in row:
            reached = (f"; {claim.claimed} reached it in {row['reached'][0]} of {n1} seeds, {row['against']} in "
                       f"{row['reached'][1]} of {n2}; a seed that never reached it counts as step {row['censor']:g}")
        parts.append(f"{claim.claimed} minus {row['against']}: {row['difference']:+.3g} "
                     f"(seed spread ±{s1:.2g} / ±{s2:.2g}, {n1} and {n2} seeds{reached}): {state}")
    word = {"held": "Held here", "leans": "Leans the claimed way, within the seed spread",
            "not shown": "Not shown at this scale", "never reached": "Not shown at this scale",
            "too few seeds": "Not judged yet: too few seeds", "no data": "Not measured yet"}[result["state"]]
    return f"**{word}.** {claim.figure}: " + "; ".join(parts) + "."


def curve_summary(claim: Claim, results: dict[str, list[dict]]) -> str:
    """What the drawn curves did, in numbers: per algorithm, the mean over seeds of the first WINDOW logged points
    and of the last WINDOW, so the page says which way every curve went, not only the difference the claim reads."""
    parts = []
    for algorithm in (claim.claimed, *claim.against):
        pairs = [ends(r["curves"][claim.curve]) for r in results.get(algorithm, [])]
        pairs = [(start, end) for start, end in pairs if start is not None and end is not None]
        if not pairs:
            parts.append(f"{algorithm} not logged" if results.get(algorithm) else f"{algorithm} no runs")
            continue
        start, end = (sum(column) / len(pairs) for column in zip(*pairs))
        parts.append(f"{algorithm} {start:.3g} → {end:.3g} ({len(pairs)} seeds)")
    return f"The curves, {claim.ylabel}, first {WINDOW} logged points → last {WINDOW} (mean over seeds): " + "; ".join(parts) + "."


def compared_seeds(claim: Claim, results: dict[str, list[dict]], censor: float | None = None) -> dict[str, dict]:
    """Per algorithm of the claim, what its dots show: `seed_figures`' `reached` and `never` over the claim's
    algorithms, and the `mean` the verdict compares (None when nothing is compared)."""
    sides = seed_figures({a: [r[claim.key] for r in results.get(a, [])] for a in (claim.claimed, *claim.against)}, censor)
    return {a: {"reached": side["reached"], "never": side["never"],
                "mean": sum(side["compared"]) / len(side["compared"]) if side["compared"] else None}
            for a, side in sides.items()}


def plot_claim(claim: Claim, results: dict[str, list[dict]], path: Path, threshold: float = THRESHOLD,
               censor: float | None = None) -> None:
    """Left, the claim's curve per algorithm: the mean over seeds, a band from the lowest to the highest seed.
    Right, the figure the verdict compares: one dot per seed, a bar at the mean (a curve some algorithm does not
    log, such as TRL's KL without a KL term, still has its compared figure here); with `censor`, a seed that never
    reached a first step is drawn hollow at the step the verdict counts it as."""
    import textwrap

    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4.5))
    ax, dots = fig.subplots(1, 2, gridspec_kw={"width_ratios": (3, 1)})
    algorithms = (claim.claimed, *claim.against)
    compared = compared_seeds(claim, results, censor)
    for i, algorithm in enumerate(algorithms):
        _plot_curve(ax, claim, results.get(algorithm, []), algorithm, f"C{i}")
        seeds = compared.get(algorithm)
        if seeds and seeds["mean"] is not None:
            dots.scatter([i] * len(seeds["reached"]), seeds["reached"], color=f"C{i}", zorder=3)
            dots.scatter([i] * seeds["never"], [censor] * seeds["never"], facecolors="none", edgecolors=f"C{i}", zorder=3)
            dots.hlines(seeds["mean"], i - 0.3, i + 0.3, color=f"C{i}")
        elif results.get(algorithm):
            dots.annotate("none\nreached" if claim.censored else "none", (i, 0.5), xycoords=("data", "axes fraction"),
                          ha="center", fontsize=8, color=f"C{i}")
    if claim.curve == "accuracy":
        ax.axhline(threshold, color="grey", linestyle=":", label=f"threshold {threshold}")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(claim.ylabel)
    ax.set_title(f"{claim.title}\n(band: lowest to highest seed)", fontsize=10)
    if ax.lines:
        ax.legend(fontsize=8)
    if not dots.collections:
        dots.set_yticks([])  # no seed has the figure: an axis would read as a scale of nothing
    dots.set_xticks(range(len(algorithms)), algorithms, fontsize=8)
    dots.set_xlim(-0.6, len(algorithms) - 0.4)
    never = any(seeds["never"] for seeds in compared.values())
    legend = f"dot: a seed; hollow: never reached, counted as step {censor:g}; bar: mean" if never else "dot: a seed; bar: mean"
    dots.set_title(textwrap.fill(f"compared: {claim.figure}", 34) + "\n" + textwrap.fill(f"({legend})", 34), fontsize=7)
    fig.tight_layout()
    _save(fig, path)


def _plot_curve(ax, claim: Claim, runs: list[dict], algorithm: str, color: str) -> None:
    curves = [c for c in (r["curves"][claim.curve] for r in runs) if any(v is not None for v in c)]
    if not curves:
        return
    n = min(len(c) for c in curves)
    columns = [[c[i] for c in curves if c[i] is not None] for i in range(n)]
    steps = [i + 1 for i, col in enumerate(columns) if col]
    columns = [col for col in columns if col]
    ax.plot(steps, [sum(col) / len(col) for col in columns], color=color, label=f"{algorithm} (mean of {len(curves)} seeds)")
    ax.fill_between(steps, [min(col) for col in columns], [max(col) for col in columns], color=color, alpha=0.2)


def _save(fig, path: Path) -> None:
    from grpokit import files

    files.save_figure(fig, path, key="--out", dpi=110)


def _cell(values: list, digits: int = 3) -> str:
    kept = [v for v in values if v is not None]
    if not kept:
        return "–"
    mean = sum(kept) / len(kept)
    cell = f"{mean:.{digits}g} ± {spread(kept):.2g}" if len(kept) > 1 else f"{mean:.{digits}g}"
    return cell if len(kept) == len(values) else f"{cell} ({len(kept)} of {len(values)})"


TABLE = (("pass@1", "held-out pass@1 after"), ("length_growth", "length growth"), ("entropy_end", "entropy (end)"),
         ("entropy_kept", "entropy kept"), ("clip_high_mean", "clip high"), ("clip_low_mean", "clip low"),
         ("zero_spread_mean", "zero-spread groups (end)"), ("kl_to_reference", "KL to base"),
         ("steps_to_threshold", "steps to accuracy {threshold}"))


def table(results: dict[str, list[dict]], base: dict | None, threshold: float = THRESHOLD) -> list[str]:
    head = "| algorithm | seeds | " + " | ".join(label.format(threshold=threshold) for _, label in TABLE) + " |"
    lines = [head, "|" + "---|" * (len(TABLE) + 2)]
    for algorithm, rows in results.items():  # in the lab's order
        if rows:
            cells = [_cell([r[key] for r in rows]) for key, _ in TABLE]
            lines.append(f"| {algorithm} | {len(rows)} | " + " | ".join(cells) + " |")
    if base:
        lines.append(f"\nBase model, held-out greedy pass@1: {base['greedy']['pass@1']:.3f} "
                     f"({base['greedy']['passed']}/{base['prompts']}). Cells: mean ± sample standard deviation over "
                     "seeds; a step never reaching the threshold leaves that seed out of its cell, which then says how many "
                     "seeds it holds.")
    return lines
