"""The seed lab: GRPO's two new pieces on synthetic data with a known answer.

    python labs/grpo_pieces.py                 # writes runs/bench/grpo_pieces/kl_estimators.csv and .png
    python labs/grpo_pieces.py --out /tmp/lab

1. The group-relative advantage (eq. 8.1), A_i = (r_i - mean(r)) / std(r), next to the Dr. GRPO variant
   A_i = r_i - mean(r) and the all-equal group whose std collapses to zero (no gradient at all).
2. The three KL estimators (eq. 8.3; Schulman, "Approximating KL divergence", 2020) for KL(p || q) with
   samples x ~ p and rho = q(x) / p(x):
       k1 = -log rho              unbiased, but negative for many single samples
       k2 = 1/2 (log rho)^2       always >= 0, but biased: its mean is not KL(p || q)
       k3 = rho - 1 - log rho     always >= 0 and unbiased, since E_p[rho] = 1
   Here p is the policy pi_theta and q the reference pi_ref, so this is the direction GRPO penalises.

Only numpy and matplotlib: no torch, no model. Every number comes from a seeded generator, so two runs
print the same table. `tests/labs/test_lab.py` checks the chapter's claims from these numbers.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: grpokit is the repo's

from grpokit import files  # noqa: E402
from labs.outputs import SCRATCH  # noqa: E402
from labs.refusals import check_outputs, one_line_exit  # noqa: E402

P_THETA = (0.4, 0.3, 0.2, 0.1)  # p = pi_theta: the policy we sample from
P_REF = (0.1, 0.2, 0.3, 0.4)  # q = pi_ref: the reference model
SAMPLE_SIZES = (1, 4, 16, 64, 256)
TOTAL_SAMPLES = 20_000  # each n gets TOTAL_SAMPLES // n trials, so every row costs the same draws
ESTIMATORS = ("k1", "k2", "k3")
DEMO_REWARDS = (1, 0, 0, 1, 0, 0)

# TRL 1.16 (`GRPOTrainer._generate_and_score_completions`) divides by `nanstd(...) + 1e-4`, and
# `trl.trainer.utils.nanstd` is the unbiased (n - 1) std, like `torch.std`. We use the same by default
# so the lab's numbers are the ones TRL computes; pass ddof=0 for the population std some texts use.
TRL_STD_DDOF = 1
TRL_STD_EPS = 1e-4


# --------------------------------------------------------------------------------------------------
# 1. Group-relative advantages


def group_advantages(rewards, *, scale: bool = True, ddof: int = TRL_STD_DDOF, eps: float = TRL_STD_EPS) -> np.ndarray:
    """Advantages for one group of completions of the same prompt (eq. 8.1).

    scale=True is GRPO: (r - mean) / (std + eps). scale=False is Dr. GRPO (Liu et al., 2025): r - mean,
    which keeps the signs but drops the 1/std that up-weights near-unanimous groups.
    `ddof=1, eps=1e-4` match TRL; with an all-equal group the numerator is exactly 0, so the
    advantages are exactly 0 whatever the epsilon: that group gives no gradient.

    >>> group_advantages([1, 0, 0, 1, 0, 0]).round(3)
    array([ 1.291, -0.645, -0.645,  1.291, -0.645, -0.645])
    >>> group_advantages([1, 0, 0, 1, 0, 0], scale=False).round(3)
    array([ 0.667, -0.333, -0.333,  0.667, -0.333, -0.333])
    """
    r = np.asarray(rewards, dtype=float)
    if r.ndim != 1 or r.size < 2:
        raise ValueError(f"rewards must be one group of at least 2 numbers (got shape {r.shape})")
    centred = r - r.mean()
    if not scale:
        return centred
    return centred / (r.std(ddof=ddof) + eps)


def advantage_demo(rewards=DEMO_REWARDS) -> dict[str, np.ndarray]:
    """The three groups of the chapter's demo: GRPO, Dr. GRPO, and a group whose std collapses."""
    return {
        "rewards": np.asarray(rewards, dtype=float),
        "grpo": group_advantages(rewards),
        "grpo_population_std": group_advantages(rewards, ddof=0, eps=0.0),
        "dr_grpo": group_advantages(rewards, scale=False),
        "all_equal": group_advantages([1.0] * len(rewards)),
    }


