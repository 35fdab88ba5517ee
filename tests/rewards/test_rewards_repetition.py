"""repetition_penalty: max_penalty * (1 - distinct n-grams / n-grams)."""

import pytest

from rewards.repetition import RepetitionPenalty


def conv(s):
    return [{"role": "assistant", "content": s}]


# (completion, ngram_size, expected)
WORDS = [
    ("the cat sat on the mat", 3, 0.0),  # no repeated trigram
    ("a b a b a b", 2, -0.6),  # 5 bigrams, 2 distinct: -(1 - 2/5)
    ("go go go go", 1, -0.75),  # 4 unigrams, 1 distinct
    ("A b a B", 1, -0.5),  # words are lower-cased before counting
    ("too short", 3, 0.0),  # fewer words than n: no n-grams, no penalty
    ("", 3, 0.0),  # empty completion
]


@pytest.mark.parametrize("completion, n, expected", WORDS)
def test_repetition_words(completion, n, expected):
    reward = RepetitionPenalty(ngram_size=n)
    assert reward(completions=[completion]) == pytest.approx([expected])
    assert reward(completions=[conv(completion)]) == pytest.approx([expected])  # conversational agrees


# (completion_ids, expected) with unit="tokens", ngram_size=2, max_penalty=-2
TOKENS = [
    ([1, 2, 3, 4], 0.0),  # all bigrams distinct
    ([7, 7, 7, 7, 7], -1.5),  # 4 bigrams, 1 distinct: -2 * 3/4
    ([5], 0.0),  # one token: no bigram
]


@pytest.mark.parametrize("ids, expected", TOKENS)
def test_repetition_tokens(ids, expected):
    reward = RepetitionPenalty(ngram_size=2, max_penalty=-2.0, unit="tokens")
    assert reward(completions=["ignored"], completion_ids=[ids], trainer_state=None) == pytest.approx([expected])


@pytest.mark.parametrize("args", [
    {"ngram_size": 0},  # no n-grams of size 0
    {"max_penalty": 0.5},  # a positive "penalty" would reward loops
    {"max_penalty": float("-inf")},  # a non-finite reward
    {"unit": "chars"},  # unknown unit
])
def test_repetition_bad_args(args):
    with pytest.raises(ValueError, match="repetition_penalty"):
        RepetitionPenalty(**args)
