"""DAPO dynamic sampling (grpokit/trainer/dynamic_sampling.py): real GRPO runs of the tiny model through the subclass.

Rewards are chosen so the outcome is known: prompts of kind "flat" always score 1.0 (zero spread), prompts of
kind "live" score a hash of the completion text (distinct completions differ, so live groups have spread).
"""

import json
import logging
import os
import statistics
import subprocess
import sys
import types
import zlib
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from helpers import tiny_trainer

from grpokit.trainer import dynamic_sampling as ds
from grpokit.config.sections import SAMPLING
from grpokit.trainer.dynamic_sampling import DynamicSamplingGRPOTrainer
from grpokit import trl_compat
from grpokit.trl_compat import TrlInternalsError, check_trl_internals
from grpokit.dist import end_distributed
from rewards import text

DEFAULTS = {key: field.default for key, field in SAMPLING.items()}  # the recipe's `sampling:` section
WORDS = ["apple", "banana", "cherry", "date", "egg", "fig", "grape", "ham"]
ON = {"dynamic": True, "max_rounds": 4, "metric": "reward"}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two cores shared with other jobs: more than one intra-op thread makes a step 10-50x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hashed(completions, kind, **kwargs):
    """1.0 for kind 'flat'; for 'live' a value in [0, 1) that differs between distinct completions."""
    return [1.0 if k == "flat" else (zlib.crc32(text(c).encode()) % 997) / 997 for c, k in zip(completions, kind)]


def constant(completions, **kwargs):
    return [1.0] * len(completions)


def dataset(kinds):
    from datasets import Dataset

    return Dataset.from_list(
        [{"prompt": [{"role": "user", "content": f"Say {w}"}], "kind": k} for w, k in zip(WORDS, kinds)]
    )


HALF_FLAT = ["live", "flat"] * 4


def make_trainer(tmp_path, model_dir, reward_funcs, sampling, kinds=HALF_FLAT, cls=DynamicSamplingGRPOTrainer,
                 streaming=False, **cfg):
    data = dataset(kinds)
    extra = {"sampling": sampling} if cls is DynamicSamplingGRPOTrainer else None
    return tiny_trainer(tmp_path, reward_funcs, data.to_iterable_dataset() if streaming else data, trainer_cls=cls,
                        model_dir=model_dir, trainer_kwargs=extra, **cfg)


def spy_loss(trainer):
    """Record every micro-batch that reaches `_compute_loss`."""
    seen, original = [], trainer._compute_loss

    def wrapped(model, inputs):
        seen.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
        return original(model, inputs)

    trainer._compute_loss = wrapped
    return seen


def prompt_words(trainer, batch):
    tok = trainer.processing_class
    texts = [tok.decode(ids[m.bool()]) for ids, m in zip(batch["prompt_ids"], batch["prompt_mask"])]
    return [t.split("Say ")[1].split("<")[0] for t in texts]


def step_logs(trainer):
    return [h for h in trainer.state.log_history if "sampling/rounds" in h or "reward" in h]


# -- pinned TRL internals ------------------------------------------------------------------------------------


def test_trl_internals_pass_on_pinned_version():
    check_trl_internals()


def test_trl_internals_fail_loudly_on_other_version(monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(TrlInternalsError, match=r"trl version is 1.17.0, expected 1.16.0"):
        check_trl_internals()


def test_trl_internals_fail_loudly_on_missing_method(monkeypatch):
    from trl import GRPOTrainer

    monkeypatch.delattr(GRPOTrainer, "_calculate_rewards")
    with pytest.raises(TrlInternalsError, match=r"GRPOTrainer._calculate_rewards is missing"):
        check_trl_internals()


def test_trl_internals_fail_loudly_on_changed_signature(monkeypatch):
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_generate", lambda self, prompts, num_generations: None)
    with pytest.raises(TrlInternalsError, match=r"GRPOTrainer._generate.*has changed"):
        check_trl_internals()


def test_trl_internals_fail_loudly_on_changed_source(monkeypatch):
    from trl import GRPOTrainer

    def _compute_loss(self, model, inputs):  # same signature, no longer reads tool_mask
        return None

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _compute_loss)
    with pytest.raises(TrlInternalsError, match=r"_compute_loss no longer contains"):
        check_trl_internals()


def test_trl_internals_fail_loudly_on_missing_attribute():
    present = {a: None for a in trl_compat.TRAINER_ATTRIBUTES if a != "_metrics"}
    with pytest.raises(TrlInternalsError, match=r"trainer attribute `_metrics` is missing"):
        check_trl_internals(types.SimpleNamespace(**present))


