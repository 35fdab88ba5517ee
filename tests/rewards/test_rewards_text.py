"""What text a completion has, in every shape TRL can pass, and a reward wrapper that never crashes itself.

Rules: a content block whose `text` is None / int / list has text (never an exception), and so does the
error wrapper's own message about it; `[]` and None content have no text ("", not "[]" or "None"); a
reward returning +-inf is refused at run time like NaN.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import rewards
from rewards import Guarded, RewardFailure, text


def msg(content, role="assistant"):
    return {"role": role, "content": content}


# (completion, its text) -- one comment per shape
SHAPES = [
    ("plain", "plain"),  # a plain-text completion
    ("", ""),  # empty
    (None, ""),  # no completion at all
    ([], ""),  # an empty conversation: no text, not "[]"
    ([msg("hi")], "hi"),  # conversational, one message
    ([msg("first"), msg("tool says 3", "tool"), msg("so 3")], "so 3"),  # multi-turn: the last message
    ([msg(None)], ""),  # content None (a tool-call-only message): no text, not "None"
    ([{"role": "assistant"}], ""),  # no content key
    ([msg([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])], "ab"),  # content blocks
    ([msg([{"type": "text", "text": None}])], ""),  # block text None
    ([msg([{"type": "text", "text": 42}])], "42"),  # block text a number
    ([msg([{"type": "text", "text": ["x", {"text": "y"}]}])], "xy"),  # block text a list
    ([msg([{"type": "image", "url": "u"}, {"type": "text", "text": "c"}])], "c"),  # a non-text block has no text
    ([msg(["raw", "strings"])], "rawstrings"),  # blocks as bare strings
    ([msg(7)], "7"),  # content a number
    ([msg({"type": "text", "text": "one block"})], "one block"),  # content a single block
    (msg("bare message"), "bare message"),  # one message, not in a list
    (["not", "messages"], ""),  # a list of plain strings is not a conversation
    ([None], ""),  # a list holding None
    (b"bytes", "bytes"),  # bytes, decoded
    (3.5, "3.5"),  # a number
    (object(), ""),  # anything else has no text
]


@pytest.mark.parametrize("completion, expected", SHAPES)
def test_text_of_every_shape(completion, expected):
    assert text(completion) == expected


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


def test_text_of_an_object_that_cannot_be_printed():
    assert text(Unprintable()) == ""
    assert text([msg([{"text": Unprintable()}])]) == ""


def test_deeply_nested_blocks_do_not_recurse_forever():
    deep = "x"
    for _ in range(5000):
        deep = [{"text": deep}]
    assert isinstance(text([msg(deep)]), str)


leaf = st.one_of(st.none(), st.text(max_size=20), st.integers(), st.floats(allow_nan=True), st.booleans(),
                 st.binary(max_size=8))
block = st.recursive(
    leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["type", "text", "content", "role"]), inner, max_size=3)),
    max_leaves=12,
)
completion_shapes = st.one_of(
    st.text(max_size=50),
    st.none(),
    block,
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["assistant", "tool", "user"])},
                                   optional={"content": block}), max_size=3),
)


@settings(max_examples=300, deadline=None, database=None)
@given(completion=completion_shapes)
def test_text_is_total(completion):
    assert isinstance(text(completion), str)


# The text rewards, built as a recipe would (accuracy is covered by its own property test).
TEXT_REWARDS = [("think_format", {}), ("think_format", {"answer_tag": True}), ("repetition_penalty", {}),
                ("char_fraction", {}), ("tag_count", {}), ("reasoning_steps", {})]


@settings(max_examples=200, deadline=None, database=None)
@given(completions=st.lists(completion_shapes, min_size=1, max_size=4))
def test_text_rewards_never_crash_on_odd_completions(completions):
    for name, args in TEXT_REWARDS:
        out = rewards.build(name, **args)(completions=completions, prompts=["p"] * len(completions))
        assert len(out) == len(completions) and all(isinstance(v, float) and math.isfinite(v) for v in out)


def always_raises(completions, **kwargs):
    raise ValueError("grader down")


@settings(max_examples=200, deadline=None, database=None)
@given(completions=st.lists(completion_shapes, min_size=1, max_size=3))
@example(completions=[[msg([{"type": "text", "text": None}])]])  # seen: TypeError while writing the message
def test_the_error_wrapper_always_writes_its_message(completions):
    with pytest.raises(RewardFailure, match="reward 'always_raises' raised on sample 0: ValueError: grader down"):
        Guarded("always_raises", always_raises)(completions=completions)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, float("-inf")])
def test_non_finite_rewards_are_refused(value):
    def bad(completions, **kwargs):
        return [0.0, value]

    with pytest.raises(RewardFailure, match=r"reward 'bad' returned (NaN|[+-]?inf) for sample 1.*None to abstain"):
        Guarded("bad", bad)(completions=["a", "b"])


def test_a_returned_value_that_cannot_be_printed_is_still_reported():
    def odd(completions, **kwargs):
        return [Unprintable()]

    with pytest.raises(RewardFailure, match="reward 'odd' returned .* for sample 0"):
        Guarded("odd", odd)(completions=[[msg([{"text": None}])]])


@settings(max_examples=30, deadline=None, database=None)
@given(completions=st.lists(completion_shapes, min_size=1, max_size=3))
def test_answer_rewards_never_crash_on_odd_completions(completions):
    n = len(completions)
    batch = dict(completions=completions, prompts=["p"] * n, completion_ids=[[1, 2]] * n, answer=["42"] * n)
    for name, args in [("accuracy", {}), ("reasoning_accuracy", {}), ("cosine_scaled", {"max_length": 8}),
                       ("len_reward", {})]:
        out = rewards.build(name, **args)(**batch)
        assert len(out) == n and all(v is None or math.isfinite(v) for v in out)
