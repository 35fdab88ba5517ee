"""Repetition: penalise completions that loop, a common failure of small models under RL."""

from __future__ import annotations

import math

from rewards import is_integer, is_number, register, text, token_ids


@register("repetition_penalty")
class RepetitionPenalty:
    """The share of repeated n-grams, scaled to [max_penalty, 0]: 0 for no repeats, max_penalty for one n-gram looped.

    With g_1..g_m the m = N - n + 1 n-grams of the completion's N units (lower-cased words split on
    whitespace, or tokens from `completion_ids` with `unit="tokens"`), as in Yeo et al. 2025,
    "Demystifying Long Chain-of-Thought Reasoning in LLMs":

        r = max_penalty * (1 - |{g_1, ..., g_m}| / m)      (r = 0 when m <= 0)

    Use `unit="tokens"` for text without spaces between words (Chinese, Japanese, code).

    >>> RepetitionPenalty(ngram_size=2)(completions=["a b c d", "a b a b a b", "a"])
    [0.0, -0.6, 0.0]
    """

    def __init__(self, ngram_size: int = 3, max_penalty: float = -1.0, unit: str = "words"):
        if not is_integer(ngram_size) or ngram_size < 1:
            raise ValueError(f"repetition_penalty: ngram_size must be an integer >= 1, got {ngram_size!r}")
        if not is_number(max_penalty) or not -math.inf < max_penalty <= 0:
            raise ValueError(f"repetition_penalty: max_penalty must be a finite number <= 0 (it is a penalty), got {max_penalty!r}")
        if unit not in ("words", "tokens"):
            raise ValueError(f"repetition_penalty: unit must be 'words' or 'tokens', got {unit!r}")
        self.ngram_size, self.max_penalty, self.unit = ngram_size, float(max_penalty), unit

    def __call__(self, completions, completion_ids=None, **kwargs) -> list[float]:
        if self.unit == "tokens":
            ids_list = token_ids("repetition_penalty (unit='tokens')", completions, completion_ids)
            sequences = [[int(t) for t in ids] for ids in ids_list]  # tensors hash by identity
        else:
            sequences = [text(c).lower().split() for c in completions]
        return [self.penalty(seq) for seq in sequences]

    def penalty(self, units: list) -> float:
        n = self.ngram_size
        m = len(units) - n + 1
        if m <= 0:
            return 0.0
        distinct = len(set(zip(*(units[i:] for i in range(n)))))
        return 0.0 if distinct == m else self.max_penalty * (1.0 - distinct / m)