def test_init_refuses_changed_internals_only_when_dynamic(tmp_path, tiny_model_dir, monkeypatch, caplog):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(TrlInternalsError, match=r"pip install trl==1.16.0"):
        make_trainer(tmp_path, tiny_model_dir, [hashed], ON)
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer.dynamic_sampling"):
        make_trainer(tmp_path, tiny_model_dir, [hashed], {"dynamic": False})  # nothing relies on them: warn only
    assert "trl version is 1.17.0" in caplog.text


# -- settings and helpers ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, names, expect",
    [
        (None, None, DEFAULTS),  # absent section: off, defaults
        ({"dynamic": True, "metric": "hashed"}, ["hashed"], {**DEFAULTS, "dynamic": True, "metric": "hashed"}),
        ({"dynamc": True}, None, r"sampling.dynamc: is not a known key.*did you mean 'dynamic'"),  # typo
        ({"max_rounds": 0}, None, r"sampling.max_rounds: is out of range \(got 0\); allowed: >= 1"),
        ({"max_rounds": True}, None, r"sampling.max_rounds: has the wrong type \(got True\); allowed: integer"),  # a bool is not a count
        ({"dynamic": "yes"}, None, r"sampling.dynamic: has the wrong type \(got 'yes'\); allowed: true/false"),
        ({"metric": "hashd"}, ["hashed"], r"sampling.metric: names no reward of this recipe \(got 'hashd'\); allowed: reward, hashed; did you mean 'hashed'"),
    ],
)
def test_sampling_settings(given, names, expect):
    if isinstance(expect, str):
        with pytest.raises(ValueError, match=expect):
            ds.sampling_settings(given, names)
    else:
        assert ds.sampling_settings(given, names) == expect


def test_group_layout_requires_whole_groups_per_process():
    ds.check_group_layout(8, 1, 4)
    ds.check_group_layout(2, 2, 4)  # 4 rows per process: one whole group
    with pytest.raises(ValueError, match=r"\(6 x 1 = 6\).*multiple of num_generations \(4\).*multiple of 4"):
        ds.check_group_layout(6, 1, 4)


def test_prompt_stream_is_seeded_endless_and_independent():
    a = ds.next_n(ds.prompt_stream(5, 0, (3, 0)), 15)
    assert a == ds.next_n(ds.prompt_stream(5, 0, (3, 0)), 15)  # same key, same draws: resume-safe
    assert a != ds.next_n(ds.prompt_stream(5, 0, (4, 0)), 15)  # another step, other draws
    assert all(sorted(a[i:i + 5]) == list(range(5)) for i in (0, 5, 10))  # whole permutations, endless
    state = torch.random.get_rng_state()
    ds.next_n(ds.prompt_stream(5, 0, (0, 0)), 5)
    assert torch.equal(state, torch.random.get_rng_state())  # torch's generator untouched


@pytest.mark.parametrize(
    "values, keep",
    [
        ([1.0, 1.0, 1.0, 1.0], False),  # all equal: eq. 8.1 gives 0
        ([0.3, 0.3, 0.3, 0.3 + 1e-8], False),  # float noise is no signal
        ([0.0, 0.0, 0.0, 1.0], True),
        ([float("nan"), 0.0, 1.0, float("nan")], True),  # None from a reward: spread of the rest
        ([float("nan"), float("nan"), float("nan"), 1.0], False),  # one scored value: no spread to speak of
        ([float("nan")] * 4, False),  # unscorable group
    ],
)
def test_group_spread_mask(values, keep):
    assert ds.group_spread_mask(torch.tensor(values), 4).tolist() == [keep]


# -- assembling the trained batch and its metrics, on hand-made tensors (no model) ---------------------------

NAN = float("nan")
PAD = 9  # the stand-in tokenizer's pad id, distinct from every token below


def stand_in(names=("a",), weights=(1.0,), G=2):
    """What `_assemble`, `_finish` and `_batch_metrics` read from the trainer, with one process (gather = identity)."""
    fake = types.SimpleNamespace(
        num_generations=G, reward_func_names=list(names), reward_weights=torch.tensor(weights),
        _tokenizer=types.SimpleNamespace(pad_token_id=PAD), accelerator=types.SimpleNamespace(gather=lambda t: t),
        _metrics={"train": defaultdict(list)})
    fake._batch_metrics = types.MethodType(DynamicSamplingGRPOTrainer._batch_metrics, fake)
    return fake


