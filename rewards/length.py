"""Length-aware rewards, all on token counts (`completion_ids`), which is what the trainer's budget is in."""

from __future__ import annotations

import math

from rewards import is_integer, is_number, register, token_ids
from rewards.math import Accuracy


def _token_counts(name: str, completions, completion_ids) -> list[int]:
    return [len(ids) for ids in token_ids(name, completions, completion_ids)]


def _check_length(name: str, value) -> int:
    if value is None:
        raise ValueError(
            f"{name} needs max_length; from a recipe it defaults to trainer.max_completion_length, "
            "so set that or pass args: {max_length: <tokens>}"
        )
    if not is_integer(value) or value <= 0:
        raise ValueError(f"{name}: max_length must be a positive integer number of tokens, got {value!r}")
    return value


@register("overlong_penalty", from_recipe={"max_length": "trainer.max_completion_length"})
class OverlongPenalty:
    """DAPO's soft overlong punishment: 0 up to `max_length - buffer` tokens, then a linear ramp to -penalty_factor.

    With L = len(completion_ids), L_max = max_length, C = buffer, p = penalty_factor (Yu et al. 2025,
    "DAPO", eq. 13):

        r = 0                        if L <= L_max - C
        r = p * (L_max - C - L) / C  if L_max - C < L <= L_max
        r = -p                       if L > L_max

    `max_length` defaults to the recipe's `trainer.max_completion_length`; `buffer` must be in
    (0, max_length]. Add it to a correctness reward so a truncated completion is not punished as if wrong.

    >>> OverlongPenalty(max_length=100, buffer=20)(completions=["", "", ""], completion_ids=[[0] * 80, [0] * 90, [0] * 120])
    [0.0, -0.5, -1.0]
    """

    def __init__(self, *, max_length: int | None = None, buffer: int, penalty_factor: float = 1.0):
        self.max_length = _check_length("overlong_penalty", max_length)
        if not is_integer(buffer) or not 0 < buffer <= self.max_length:
            raise ValueError(
                f"overlong_penalty: buffer ({buffer!r}) must be an integer in (0, max_length] = (0, {self.max_length}]; "
                f"lower buffer or raise max_length (by default trainer.max_completion_length)"
            )
        if not is_number(penalty_factor) or not 0 <= penalty_factor < math.inf:  # inf: -inf rewards, loss 0
            raise ValueError(f"overlong_penalty: penalty_factor must be a finite number >= 0, got {penalty_factor!r}")
        self.buffer = buffer
        self.penalty_factor = float(penalty_factor)

    def __call__(self, completions, completion_ids=None, **kwargs) -> list[float]:
        free = self.max_length - self.buffer
        out = []
        for n in _token_counts("overlong_penalty", completions, completion_ids):
            if n <= free:
                out.append(0.0)
            elif n <= self.max_length:
                out.append(self.penalty_factor * (free - n) / self.buffer)
            else:
                out.append(-self.penalty_factor)
        return out


