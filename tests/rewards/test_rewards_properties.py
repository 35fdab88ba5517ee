"""Property tests: no built-in reward raises or hangs on arbitrary text, Unicode, very long or empty input.

Every call runs on a non-main thread (as TRL's async reward path may) and must finish: the bound is
generous, it only catches a hang.
"""

import math
import threading

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rewards.format import ReasoningSteps, TagCount, ThinkFormat
from rewards.length import CosineScaled, OverlongPenalty
from rewards.math import Accuracy
from rewards.repetition import RepetitionPenalty

FRAGMENTS = [
    "\\boxed{", "{", "}", "\\{", "\\", "<think>", "</think>", "<answer>", "</answer>", "####", "\n", " ",
    "42", "-0", "1,234", "1/0", "0.5", "e999", "%", "$", "\\frac{", "9^{", "\\sqrt", "\\pi", "x", "=", "(", "]",
]
texts = st.one_of(
    st.text(max_size=300),  # arbitrary Unicode, including surrogate-free control characters
    st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join),  # the syntax the rewards look for
)
golds = st.one_of(st.sampled_from(["42", "#### 7", "\\frac{1}{2}", "", "x^2", None]), st.text(max_size=30))
LONG = "<think>" + "so 1 + 1 = 2, " * 20_000 + "</think> \\boxed{" + "{" * 5_000 + "2"  # ~300k chars, unclosed
SETTINGS = settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

ACCURACY = Accuracy(timeout=1.0)
COSINE = CosineScaled(max_length=64, exceed_penalty=-2.0)
OTHERS = [
    (ThinkFormat(), lambda v: v in (0.0, 1.0)),
    (ThinkFormat(answer_tag=True, think_in_prompt=True), lambda v: v in (0.0, 1.0)),
    (OverlongPenalty(max_length=64, buffer=16, penalty_factor=1.0), lambda v: -1.0 <= v <= 0.0),
    (RepetitionPenalty(ngram_size=3), lambda v: -1.0 <= v <= 0.0),
    (RepetitionPenalty(ngram_size=2, unit="tokens"), lambda v: -1.0 <= v <= 0.0),
    (TagCount(), lambda v: 0.0 <= v <= 1.0),
    (ReasoningSteps(), lambda v: 0.0 <= v <= 1.0),
]


def call_bounded(reward, **kwargs):
    out = []
    worker = threading.Thread(target=lambda: out.append(reward(**kwargs)), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), f"{type(reward).__name__} did not return"
    assert out, f"{type(reward).__name__} raised (see the thread's traceback above)"
    return out[0]


def args_for(s: str, gold, conversational: bool) -> dict:
    completion = [{"role": "assistant", "content": s}] if conversational else s
    return dict(prompts=["p"], completions=[completion], completion_ids=[[ord(c) % 7 for c in s[:200]]],
                answer=[gold], trainer_state=None)


@SETTINGS
@given(s=texts, gold=golds, conversational=st.booleans())
@example(s="", gold="42", conversational=False)
@example(s=LONG, gold="2", conversational=True)
@example(s="\\boxed{" * 3000 + "1" + "}" * 3000, gold="1", conversational=False)
def test_accuracy_total(s, gold, conversational):
    (value,) = call_bounded(ACCURACY, **args_for(s, gold, conversational))
    assert value in (0.0, 1.0, None)


@SETTINGS
@given(s=texts, gold=golds)
@example(s=LONG, gold="2")
def test_cosine_total(s, gold):
    (value,) = call_bounded(COSINE, **args_for(s, gold, False))
    assert value is None or value == -2.0 or -1.0 <= value <= 1.0


@settings(max_examples=150, deadline=None, database=None)
@given(s=texts, conversational=st.booleans())
@example(s="", conversational=False)
@example(s=LONG, conversational=True)
@example(s="go " * 100_000, conversational=False)
def test_other_rewards_total(s, conversational):
    for reward, in_range in OTHERS:
        (value,) = call_bounded(reward, **args_for(s, None, conversational))
        assert isinstance(value, float) and math.isfinite(value) and in_range(value), (reward, value)