def round_out(prompt_width, completion_width, first, **extra):
    """One round's output for 2 groups of G=2 rows; row r's tokens are `first + r`, so every row is recognisable."""
    rows = torch.arange(first, first + 4)
    return {
        "prompt_ids": rows[:, None].repeat(1, prompt_width),
        "prompt_mask": torch.ones(4, prompt_width, dtype=torch.long),
        "completion_ids": rows[:, None].repeat(1, completion_width),
        "completion_mask": torch.ones(4, completion_width, dtype=torch.long),
        "advantages": rows.float(), "num_items_in_batch": torch.tensor(999), **extra,
    }


A = round_out(prompt_width=2, completion_width=3, first=10)
B = round_out(prompt_width=3, completion_width=1, first=20)


@pytest.mark.parametrize(
    "key, expect",
    [
        # A's narrower prompts are padded on the left (prompts are left-padded), with the pad id / mask 0
        ("prompt_ids", [[PAD, 12, 12], [PAD, 13, 13], [20, 20, 20], [21, 21, 21]]),
        ("prompt_mask", [[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]),
        # B's shorter completions are padded on the right, with the pad id / mask 0
        ("completion_ids", [[12, 12, 12], [13, 13, 13], [20, PAD, PAD], [21, PAD, PAD]]),
        ("completion_mask", [[1, 1, 1], [1, 1, 1], [1, 0, 0], [1, 0, 0]]),
        ("advantages", [12.0, 13.0, 20.0, 21.0]),  # per row, no width: the rows of the chosen groups, in order
        ("num_items_in_batch", 8),  # recomputed: the completion tokens of the kept rows, not a round's 999
    ],
)
def test_assemble_takes_the_chosen_groups_rows_and_pads_each_key_its_way(key, expect):
    batch = DynamicSamplingGRPOTrainer._assemble(stand_in(), [(A, 1), (B, 0)], [])
    assert batch[key].tolist() == expect


@pytest.mark.parametrize(
    "key, a_part, b_part, expect",
    [
        # TRL pads tool_mask with 1, like its own padding
        ("tool_mask", torch.ones(4, 3, dtype=torch.long), torch.ones(4, 1, dtype=torch.long),
         [[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]),
        # per-token log-probs are padded with 0.0 (masked out anyway)
        ("old_per_token_logps", torch.full((4, 3), -1.0), torch.full((4, 1), -2.0),
         [[-1.0] * 3, [-1.0] * 3, [-2.0, 0.0, 0.0], [-2.0, 0.0, 0.0]]),
        # per-token importance ratio (token modes): padded with the neutral 1.0
        ("importance_sampling_ratio", torch.full((4, 3), 0.5), torch.full((4, 1), 2.0),
         [[0.5] * 3, [0.5] * 3, [2.0, 1.0, 1.0], [2.0, 1.0, 1.0]]),
        # one ratio per sequence (sequence modes, shape (B, 1)): every part is one wide, nothing to pad
        ("importance_sampling_ratio", torch.tensor([[0.25], [0.5], [0.75], [1.0]]),
         torch.tensor([[1.25], [1.5], [1.75], [2.0]]), [[0.75], [1.0], [1.25], [1.5]]),
        # a key TRL left None (e.g. no reference model) stays None
        ("ref_per_token_logps", None, None, None),
        # grpokit's private per-row keys travel with their rows, unpadded
        ("_rewards", torch.arange(4.0)[:, None], torch.arange(4.0, 8.0)[:, None], [[2.0], [3.0], [4.0], [5.0]]),
    ],
)
def test_assemble_pads_optional_keys_with_their_neutral_value(key, a_part, b_part, expect):
    batch = DynamicSamplingGRPOTrainer._assemble(stand_in(), [({**A, key: a_part}, 1), ({**B, key: b_part}, 0)], [])
    assert (batch[key] if batch[key] is None else batch[key].tolist()) == expect


@pytest.mark.parametrize(
    "tool_mask",
    [
        None,  # no tool calls: a tool_mask is made to mask the filler rows
        torch.tensor([[1, 1, 0]] * 4),  # tool calls: the existing mask is kept for kept rows, zeroed for filler rows
    ],
)
def test_assemble_masks_filler_groups_out_of_the_loss(tool_mask):
    a = A if tool_mask is None else {**A, "tool_mask": tool_mask}
    b = B if tool_mask is None else {**B, "tool_mask": torch.ones(4, 1, dtype=torch.long)}
    batch = DynamicSamplingGRPOTrainer._assemble(stand_in(), [(a, 1)], [(b, 0)])
    kept_mask = [1, 1, 1] if tool_mask is None else [1, 1, 0]
    assert batch["advantages"].tolist() == [12.0, 13.0, 0.0, 0.0]  # fillers: advantage 0
    assert batch["tool_mask"].tolist() == [kept_mask, kept_mask, [0, 0, 0], [0, 0, 0]]  # fillers: no loss term
    assert int(batch["num_items_in_batch"]) == 2 * sum(kept_mask)  # only kept tokens normalise the loss


def test_assemble_refuses_a_key_it_cannot_merge():
    with pytest.raises(NotImplementedError, match=r"\['pixel_values'\].*sampling.dynamic: false"):
        DynamicSamplingGRPOTrainer._assemble(stand_in(), [({**A, "pixel_values": torch.zeros(4, 1)}, 0)], [])


@pytest.mark.parametrize(
    "rewards, lengths, truncated, expect",
    [
        # two rewards weighted 1 and 2: totals 1, 2 | 3, 3; the second group has no spread
        ([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 1.0]], [4.0, 2.0, 6.0, 8.0], [False, True, False, True],
         {"rewards/a/mean": 0.75, "rewards/a/std": 0.5, "rewards/b/mean": 0.75, "rewards/b/std": 0.5,
          "reward": 2.25, "reward_std": (2.75 / 3) ** 0.5, "frac_reward_zero_std": 0.5,
          "completions/mean_length": 5.0, "completions/min_length": 2.0, "completions/max_length": 8.0,
          "completions/clipped_ratio": 0.5, "completions/mean_terminated_length": 5.0,
          "completions/min_terminated_length": 4.0, "completions/max_terminated_length": 6.0}),
        # None from a reward (NaN) is left out of its mean; a row where every reward is None has no total, so
        # the first group (2, None) has no std and is not counted as zero-std, the second (2, 2) is
        ([[NAN, 1.0], [NAN, NAN], [0.0, 1.0], [2.0, NAN]], [1.0, 1.0, 1.0, 1.0], [False] * 4,
         {"rewards/a/mean": 1.0, "rewards/b/mean": 1.0, "reward": 2.0, "frac_reward_zero_std": 0.5,
          "completions/clipped_ratio": 0.0, "completions/mean_terminated_length": 1.0}),
        # every completion truncated: the terminated-length metrics are 0, as TRL logs them
        ([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], [16.0] * 4, [True] * 4,
         {"reward": 1.5, "frac_reward_zero_std": 0.0, "completions/clipped_ratio": 1.0,
          "completions/mean_terminated_length": 0.0, "completions/min_terminated_length": 0.0,
          "completions/max_terminated_length": 0.0}),
    ],
)
def test_batch_metrics(rewards, lengths, truncated, expect):
    fake = stand_in(names=("a", "b"), weights=(1.0, 2.0))
    got = fake._batch_metrics(torch.tensor(rewards), torch.tensor(lengths), torch.tensor(truncated))
    assert {k: got[k] for k in expect} == pytest.approx(expect)


@pytest.mark.parametrize(
    "rounds, dropped, generated, filled, expect",
    [
        # first round kept everything: TRL's batch as is
        (1, 0, 2, 0, {"sampling/rounds": 1.0, "sampling/frac_groups_dropped": 0.0, "sampling/prompts_consumed": 2.0,
                      "sampling/filled_short": 0.0, "sampling/frac_groups_filled": 0.0}),
        # three rounds, 4 of 6 groups dropped, batch full
        (3, 4, 6, 0, {"sampling/rounds": 3.0, "sampling/frac_groups_dropped": 4 / 6, "sampling/prompts_consumed": 6.0,
                      "sampling/filled_short": 0.0, "sampling/frac_groups_filled": 0.0}),
        # rounds ran out: one of the batch's two groups is a filler
        (2, 3, 4, 1, {"sampling/rounds": 2.0, "sampling/frac_groups_dropped": 0.75, "sampling/prompts_consumed": 4.0,
                      "sampling/filled_short": 1.0, "sampling/frac_groups_filled": 0.5}),
    ],
)
def test_finish_logs_the_sampling_metrics(rounds, dropped, generated, filled, expect):
    fake = stand_in()
    batch = {"advantages": torch.zeros(4), "_rewards": torch.tensor([[0.0], [1.0], [2.0], [2.0]]),
             "_lengths": torch.tensor([3.0, 3.0, 5.0, 5.0]), "_truncated": torch.tensor([False, False, True, False])}
    out = DynamicSamplingGRPOTrainer._finish(fake, batch, [], rounds, dropped, generated, filled)
    assert set(out) == {"advantages"}  # the private keys are taken out before the loss sees the batch
    metrics = fake._metrics["train"]
    assert {k: metrics[k] for k in expect} == {k: [pytest.approx(v)] for k, v in expect.items()}
    assert metrics["reward"] == [pytest.approx(1.25)] and metrics["completions/clipped_ratio"] == [0.25]


def test_finish_merges_the_rounds_trl_metrics():
    fake = stand_in()
    fake._metrics["train"]["num_tokens"] = [100.0]  # the total before this generation
    rounds = [
        {"num_tokens": [130.0], "kl": [0.1], "reward": [9.0], "rewards/a/log_metric": [1.0]},
        {"num_tokens": [160.0], "kl": [0.3], "reward": [7.0], "empty": []},
    ]
    batch = {"_rewards": torch.tensor([[0.0], [1.0]]), "_lengths": torch.tensor([2.0, 4.0]),
             "_truncated": torch.tensor([False, False])}
    DynamicSamplingGRPOTrainer._finish(fake, batch, rounds, 2, 1, 2, 0)
    metrics = fake._metrics["train"]
    assert metrics["num_tokens"] == [160.0]  # cumulative: the last round's count, set, not appended
    assert metrics["kl"] == [pytest.approx(0.2)]  # per-round values: averaged over the rounds
    assert metrics["rewards/a/log_metric"] == [1.0]  # only one round logged it: its own value
    assert metrics["reward"] == [0.5]  # recomputed on the trained rows, not the rounds' 9 and 7
    assert "empty" not in metrics  # a metric no round gave a value is not logged


def test_finish_logs_each_rewards_mean_over_everything_generated_beside_the_trained_batchs():
    """The trained batch holds only groups with a spread, so its accuracy leans toward 1/2; what the policy generated
    in the step (every round, kept or dropped) is logged apart, so a curve of training accuracy can read it (the
    lab's steps-to-threshold claim does). Every round generates as many rows, so it is the mean of the rounds'."""
    fake = stand_in(names=("a", "b"), weights=(1.0, 1.0))
    rounds = [{"rewards/a/mean": [1.0], "rewards/b/mean": [0.0]}, {"rewards/a/mean": [0.0], "rewards/b/mean": [0.5]},
              {"rewards/a/mean": [0.5], "rewards/b/mean": [0.25]}]
    batch = {"_rewards": torch.tensor([[0.0, 1.0], [1.0, 1.0]]), "_lengths": torch.tensor([2.0, 4.0]),
             "_truncated": torch.tensor([False, False])}
    DynamicSamplingGRPOTrainer._finish(fake, batch, rounds, 3, 2, 3, 0)
    metrics = fake._metrics["train"]
    assert metrics["sampling/generated/rewards/a/mean"] == [pytest.approx(0.5)]
    assert metrics["sampling/generated/rewards/b/mean"] == [pytest.approx(0.25)]
    assert metrics["rewards/a/mean"] == [0.5] and metrics["rewards/b/mean"] == [1.0]  # the trained rows'


# -- real runs on the tiny model -----------------------------------------------------------------------------


@pytest.mark.slow
def test_off_is_exactly_grpotrainer(tmp_path, tiny_model_dir):
    from trl import GRPOTrainer

    logs = []
    for cls in (GRPOTrainer, DynamicSamplingGRPOTrainer):
        trainer = make_trainer(tmp_path / cls.__name__, tiny_model_dir, [hashed], {"dynamic": False}, cls=cls)
        trainer.train()
        logs.append([{k: v for k, v in h.items() if "time" not in k and "per_second" not in k}
                     for h in trainer.state.log_history])
    assert logs[0] == logs[1]


@pytest.mark.slow
def test_degenerate_groups_never_reach_the_loss(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed], {**ON, "max_rounds": 8}, max_steps=4)
    seen = spy_loss(trainer)
    trainer.train()
    kinds = dict(zip(WORDS, HALF_FLAT))
    trained = [w for batch in seen for w in prompt_words(trainer, batch)]
    assert len(trained) == 4 * 8 and {kinds[w] for w in trained} == {"live"}
    logs = step_logs(trainer)
    assert max(h["sampling/rounds"] for h in logs) > 1
    assert all(h["sampling/filled_short"] == 0 and h["frac_reward_zero_std"] == 0 for h in logs)
    assert sum(h["sampling/frac_groups_dropped"] for h in logs) > 0