# --------------------------------------------------------------------------------------------------
# 2. KL estimators


def _log_rho(p=P_THETA, q=P_REF) -> np.ndarray:
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    return np.log(q) - np.log(p)


def kl_estimators(log_rho) -> dict[str, np.ndarray]:
    """k1, k2, k3 for samples with log rho = log q(x) - log p(x), x ~ p (eq. 8.3)."""
    log_rho = np.asarray(log_rho, dtype=float)
    return {
        "k1": -log_rho,
        "k2": 0.5 * log_rho**2,
        "k3": np.expm1(log_rho) - log_rho,  # rho - 1 - log rho, exact near rho = 1
    }


def exact_kl(p=P_THETA, q=P_REF) -> float:
    """KL(p || q) = sum_x p(x) log(p(x) / q(x)), exactly."""
    return float(-(np.asarray(p, dtype=float) * _log_rho(p, q)).sum())


def exact_expectations(p=P_THETA, q=P_REF) -> dict[str, float]:
    """E_p[k] for each estimator, exactly: k1 and k3 equal KL(p || q), k2 does not."""
    values = kl_estimators(_log_rho(p, q))
    return {name: float((np.asarray(p) * v).sum()) for name, v in values.items()}


def kl_estimator_table(seed: int = 0, sizes=SAMPLE_SIZES, total: int = TOTAL_SAMPLES, p=P_THETA, q=P_REF) -> list[dict]:
    """For each n and estimator: statistics of the n-sample mean over `total // n` seeded trials.

    Each row: estimator, n, trials, mean, exact_kl, bias (mean - exact_kl), std (of the n-sample mean
    across trials, ddof=1), se (std / sqrt(trials): the sampling error of `mean` and `bias`),
    frac_negative (share of trials whose n-sample mean is < 0).

    >>> rows = kl_estimator_table(seed=0)
    >>> [r["estimator"] for r in rows[:3]], rows[0]["trials"]
    (['k1', 'k2', 'k3'], 20000)
    """
    rng = np.random.default_rng(seed)
    kl = exact_kl(p, q)
    per_outcome = kl_estimators(_log_rho(p, q))  # each estimator depends on x only, so tabulate once
    rows = []
    for n in sizes:
        trials = total // n
        if trials < 2:
            raise ValueError(f"n={n} leaves {trials} trial(s) of {total} samples; need at least 2")
        draws = rng.choice(len(p), size=(trials, n), p=np.asarray(p, dtype=float))
        for name in ESTIMATORS:
            means = per_outcome[name][draws].mean(axis=1)
            std = float(means.std(ddof=1))
            rows.append(
                {
                    "estimator": name,
                    "n": n,
                    "trials": trials,
                    "mean": float(means.mean()),
                    "exact_kl": kl,
                    "bias": float(means.mean()) - kl,
                    "std": std,
                    "se": std / math.sqrt(trials),
                    "frac_negative": float((means < 0).mean()),
                }
            )
    return rows


COLUMNS = ("estimator", "n", "trials", "mean", "exact_kl", "bias", "std", "se", "frac_negative")


def format_table(rows: list[dict]) -> str:
    """The table as fixed-width text, one line per (n, estimator)."""
    head = f"{'est':>3} {'n':>4} {'trials':>6} {'mean':>8} {'bias':>8} {'std':>8} {'se':>8} {'frac<0':>7}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['estimator']:>3} {r['n']:>4} {r['trials']:>6} {r['mean']:>8.4f} {r['bias']:>+8.4f} "
            f"{r['std']:>8.4f} {r['se']:>8.4f} {r['frac_negative']:>7.3f}"
        )
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> Path:
    """The table as CSV, one row per (n, estimator), through grpokit's file door (never over a file of the user's)."""
    files.write_csv(path, list(COLUMNS), ([r[c] for c in COLUMNS] for r in rows), key="--out")
    return path


