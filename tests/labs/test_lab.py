"""The seed lab's claims, checked from its own numbers.

Every tolerance is a multiple of a sampling error the table itself reports (`se` = std / sqrt(trials))
or one computed exactly from p and q, so the checks would hold for any seed, not only seed 0.
"""

import csv
import math

import numpy as np
import pytest

from labs import grpo_pieces as lab

Z = 4.0  # how many standard errors a "no difference" may be off by: ~6e-5 false alarms per check


@pytest.fixture(scope="module")
def table():
    return lab.kl_estimator_table(seed=0)


def rows_of(table, name):
    return [r for r in table if r["estimator"] == name]


def single_sample_moments(name):
    """Exact variance and excess kurtosis of one draw of estimator `name` under p."""
    p = np.asarray(lab.P_THETA)
    k = lab.kl_estimators(np.log(lab.P_REF) - np.log(lab.P_THETA))[name]
    mu = (p * k).sum()
    var = (p * (k - mu) ** 2).sum()
    return var, (p * (k - mu) ** 4).sum() / var**2 - 3.0


# ---------------------------------------------------------------------------------------------
# Advantages (eq. 8.1)


def test_grpo_advantages_two_equal_positives_four_equal_negatives_summing_to_zero():
    a = lab.group_advantages([1, 0, 0, 1, 0, 0])
    pos, neg = a[[0, 3]], a[[1, 2, 4, 5]]
    assert np.all(pos > 0) and np.all(neg < 0)
    assert np.ptp(pos) == 0 and np.ptp(neg) == 0
    # Symmetric in the chapter's sense: the group's advantages balance, so two winners weigh as much as
    # four losers (each winner twice each loser).
    assert a.sum() == pytest.approx(0.0, abs=1e-12)
    assert pos[0] == pytest.approx(-2 * neg[0])


def test_population_std_gives_the_textbook_values():
    # mean 1/3, population std sqrt(2)/3: winners +sqrt(2), losers -1/sqrt(2)
    a = lab.group_advantages([1, 0, 0, 1, 0, 0], ddof=0, eps=0.0)
    w, l = math.sqrt(2), -1 / math.sqrt(2)
    np.testing.assert_allclose(a, [w, l, l, w, l, l])


def test_dr_grpo_keeps_the_signs_and_changes_only_the_scale():
    scaled = lab.group_advantages([1, 0, 0, 1, 0, 0])
    raw = lab.group_advantages([1, 0, 0, 1, 0, 0], scale=False)
    np.testing.assert_allclose(raw, [2 / 3, -1 / 3, -1 / 3, 2 / 3, -1 / 3, -1 / 3])
    assert np.array_equal(np.sign(raw), np.sign(scaled))
    ratio = scaled / raw  # one common factor 1 / (std + eps), not 1
    np.testing.assert_allclose(ratio, ratio[0])
    assert ratio[0] == pytest.approx(1 / (np.std([1, 0, 0, 1, 0, 0], ddof=1) + 1e-4))


@pytest.mark.parametrize("scale", [True, False])
def test_all_equal_group_has_zero_advantage(scale):
    # std collapses to 0; the epsilon keeps 0/0 from being NaN, and the group gives no gradient
    assert np.array_equal(lab.group_advantages([1.0] * 6, scale=scale), np.zeros(6))
    # 0.7 is not exact in binary, so its mean can be off by an ulp: zero up to rounding, never huge
    np.testing.assert_allclose(lab.group_advantages([0.7] * 6, scale=scale), 0.0, atol=1e-9)


def test_default_matches_trl_std_and_epsilon():
    torch = pytest.importorskip("torch")
    from trl.trainer.utils import nanstd

    rewards = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    r = torch.tensor(rewards, dtype=torch.float64)
    trl_advantages = (r - r.mean()) / (nanstd(r) + 1e-4)  # as in GRPOTrainer, scale_rewards="group"
    # nanstd's n/(n-1) correction is computed in float32 even for float64 input, hence rtol 1e-6
    np.testing.assert_allclose(lab.group_advantages(rewards), trl_advantages.numpy(), rtol=1e-6)


def test_advantage_demo_has_every_group():
    demo = lab.advantage_demo()
    assert set(demo) == {"rewards", "grpo", "grpo_population_std", "dr_grpo", "all_equal"}


# ---------------------------------------------------------------------------------------------
# KL estimators (eq. 8.3)