@pytest.mark.slow
def test_all_degenerate_completes_with_warning(tmp_path, tiny_model_dir, caplog):
    trainer = make_trainer(tmp_path, tiny_model_dir, [constant], {**ON, "max_rounds": 2}, max_steps=2,
                           loss_type="dapo", beta=0.1)
    seen = spy_loss(trainer)
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer.dynamic_sampling"):
        trainer.train()
    assert "ran out of generation rounds" in caplog.text and "sampling.max_rounds=2" in caplog.text
    assert "at step 1 " in caplog.text and "at step 0 " not in caplog.text  # steps count from 1, as the console does
    for batch in seen:  # full shape, but nothing in it counts: no advantage, no tokens, no KL
        assert batch["advantages"].shape == (8,) and torch.all(batch["advantages"] == 0)
        assert torch.all(batch["tool_mask"] == 0) and batch["num_items_in_batch"] == 0
    logs = step_logs(trainer)
    assert [h["sampling/filled_short"] for h in logs] == [1.0, 1.0]
    assert [h["sampling/rounds"] for h in logs] == [2.0, 2.0]
    assert all(h["sampling/frac_groups_filled"] == 1 and h["frac_reward_zero_std"] == 1 for h in logs)
    assert all(h["loss"] == 0 for h in trainer.state.log_history if "loss" in h)