def plot_table(rows: list[dict], path: Path) -> Path:
    """Bias (with +-2 standard errors) and std of the n-sample mean against n, one line per estimator."""
    # A bare Figure renders through Agg without touching pyplot's global backend state.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), layout="constrained")
    ax_bias, ax_std = fig.subplots(1, 2)
    for name in ESTIMATORS:
        sub = [r for r in rows if r["estimator"] == name]
        n = [r["n"] for r in sub]
        ax_bias.errorbar(
            n, [r["bias"] for r in sub], yerr=[2 * r["se"] for r in sub], marker="o", capsize=3, label=name
        )
        ax_std.plot(n, [r["std"] for r in sub], marker="o", label=name)
    ax_bias.axhline(0.0, color="grey", linewidth=0.8)
    k2_bias = exact_expectations()["k2"] - exact_kl()
    ax_bias.axhline(k2_bias, color="C1", linestyle="--", linewidth=0.8, label="k2 exact bias")
    ax_bias.set(xscale="log", xlabel="samples per estimate n", ylabel="bias of n-sample mean (±2 SE)")
    ax_bias.set_title("Bias vs n: k2's bias does not shrink")
    ax_std.set(xscale="log", yscale="log", xlabel="samples per estimate n", ylabel="std of n-sample mean")
    ax_std.set_title("Std vs n: all shrink like 1/sqrt(n)")
    for ax in (ax_bias, ax_std):
        ax.legend(title="estimator")
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"KL estimators for KL(p||q) = {rows[0]['exact_kl']:.4f}, p={list(P_THETA)}, q={list(P_REF)}")
    files.save_figure(fig, path, key="--out", dpi=100)
    return path


# --------------------------------------------------------------------------------------------------


def _format_advantages(demo: dict[str, np.ndarray]) -> str:
    def show(a):
        return "[" + ", ".join(f"{x:+.3f}" for x in a) + "]"

    return "\n".join(
        [
            f"rewards                               {show(demo['rewards'])}",
            f"GRPO (r-mean)/(std+1e-4), std ddof=1  {show(demo['grpo'])}   <- what TRL computes",
            f"GRPO (r-mean)/std, population std     {show(demo['grpo_population_std'])}",
            f"Dr. GRPO r-mean                       {show(demo['dr_grpo'])}",
            f"all-equal group [1]*6                 {show(demo['all_equal'])}   <- std collapse: no gradient",
        ]
    )


@one_line_exit
def main(argv: list[str] | None = None) -> int:
    """Print the advantage demo and the KL table; write kl_estimators.csv and kl_estimators.png (0), or refuse to
    replace a file there grpokit did not write, writing neither (2)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=SCRATCH / "grpo_pieces",
                        help="output folder (default runs/bench/grpo_pieces; labs/outputs.py)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the KL sampling (default: %(default)s)")
    args = parser.parse_args(argv)
    paths = {"csv": args.out / "kl_estimators.csv", "png": args.out / "kl_estimators.png"}
    check_outputs(paths.values())

    print("== Group-relative advantages (eq. 8.1) ==")
    print(_format_advantages(advantage_demo()))
    print()

    rows = kl_estimator_table(seed=args.seed)
    exact = exact_expectations()
    print(f"== KL estimators (eq. 8.3): p = pi_theta = {list(P_THETA)}, q = pi_ref = {list(P_REF)} ==")
    expectations = ", ".join(f"E[{k}] = {v:.4f}" for k, v in exact.items())
    print(f"exact KL(p||q) = {exact_kl():.4f}; {expectations}")
    print(format_table(rows))

    write_csv(rows, paths["csv"])
    plot_table(rows, paths["png"])
    print()
    for path in paths.values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