@register("cosine_scaled", from_recipe={"max_length": "trainer.max_completion_length"})
class CosineScaled:
    """Correctness shaped by length on a cosine schedule: short right answers earn most, short wrong ones lose most.

    From Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning in LLMs", eq. 1. With
    L = len(completion_ids), L_max = max_length and t = min(L, L_max) / L_max:

        r = lo + (hi - lo) * (1 + cos(pi * t)) / 2

    where (lo, hi) = (min_value_correct, max_value_correct) for a correct answer, so r falls from
    max_value_correct at L = 0 to min_value_correct at L_max, and (lo, hi) = (max_value_wrong,
    min_value_wrong) for a wrong one, so r rises from min_value_wrong to max_value_wrong: a long wrong
    attempt is punished less than a short one, which keeps the model thinking on hard problems. With
    `exceed_penalty` set, a completion with L >= L_max (cut off) gets that value instead. Correctness is
    `accuracy` with `gold_column`, `allow_last_number` and `timeout`; None when the gold cannot be parsed.

    >>> r = CosineScaled(max_length=100)
    >>> r(completions=["\\\\boxed{4}", "\\\\boxed{5}"], completion_ids=[[0] * 0, [0] * 100], answer=["4", "4"])
    [1.0, -0.5]
    """

    def __init__(self, max_length: int | None = None, min_value_correct: float = 0.5, max_value_correct: float = 1.0,
                 min_value_wrong: float = -1.0, max_value_wrong: float = -0.5, exceed_penalty: float | None = None,
                 gold_column: str = "answer", allow_last_number: bool = False, timeout: float = 1.0):
        self.max_length = _check_length("cosine_scaled", max_length)
        values = dict(min_value_correct=min_value_correct, max_value_correct=max_value_correct,
                      min_value_wrong=min_value_wrong, max_value_wrong=max_value_wrong)
        for key, value in values.items():
            if not is_number(value) or not math.isfinite(value):
                raise ValueError(f"cosine_scaled: {key} must be a finite number, got {value!r}")
        if min_value_correct > max_value_correct:
            raise ValueError(f"cosine_scaled: min_value_correct ({min_value_correct}) must be <= max_value_correct ({max_value_correct})")
        if min_value_wrong > max_value_wrong:
            raise ValueError(f"cosine_scaled: min_value_wrong ({min_value_wrong}) must be <= max_value_wrong ({max_value_wrong})")
        if exceed_penalty is not None and not (is_number(exceed_penalty) and math.isfinite(exceed_penalty)):
            raise ValueError(f"cosine_scaled: exceed_penalty must be a finite number or null, got {exceed_penalty!r}")
        self.min_value_correct, self.max_value_correct = float(min_value_correct), float(max_value_correct)
        self.min_value_wrong, self.max_value_wrong = float(min_value_wrong), float(max_value_wrong)
        self.exceed_penalty = None if exceed_penalty is None else float(exceed_penalty)
        self.accuracy = Accuracy(gold_column=gold_column, allow_last_number=allow_last_number, timeout=timeout)

    def __call__(self, completions, completion_ids=None, **kwargs) -> list[float | None]:
        lengths = _token_counts("cosine_scaled", completions, completion_ids)
        correct = self.accuracy(completions=completions, completion_ids=completion_ids, **kwargs)
        out: list[float | None] = []
        for n, verdict in zip(lengths, correct):
            if verdict is None:
                out.append(None)
            elif self.exceed_penalty is not None and n >= self.max_length:
                out.append(self.exceed_penalty)
            else:
                lo, hi = ((self.min_value_correct, self.max_value_correct) if verdict == 1.0
                          else (self.max_value_wrong, self.min_value_wrong))
                t = min(n, self.max_length) / self.max_length
                out.append(lo + (hi - lo) * (1.0 + math.cos(math.pi * t)) / 2.0)
        return out


def _group_key(prompt) -> str:
    """A hashable key for a prompt, plain or conversational (a list of message dicts)."""
    return prompt if isinstance(prompt, str) else repr(prompt)


@register("len_reward")
class LenReward:
    """Kimi 1.5's length reward: within each prompt's group, shorter than average earns, longer loses.

    From Kimi Team 2025, "Kimi k1.5: Scaling Reinforcement Learning with LLMs", section 2.3.3. For the
    completions of one prompt, with L = len(completion_ids) and min, max over that group:

        lambda = 0.5 - (L - min) / (max - min)
        r = lambda            for a correct answer
        r = min(0, lambda)    for a wrong one        (r = 0 for all when max = min)

    so among right answers the shortest gets +0.5 and the longest -0.5, and a wrong answer is never
    paid for being short. Correctness is `accuracy` (`gold_column`, `allow_last_number`, `timeout`);
    None when the gold cannot be checked. Groups are the completions with the same prompt in the call.
    Unlike open-r1's `len_reward`, which takes min and max over the whole batch (several prompts), each
    prompt gets its own range (a long problem's completions would otherwise set the scale for a short
    one's), and lengths are tokens, which is what the trainer's budget is in, not characters.

    >>> LenReward()(prompts=["q"] * 3, completions=["\\\\boxed{1}"] * 3, completion_ids=[[0] * 10, [0] * 20, [0] * 30],
    ...             answer=["1", "1", "2"])
    [0.5, 0.0, -0.5]
    """

    def __init__(self, gold_column: str = "answer", allow_last_number: bool = False, timeout: float = 1.0):
        self.accuracy = Accuracy(gold_column=gold_column, allow_last_number=allow_last_number, timeout=timeout)

    def __call__(self, completions, prompts=None, completion_ids=None, **kwargs) -> list[float | None]:
        lengths = _token_counts("len_reward", completions, completion_ids)
        correct = self.accuracy(completions=completions, completion_ids=completion_ids, **kwargs)
        if prompts is None or len(prompts) != len(completions):
            raise ValueError(f"len_reward groups completions by prompt and needs `prompts`, one per completion "
                             f"(TRL's GRPOTrainer passes them); got {'none' if prompts is None else len(prompts)}")
        groups: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(_group_key(prompt), []).append(i)
        out: list[float | None] = [None] * len(completions)
        for members in groups.values():
            lo, hi = min(lengths[i] for i in members), max(lengths[i] for i in members)
            for i in members:
                if correct[i] is None:
                    continue
                lam = 0.0 if hi == lo else 0.5 - (lengths[i] - lo) / (hi - lo)
                out[i] = lam if correct[i] == 1.0 else min(0.0, lam)
        return out