@pytest.mark.slow
def test_short_batch_fill_does_not_dilute_kept_tokens(tmp_path, tiny_model_dir):
    # One round only: flat groups drawn in it must be filled, live ones kept.
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed], {**ON, "max_rounds": 1}, max_steps=3, loss_type="dapo")
    batches, original = [], trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(original(inputs)) or batches[-1]
    trainer.train()
    kinds = dict(zip(WORDS, HALF_FLAT))
    mixed = [b for b in batches if "tool_mask" in b]
    assert mixed, "expected at least one step with flat and live groups side by side"
    for batch in mixed:
        live = torch.tensor([kinds[w] == "live" for w in prompt_words(trainer, batch)])
        assert torch.all(batch["tool_mask"][~live] == 0) and torch.all(batch["advantages"][~live] == 0)
        assert torch.all(batch["tool_mask"][live] == 1)
        # dapo divides by num_items_in_batch: it must count the kept groups' tokens and nothing else
        assert batch["num_items_in_batch"] == batch["completion_mask"][live].sum()


@pytest.mark.slow
def test_kept_advantages_are_eq_8_1_by_hand(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed], {**ON, "max_rounds": 8}, max_steps=3)
    batches, original = [], trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(original(inputs)) or batches[-1]
    trainer.train()
    tok, checked = trainer.processing_class, 0
    for batch in batches:
        for start in range(0, batch["advantages"].numel(), 4):  # rows come in whole groups of 4
            rows = range(start, start + 4)
            r = [(zlib.crc32(tok.decode(batch["completion_ids"][i][batch["completion_mask"][i].bool()],
                                        skip_special_tokens=True).encode()) % 997) / 997 for i in rows]
            mean, std = statistics.mean(r), statistics.stdev(r)  # unbiased, as TRL's nanstd
            expected = [(x - mean) / (std + 1e-4) for x in r]
            assert batch["advantages"][start:start + 4].tolist() == pytest.approx(expected, abs=1e-5)
            checked += 1
    assert checked == 3 * 2


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg",
    [
        dict(gradient_accumulation_steps=2, per_device_train_batch_size=4),  # one generation per optimizer step
        dict(steps_per_generation=2, per_device_train_batch_size=4),  # one generation, two steps: old logps kept
        dict(steps_per_generation=4, gradient_accumulation_steps=2, per_device_train_batch_size=2),  # both
    ],
)
def test_steps_per_generation_and_accumulation(tmp_path, tiny_model_dir, cfg):
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed], ON, max_steps=4, loss_type="dapo", **cfg)
    seen = spy_loss(trainer)
    trainer.train()
    kinds = dict(zip(WORDS, HALF_FLAT))
    assert {kinds[w] for batch in seen for w in prompt_words(trainer, batch)} == {"live"}
    spg = trainer.args.steps_per_generation
    for i in range(0, len(seen), spg):  # micro-batches of one generation share num_items_in_batch = their tokens
        window = seen[i:i + spg]
        assert all(b["num_items_in_batch"] == window[0]["num_items_in_batch"] for b in window)
        assert window[0]["num_items_in_batch"] == sum(b["completion_mask"].sum() for b in window)
    generations = 4 * trainer.args.gradient_accumulation_steps // spg
    assert len([h for h in trainer.state.log_history if "loss" in h]) == 4
    assert max(h["sampling/rounds"] for h in step_logs(trainer)) > 1
    assert len([h for h in trainer.state.log_history if "sampling/rounds" in h]) == generations
    if trainer.args.gradient_accumulation_steps % spg:  # TRL keeps old logps: they must be padded like the rest
        assert all(b["old_per_token_logps"].shape == b["completion_ids"].shape for b in seen)


