"""overlong_penalty (DAPO) and cosine_scaled (Demystifying Long CoT), on token counts."""

import math

import pytest

import rewards
from rewards.length import CosineScaled, OverlongPenalty


def conv(s):
    return [{"role": "assistant", "content": s}]


# (L tokens, expected) with max_length=100, buffer=20, penalty_factor=2
OVERLONG = [
    (0, 0.0),  # empty
    (80, 0.0),  # exactly L_max - C: still free
    (81, -0.1),  # one token into the buffer: 2 * (80 - 81) / 20
    (90, -1.0),  # half way through the buffer
    (100, -2.0),  # exactly L_max: the full penalty
    (101, -2.0),  # past L_max: -penalty_factor
]


@pytest.mark.parametrize("n, expected", OVERLONG)
def test_overlong_penalty(n, expected):
    reward = OverlongPenalty(max_length=100, buffer=20, penalty_factor=2.0)
    assert reward(completions=["x"], completion_ids=[[0] * n]) == pytest.approx([expected])
    assert reward(completions=[conv("x")], completion_ids=[[0] * n], answer=["1"]) == pytest.approx([expected])


def test_overlong_buffer_equal_to_max_length():
    # C = L_max: the ramp starts at 0 tokens
    assert OverlongPenalty(max_length=10, buffer=10)(completions=["", ""], completion_ids=[[], [0] * 5]) == [0.0, -0.5]


# (args, what the message must say)
OVERLONG_BAD = [
    ({"max_length": 1024, "buffer": 2048}, r"buffer \(2048\) must be an integer in \(0, max_length\] = \(0, 1024\]"),  # buffer too large
    ({"max_length": 1024, "buffer": 0}, "buffer"),  # no buffer at all
    ({"max_length": 1024, "buffer": -5}, "buffer"),  # negative buffer
    ({"max_length": 1024, "buffer": 1.5}, "buffer"),  # fractional tokens
    ({"buffer": 10}, "max_completion_length"),  # no max_length outside a recipe: say where it comes from
    ({"max_length": 0, "buffer": 1}, "max_length"),  # empty budget
    ({"max_length": 100, "buffer": 10, "penalty_factor": -1}, "penalty_factor"),  # a bonus, not a penalty
    ({"max_length": 100, "buffer": 10, "penalty_factor": float("inf")}, "penalty_factor"),  # -inf rewards, loss 0
    ({"max_length": 100, "buffer": 10, "penalty_factor": float("nan")}, "penalty_factor"),
]


@pytest.mark.parametrize("args, message", OVERLONG_BAD)
def test_overlong_bad_args(args, message):
    with pytest.raises(ValueError, match=message):
        OverlongPenalty(**args)


def test_overlong_registry_error_and_recipe_default():
    with pytest.raises(rewards.RewardError, match="buffer"):
        rewards.build("overlong_penalty", max_length=1024, buffer=2048)
    assert rewards.entry("overlong_penalty").from_recipe == {"max_length": "trainer.max_completion_length"}
    with pytest.raises(rewards.RewardError, match="needs argument"):
        rewards.bind("overlong_penalty", {})  # buffer has no default


def test_overlong_needs_completion_ids():
    with pytest.raises(ValueError, match="completion_ids"):
        OverlongPenalty(max_length=10, buffer=5)(completions=["x"])


def cosine(lo, hi, t):
    return lo + (hi - lo) * (1 + math.cos(math.pi * t)) / 2


# (completion, gold, L tokens, expected) with max_length=100 and the default values
COSINE = [
    (r"\boxed{4}", "4", 0, 1.0),  # right and instant: max_value_correct
    (r"\boxed{4}", "4", 50, 0.75),  # right at half length: half way down
    (r"\boxed{4}", "4", 100, 0.5),  # right at the limit: min_value_correct
    (r"\boxed{4}", "4", 150, 0.5),  # past the limit: clamped
    (r"\boxed{5}", "4", 0, -1.0),  # wrong and instant: min_value_wrong, the worst
    (r"\boxed{5}", "4", 25, cosine(-0.5, -1.0, 0.25)),  # wrong, a quarter in
    (r"\boxed{5}", "4", 100, -0.5),  # wrong after using the whole budget: max_value_wrong
    ("no answer", "4", 10, cosine(-0.5, -1.0, 0.1)),  # no answer counts as wrong
    (r"\boxed{4}", "", 10, None),  # gold missing: does not apply
]