def test_exact_kl_and_expectations():
    by_hand = 0.4 * math.log(4) + 0.3 * math.log(1.5) + 0.2 * math.log(2 / 3) + 0.1 * math.log(0.25)
    assert lab.exact_kl() == pytest.approx(by_hand, rel=1e-12)
    exact = lab.exact_expectations()
    assert exact["k1"] == pytest.approx(by_hand, rel=1e-12)
    assert exact["k3"] == pytest.approx(by_hand, rel=1e-12)
    assert exact["k2"] - by_hand > 0.05  # k2 over-estimates here by design of p and q


def test_table_shape_and_reproducibility(table):
    assert [(r["n"], r["estimator"]) for r in table] == [(n, k) for n in lab.SAMPLE_SIZES for k in lab.ESTIMATORS]
    assert [r["trials"] for r in table] == [20000 // r["n"] for r in table]
    assert lab.kl_estimator_table(seed=0) == table
    assert lab.kl_estimator_table(seed=1) != table


@pytest.mark.parametrize("name", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_at_every_n(table, name):
    for r in rows_of(table, name):
        assert abs(r["bias"]) < Z * r["se"], r


def test_k2_bias_is_real_and_does_not_shrink_with_n(table):
    exact_bias = lab.exact_expectations()["k2"] - lab.exact_kl()
    rows = rows_of(table, "k2")
    for r in rows:
        assert abs(r["bias"] - exact_bias) < Z * r["se"], r  # the bias is E[k2] - KL, whatever n is
    first, last = rows[0], rows[-1]
    assert last["n"] == 256
    assert last["bias"] > Z * last["se"]  # well outside its own sampling error at the largest n
    assert abs(last["bias"] - first["bias"]) < Z * math.hypot(first["se"], last["se"])  # n=1 to 256: no shrinking


def test_k3_is_never_negative(table):
    k3 = lab.kl_estimators(np.log(lab.P_REF) - np.log(lab.P_THETA))["k3"]
    assert np.all(k3 >= 0)  # pointwise: rho - 1 - log rho >= 0 for every rho > 0
    assert all(r["frac_negative"] == 0.0 for r in rows_of(table, "k3"))


def test_k1_is_negative_in_a_real_fraction_of_small_n_trials(table):
    k1 = {r["n"]: r for r in rows_of(table, "k1")}
    # n=1: k1 < 0 exactly when q(x) > p(x), i.e. x in {2, 3}: probability 0.2 + 0.1
    expected = 0.3
    assert abs(k1[1]["frac_negative"] - expected) < Z * math.sqrt(expected * (1 - expected) / k1[1]["trials"])
    assert k1[4]["frac_negative"] > 0.05
    assert all(r["frac_negative"] == 0.0 for r in rows_of(table, "k2"))


@pytest.mark.parametrize("name", lab.ESTIMATORS)
def test_std_shrinks_like_one_over_sqrt_n(table, name):
    var1, kurt1 = single_sample_moments(name)
    rows = rows_of(table, name)
    stds = [r["std"] for r in rows]
    assert all(a > b for a, b in zip(stds, stds[1:])), stds
    for r in rows:
        # SE of a sample std, relative: ~ 1/2 sqrt(2/(T-1) + kurtosis/T); an n-mean's kurtosis is kurt1/n
        t = r["trials"]
        rel_se = 0.5 * math.sqrt(2 / (t - 1) + max(kurt1 / r["n"], 0.0) / t)
        assert abs(r["std"] * math.sqrt(r["n"]) / math.sqrt(var1) - 1) < Z * rel_se, r


# ---------------------------------------------------------------------------------------------
# The script


def test_main_writes_csv_and_png_and_prints_the_table(tmp_path, capsys):
    import matplotlib.image

    assert lab.main(["--out", str(tmp_path / "lab")]) == 0
    paths = {"csv": tmp_path / "lab" / "kl_estimators.csv", "png": tmp_path / "lab" / "kl_estimators.png"}
    with open(paths["csv"]) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(lab.SAMPLE_SIZES) * len(lab.ESTIMATORS)
    assert list(rows[0]) == list(lab.COLUMNS)
    assert float(rows[-1]["mean"]) == pytest.approx(lab.kl_estimator_table(seed=0)[-1]["mean"])

    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(paths["png"]).shape
    assert width > 600 and height > 250

    out = capsys.readouterr().out
    assert "exact KL(p||q) = 0.4564" in out
    assert " k3  256     78" in out
    assert "std collapse" in out