@pytest.mark.slow
def test_metric_can_be_one_named_reward(tmp_path, tiny_model_dir, caplog):
    # The total (hashed + constant) varies on live prompts, but selection by 'constant' finds no spread anywhere.
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed, constant], {**ON, "metric": "constant", "max_rounds": 2},
                           max_steps=1)
    with caplog.at_level(logging.WARNING, logger="grpokit.trainer.dynamic_sampling"):
        trainer.train()
    (log,) = step_logs(trainer)
    assert log["sampling/frac_groups_dropped"] == 1 and log["sampling/filled_short"] == 1
    assert "spread in 'constant'" in caplog.text


def test_unknown_metric_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=r"sampling.metric: names no reward.*'hashd'.*allowed: reward, hashed"):
        make_trainer(tmp_path, tiny_model_dir, [hashed], {**ON, "metric": "hashd"})


def test_streaming_dataset_is_a_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ValueError, match=r"needs a map-style train_dataset"):
        make_trainer(tmp_path, tiny_model_dir, [hashed], ON, streaming=True)


@pytest.mark.slow
def test_resume_from_checkpoint_draws_the_same_prompts(tmp_path, tiny_model_dir):
    straight = make_trainer(tmp_path / "a", tiny_model_dir, [hashed], ON, max_steps=4)
    straight.train()
    first = make_trainer(tmp_path / "b", tiny_model_dir, [hashed], ON, max_steps=4, save_strategy="steps", save_steps=2)
    first.train()
    resumed = make_trainer(tmp_path / "b", tiny_model_dir, [hashed], ON, max_steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-2"))
    keys = ("sampling/rounds", "sampling/prompts_consumed", "reward")
    after = [[h[k] for k in keys] for h in step_logs(resumed)[2:]]
    assert after == [[h[k] for k in keys] for h in step_logs(straight)[2:]]


@pytest.mark.slow
def test_learns_with_dynamic_sampling(tmp_path, tiny_model_dir):
    from rewards.toy import CharFraction

    trainer = make_trainer(tmp_path, tiny_model_dir, [CharFraction("a")], ON, kinds=["live"] * 8, max_steps=20)
    trainer.train()
    rewards = [h["reward"] for h in step_logs(trainer)]
    assert statistics.mean(rewards[-5:]) > statistics.mean(rewards[:5]) + 0.3, rewards


@pytest.mark.slow
def test_two_processes_keep_groups_whole(tmp_path, tiny_model_dir):
    # Two CPU processes (gloo) run this file as a script; each records what reached its loss.
    here = Path(__file__).resolve()  # the project, and tests/ for the helpers this file imports
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[2]), str(here.parents[1])])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           __file__, str(tmp_path), str(tiny_model_dir)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"torchrun exited {run.returncode}\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    kinds = dict(zip(WORDS, HALF_FLAT))
    for rank in ranks:
        for batch in rank["seen"]:
            assert len(set(batch["words"])) == 1 and kinds[batch["words"][0]] == "live"  # one whole live group
    for a, b in zip(ranks[0]["seen"], ranks[1]["seen"]):  # dapo normaliser: tokens of both ranks' kept groups
        assert a["num_items"] == b["num_items"] == a["local_tokens"] + b["local_tokens"]
    logs = [[{k: v for k, v in h.items() if k.startswith("sampling/")} for h in rank["logs"] if "sampling/rounds" in h]
            for rank in ranks]
    assert logs[0] == logs[1] and max(h["sampling/rounds"] for h in logs[0]) > 1  # ranks took the same decisions