@pytest.mark.parametrize("completion, gold, n, expected", COSINE)
def test_cosine_scaled(completion, gold, n, expected):
    reward = CosineScaled(max_length=100)
    got = reward(completions=[completion], completion_ids=[[0] * n], answer=[gold], trainer_state=None)
    assert got == ([None] if expected is None else pytest.approx([expected]))
    assert reward(completions=[conv(completion)], completion_ids=[[0] * n], answer=[gold]) == got


def test_cosine_exceed_penalty():
    reward = CosineScaled(max_length=10, exceed_penalty=-10.0)
    got = reward(completions=[r"\boxed{4}", r"\boxed{4}"], completion_ids=[[0] * 9, [0] * 10], answer=["4", "4"])
    assert got[1] == -10.0 and got[0] > 0.5  # cut off at the limit: the flat penalty, right or not


@pytest.mark.parametrize("args, message", [
    ({}, "max_completion_length"),  # no max_length outside a recipe
    ({"max_length": 10, "min_value_correct": 2.0}, "min_value_correct"),  # correct range upside down
    ({"max_length": 10, "min_value_wrong": 0.0}, "min_value_wrong"),  # wrong range upside down
    ({"max_length": 10, "timeout": -1}, "timeout"),  # passed on to accuracy
    ({"max_length": 10, "exceed_penalty": float("-inf")}, "exceed_penalty"),  # a non-finite reward
    ({"max_length": 10, "exceed_penalty": float("nan")}, "exceed_penalty"),
])
def test_cosine_bad_args(args, message):
    with pytest.raises(ValueError, match=message):
        CosineScaled(**args)


# len_reward (Kimi 1.5): per prompt group, lambda = 0.5 - (L - min) / (max - min); correct gets lambda,
# wrong gets min(0, lambda); all lengths equal gives 0.
def test_len_reward_within_each_prompts_group():
    from rewards.length import LenReward

    completions = [r"\boxed{4}", r"\boxed{4}", r"\boxed{5}", r"\boxed{5}",  # prompt A: lengths 10, 20, 10, 30
                   r"\boxed{7}", r"\boxed{8}"]  # prompt B: lengths 5, 5 (all equal)
    got = LenReward()(prompts=["A", "A", "A", "A", "B", "B"], completions=completions,
                      completion_ids=[[0] * n for n in (10, 20, 10, 30, 5, 5)], answer=["4"] * 4 + ["7", "7"])
    # A: min 10, max 30. L=10: 0.5 (right), L=20: 0.0 (right), L=10 wrong: min(0, 0.5) = 0, L=30 wrong: -0.5
    assert got == [0.5, 0.0, 0.0, -0.5, 0.0, 0.0]


def test_len_reward_groups_by_prompt_not_by_batch():
    from rewards.length import LenReward

    # open-r1 takes min and max over the whole batch; a long prompt's completions would then punish a
    # short prompt's. Two prompts, each with its own range.
    got = LenReward()(prompts=["A", "A", "B", "B"], completions=[r"\boxed{1}"] * 4,
                      completion_ids=[[0] * n for n in (1, 2, 100, 200)], answer=["1"] * 4)
    assert got == [0.5, -0.5, 0.5, -0.5]


def test_len_reward_conversational_prompts_and_unknown_gold():
    from rewards.length import LenReward

    prompt = [{"role": "user", "content": "q"}]
    got = LenReward()(prompts=[prompt, prompt], completions=[conv(r"\boxed{1}"), conv(r"\boxed{2}")],
                      completion_ids=[[0] * 3, [0] * 9], answer=["forty two", "forty two"])
    assert got == [None, None]  # the gold cannot be checked: no correctness, no length shaping


def test_len_reward_needs_token_ids():
    from rewards.length import LenReward

    with pytest.raises(ValueError, match="completion_ids"):
        LenReward()(prompts=["A"], completions=["x"], answer=["1"])
