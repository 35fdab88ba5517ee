"""TRL's per-token KL term is k3 with rho = pi_ref / pi_theta (eq. 8.3), through TRL's own code.

We build a real `GRPOTrainer` on the tiny model, swap only `_get_per_token_logps_and_entropies` for one
that returns hand-made log-probs, call the real `_compute_loss`, and read the `kl` metric it logs. If a
TRL upgrade flips the direction (pi_theta / pi_ref), switches estimator (k1, k2) or changes how the
bias correction weights it, these numbers move and the test fails.

The hand-made tokens are the lab's: x ~ p = pi_theta over four outcomes, with pi_ref = q.
"""

import math

import numpy as np
import pytest
from helpers import tiny_trainer

from labs import grpo_pieces as lab

torch = pytest.importorskip("torch")

REL = 1e-5  # TRL computes in float32; our reference in float64


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, tmp_path_factory):
    from datasets import Dataset

    tr = tiny_trainer(
        tmp_path_factory.mktemp("kl"),
        lambda completions, **kw: [0.0] * len(completions),
        Dataset.from_list([{"prompt": "hi"}] * 4),
        model_dir=tiny_model_dir,
        lora=False,
        beta=0.04,  # > 0, or TRL computes no KL at all
        use_bias_correction_kl=True,  # TRL 1.16's default, stated so a default change cannot hide here
        per_device_train_batch_size=4,
        max_completion_length=8,
    )
    tr.model.train()  # _compute_loss logs under "train" when the model is in training mode
    tr.current_gradient_accumulation_steps = 1  # set by Trainer.train() per step; we call the loss directly
    return tr


def hand_made_logps(seed=0, batch=4, length=8):
    """Per-token log pi_theta and log pi_ref for tokens x ~ p, plus a mask with padded tails."""
    rng = np.random.default_rng(seed)
    x = rng.choice(4, size=(batch, length), p=lab.P_THETA)
    logp = np.log(lab.P_THETA)[x]
    logq = np.log(lab.P_REF)[x]
    mask = np.ones((batch, length))
    mask[1, 5:] = 0  # padding must not count
    mask[3, 2:] = 0
    return logp, logq, mask


def kl_metric(trainer, monkeypatch, logp, logq, mask, old_logp=None):
    """Run TRL's real `_compute_loss` on hand-made log-probs; return the `kl` it logged."""
    batch, length = logp.shape
    policy = torch.tensor(logp, dtype=torch.float32, requires_grad=True)

    def fake_logps(model, input_ids, attention_mask, logits_to_keep, **kwargs):
        assert logits_to_keep == length
        return policy, torch.zeros(batch, length), None  # logps, entropies, aux loss

    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", fake_logps)
    inputs = {
        "prompt_ids": torch.zeros(batch, 3, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 3, dtype=torch.long),
        "completion_ids": torch.zeros(batch, length, dtype=torch.long),
        "completion_mask": torch.tensor(mask, dtype=torch.long),
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5]),
        "ref_per_token_logps": torch.tensor(logq, dtype=torch.float32),
        "num_items_in_batch": torch.tensor(float(mask.sum())),
    }
    if old_logp is not None:
        inputs["old_per_token_logps"] = torch.tensor(old_logp, dtype=torch.float32)
    trainer._metrics["train"].clear()
    trainer._compute_loss(trainer.model, inputs)
    return trainer._metrics["train"]["kl"][-1]


def masked_mean(values, mask):
    return float((values * mask).sum() / mask.sum())


def k3(log_rho):
    return np.expm1(log_rho) - log_rho


def test_trl_kl_is_k3_with_rho_ref_over_policy(trainer, monkeypatch):
    logp, logq, mask = hand_made_logps()
    got = kl_metric(trainer, monkeypatch, logp, logq, mask)  # on-policy: importance ratio is exactly 1

    expected = masked_mean(k3(logq - logp), mask)  # rho = pi_ref / pi_theta
    assert got == pytest.approx(expected, rel=REL)

    # The test can tell the alternatives apart: each is > 100x the tolerance away from what TRL logged.
    reverse = masked_mean(k3(logp - logq), mask)  # rho = pi_theta / pi_ref
    k1 = masked_mean(-(logq - logp), mask)
    k2 = masked_mean(0.5 * (logq - logp) ** 2, mask)
    unmasked = float(k3(logq - logp).mean())
    for other in (reverse, k1, k2, unmasked):
        assert abs(other - expected) > 100 * REL * expected, (other, expected)


def test_trl_bias_correction_multiplies_k3_by_the_importance_ratio(trainer, monkeypatch):
    # Off-policy (pi_old != pi_theta): TRL 1.16 weights each token's k3 by pi_theta / pi_old
    # (use_bias_correction_kl=True, DeepSeek-V3.2). On-policy that weight is 1, as tested above.
    logp, logq, mask = hand_made_logps(seed=1)
    old = logp + np.random.default_rng(2).normal(0, 0.3, size=logp.shape)
    got = kl_metric(trainer, monkeypatch, logp, logq, mask, old_logp=old)

    expected = masked_mean(k3(logq - logp) * np.exp(logp - old), mask)
    assert got == pytest.approx(expected, rel=REL)
    assert abs(masked_mean(k3(logq - logp), mask) - expected) > 100 * REL * expected  # the weighting really mattered


def test_hand_made_tokens_estimate_the_lab_kl():
    # Sanity link to the lab: averaged over many tokens, TRL's per-token k3 estimates KL(pi_theta || pi_ref).
    logp, logq, mask = hand_made_logps(batch=64, length=256)
    value = k3(logq - logp)
    se = value.std(ddof=1) / math.sqrt(value.size)
    assert abs(value.mean() - lab.exact_kl()) < 4 * se