def _two_process_worker(out: str, model_dir: str) -> None:
    torch.set_num_threads(1)
    trainer = make_trainer(Path(out), model_dir, [hashed], {**ON, "max_rounds": 8}, max_steps=2,
                           per_device_train_batch_size=4, loss_type="dapo", ddp_backend="gloo")
    seen, original = [], trainer._compute_loss

    def spy(model, inputs):
        seen.append({"words": prompt_words(trainer, inputs), "num_items": int(inputs["num_items_in_batch"]),
                     "local_tokens": int(inputs["completion_mask"].sum())})
        return original(model, inputs)

    trainer._compute_loss = spy
    trainer.train()
    rank = trainer.accelerator.process_index
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({"seen": seen, "logs": trainer.state.log_history}))
    end_distributed(0)  # as launch.py ends a distributed run (see its docstring)


if __name__ == "__main__":
    _two_process_worker(sys.argv[1], sys.argv[2])


# -- under vLLM: the sampling log-probs and TRL's importance-sampling ratio follow their rows ----------------


class StandInVllm:
    """What TRL 1.16's colocated `VLLMGeneration` hands the trainer, without vLLM: one completion per prompt row
    (`n=1` in colocate mode) and, for every sampled token, the log-prob vLLM reports (here a stand-in value drawn
    per completion, remembered by the completion's tokens so a trained row can be checked against its own)."""

    def __init__(self, vocab_size: int, avoid: set[int], seed: int = 0):
        import random

        self.rng, self.tokens = random.Random(seed), [t for t in range(vocab_size) if t not in avoid]
        self.issued: dict[tuple[int, ...], list[float]] = {}
        self.syncs = 0

    def sync_weights(self):
        self.syncs += 1

    def generate(self, prompts, images, num_generations, profiler):
        completions, logprobs = [], []
        for _ in prompts:
            ids = tuple(self.rng.choice(self.tokens) for _ in range(self.rng.randint(3, 12)))
            assert ids not in self.issued  # each completion identifies its row
            self.issued[ids] = [-self.rng.uniform(0.5, 5.0) for _ in ids]
            completions.append(list(ids))
            logprobs.append([[lp] for lp in self.issued[ids]])  # top-k per token; TRL keeps lp[0]
        return prompts, completions, logprobs, None


def test_vllm_sampling_logprobs_stay_with_their_rows(tmp_path, tiny_model_dir):
    """A batch assembled from several rounds carries, for each kept row, the sampling log-probs vLLM gave that very
    completion and TRL's importance-sampling ratio computed from that row's own tensors; dropped groups leave no row."""
    trainer = make_trainer(tmp_path, tiny_model_dir, [hashed], {**ON, "max_rounds": 8}, max_steps=3)
    tok = trainer.processing_class
    stand_in = StandInVllm(len(tok), {tok.pad_token_id, *trainer.eos_token_ids})
    trainer.use_vllm, trainer.vllm_generation, trainer._last_loaded_step = True, stand_in, -1
    assert trainer.vllm_importance_sampling_correction and trainer.vllm_importance_sampling_mode == "sequence_mask"
    seen = spy_loss(trainer)
    trainer.train()

    assert seen and stand_in.syncs >= 1
    assert max(h.get("sampling/rounds", 1) for h in step_logs(trainer)) > 1  # batches were assembled from rounds
    for batch in seen:
        assert {"sampling_per_token_logps", "importance_sampling_ratio", "old_per_token_logps"} <= batch.keys()
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        for i, (ids, m) in enumerate(zip(batch["completion_ids"], batch["completion_mask"])):
            n = int(m.sum())
            expected = stand_in.issued[tuple(ids[:n].tolist())]  # this row's own completion
            assert batch["sampling_per_token_logps"][i, :n].tolist() == pytest.approx(expected)
        assert set(prompt_words(trainer, batch)) <= {"apple", "cherry", "egg", "grape"}  # flat groups were dropped
        ratio = torch.exp(((batch["old_per_token_logps"] - batch["sampling_per_token_logps"]) * mask).sum(-1))
        expected = torch.where(ratio > trainer.vllm_importance_sampling_clip_max, torch.zeros_like(ratio), ratio)
        assert batch["importance_sampling_ratio"].shape == (len(ratio), 1)
        assert torch.allclose(batch["importance_sampling_ratio"].squeeze(-1), expected, rtol=1e-4, atol=1e-6)
