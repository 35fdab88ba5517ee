"""accuracy: answer extraction, fast numeric equality, math-verify in worker processes, time bound from any thread."""

import pickle
import threading
from fractions import Fraction

import pytest

import rewards
from rewards.math import Accuracy, extract_answer, gold_answer, numbers_equal, parse_number

PATHOLOGICAL = r"\boxed{9^{9^{9^{9^{9^{9}}}}}}"


def conv(s):
    return [{"role": "assistant", "content": s}]


# (completion, gold, expected)
ACCURACY = [
    (r"so \boxed{42}", "42", 1.0),  # boxed plain number
    (r"\boxed{41}", "42", 0.0),  # wrong number
    (r"first \boxed{1} then \boxed{2}", "2", 1.0),  # the last box counts
    (r"\boxed{1} finally \boxed{2}", "1", 0.0),  # ... and only the last
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),  # nested braces inside the box; 1/2 = 0.5
    (r"<answer>7</answer>", "7", 1.0),  # answer tags
    (r"<answer>7</answer> but \boxed{8}", "7", 0.0),  # a box beats answer tags
    ("2 + 2 = 4\n#### 4", "4", 1.0),  # GSM8K marker in the completion
    ("#### 4", "Natalia sold 2+2 = <<2+2=4>>4 clips.\n#### 4", 1.0),  # a full GSM8K solution as gold
    (r"\boxed{1,234}", "1234", 1.0),  # thousands separators
    (r"\boxed{1{,}234}", "1,234", 1.0),  # LaTeX's {,} separator
    (r"\boxed{\$5}", "5", 1.0),  # currency sign
    (r"\boxed{$12.50$}", "12.5", 1.0),  # math dollars and a trailing zero
    (r"\boxed{50\%}", "50", 1.0),  # percent against the bare number
    (r"\boxed{50\%}", "0.5", 1.0),  # ... and against the fraction (as math-verify)
    (r"\boxed{42.000}", "42", 1.0),  # trailing zeros
    (r"\boxed{-0}", "0", 1.0),  # negative zero
    (r"\boxed{1/2}", "0.5", 1.0),  # slash fraction against a decimal
    (r"\boxed{1.5e3}", "1500", 1.0),  # scientific notation
    (r"\boxed{1.5 \times 10^{3}}", "1500", 1.0),  # LaTeX scientific notation
    (r"\boxed{0.333333}", "1/3", 1.0),  # decimals compare to 6 places (as math-verify)
    (r"\boxed{0.33}", "1/3", 0.0),  # ... not fewer
    (r"\boxed{42.}", "42", 1.0),  # sentence full stop after the number
    ("the answer is 42", "42", 0.0),  # no marked answer and the last-number fallback is off
    (r"\boxed{}", "42", 0.0),  # an empty box is no answer
    (r"\boxed{42", "42", 0.0),  # an unclosed box is no answer
    (r"\boxed{\frac{\pi}{2}}", r"\frac{\pi}{2}", 1.0),  # math-verify: pi
    (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),  # math-verify: roots simplify
    (r"\boxed{\frac{84}{2}}", "42", 1.0),  # not a plain number on one side: math-verify decides
    (r"\boxed{[0, 1)}", r"[0,1)", 1.0),  # math-verify: intervals
    (r"\boxed{[0, 1]}", r"[0,1)", 0.0),  # ... closed is not half-open
    (r"\boxed{\{2, 1\}}", r"\{1,2\}", 1.0),  # math-verify: sets, any order
    (r"\boxed{x^2+1}", "1+x^2", 1.0),  # math-verify: polynomials
    (r"<answer>The answer is 42</answer>", "42", 1.0),  # prose inside the answer tags
    ("no answer here", r"\frac{\pi}{2}", 0.0),  # no answer, LaTeX gold that parses: 0.0 not None
    (r"\boxed{42}", "", None),  # empty gold: does not apply
    (r"\boxed{42}", None, None),  # missing gold: does not apply
    (r"\boxed{42}", r"\boxed{}", None),  # gold that is an empty box: cannot be parsed
    (PATHOLOGICAL, "42", 0.0),  # bignum tower: killed at the time limit, scores 0.0
]


def test_accuracy_table():
    reward = Accuracy()
    completions = [c for c, _, _ in ACCURACY]
    golds = [g for _, g, _ in ACCURACY]
    got = reward(completions=completions, answer=golds)
    wrong = [(c, g, e, r) for (c, g, e), r in zip(ACCURACY, got) if r != e]
    assert not wrong, wrong


def test_accuracy_conversational_and_extra_kwargs():
    reward = Accuracy()
    got = reward(prompts=["q", "q"], completions=[conv(r"\boxed{3}"), conv(r"\boxed{\sqrt{9}}")],
                 completion_ids=[[1], [2]], answer=["3", "3"], trainer_state=None, log_extra=None, other=[0, 0])
    assert got == [1.0, 1.0]


# (completion, gold, expected) with allow_last_number=True
LAST_NUMBER = [
    ("the answer is 42", "42", 1.0),  # the last number counts when turned on
    ("41 or maybe 42", "41", 0.0),  # only the last
    ("it costs 1,234 dollars", "1234", 1.0),  # separators in the fallback
    (r"\boxed{7} and 8", "7", 1.0),  # a marked answer still wins
    ("no digits", "42", 0.0),  # nothing to find
]


def test_accuracy_last_number_fallback():
    got = Accuracy(allow_last_number=True)(completions=[c for c, _, _ in LAST_NUMBER], answer=[g for _, g, _ in LAST_NUMBER])
    assert got == [e for _, _, e in LAST_NUMBER]


def test_accuracy_gold_column():
    assert Accuracy(gold_column="solution")(completions=[r"\boxed{2}"], solution=["2"]) == [1.0]  # another column


def test_accuracy_missing_column_names_it():
    with pytest.raises(ValueError, match="'answer'.*columns: solution"):
        Accuracy()(completions=["x"], solution=["2"])


@pytest.mark.parametrize("args, message", [
    ({"gold_column": ""}, "gold_column"),  # no column name
    ({"timeout": 0}, "timeout"),  # no time to verify
    ({"workers": 0}, "workers"),  # no process to verify in
])
def test_accuracy_bad_args(args, message):
    with pytest.raises(rewards.RewardError, match=message):
        rewards.build("accuracy", **args)


def test_accuracy_pickles_after_use():
    reward = Accuracy(gold_column="ans", allow_last_number=True)
    before = reward(completions=[r"\boxed{\sqrt{4}}", "5"], ans=["2", "5"])
    clone = pickle.loads(pickle.dumps(reward))
    assert clone(completions=[r"\boxed{\sqrt{4}}", "5"], ans=["2", "5"]) == before == [1.0, 1.0]


def test_pathological_input_from_a_thread_is_bounded():
    # math-verify's own timeout needs the main thread and a bignum power holds the GIL: only a
    # separate process bounds this. Seen without it: no answer after 45 s, caller frozen.
    result = []
    worker = threading.Thread(target=lambda: result.append(Accuracy()(completions=[PATHOLOGICAL], answer=["42"])), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert result == [[0.0]]


# (text, expected answer)
EXTRACT = [
    (r"\boxed{\frac{a}{\sqrt{b}}}", r"\frac{a}{\sqrt{b}}"),  # nested braces
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are not grouping braces
    (r"\boxed{\boxed{3}}", "3"),  # the innermost of nested boxes starts last
    (r"\boxed{1} \boxed{2", "1"),  # an unclosed last box: the previous complete one
    (r"\fbox{5}", "5"),  # \fbox is a box too
    ("<answer> 6 </answer>", "6"),  # answer tags, stripped
    ("<answer></answer> #### 9", "9"),  # an empty tag falls through to ####
    ("#### 12\nmore text", "12"),  # #### reads to the end of its line
    ("nothing", None),  # no answer
]


@pytest.mark.parametrize("s, expected", EXTRACT)
def test_extract_answer(s, expected):
    assert extract_answer(s) == expected


# (gold cell, expected gold answer)
GOLD = [
    ("Janet has 3 eggs.\n#### 1,000", "1,000"),  # GSM8K solution
    (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),  # MATH solution
    (42, "42"),  # a number cell
    ("  7 ", "7"),  # whitespace
    ("", None),  # empty
    (None, None),  # missing
]


@pytest.mark.parametrize("cell, expected", GOLD)
def test_gold_answer(cell, expected):
    assert gold_answer(cell) == expected


# (text, expected value, or None when not a plain number)
NUMBERS = [
    ("42", Fraction(42)),  # integer
    ("-3.50", Fraction(-7, 2)),  # signed decimal
    (".5", Fraction(1, 2)),  # no leading zero
    ("1,234,567", Fraction(1234567)),  # separators
    ("1,23", None),  # not a thousands grouping: maybe a tuple, math-verify decides
    (r"\$1{,}000.00", Fraction(1000)),  # LaTeX dollar and separator
    ("2.5e-3", Fraction(1, 400)),  # scientific notation
    ("1e999999", None),  # an exponent too large to expand: math-verify decides
    (r"\frac{3}{4}", Fraction(3, 4)),  # LaTeX fraction
    (r"-\dfrac{3}{4}", Fraction(-3, 4)),  # signed display fraction
    (r"\frac34", Fraction(3, 4)),  # digit shorthand
    ("3/0", None),  # division by zero is not a number
    ("\u22125", Fraction(-5)),  # Unicode minus
    ("x", None),  # a letter
    ("1 2", None),  # two numbers are not one
    ("9" * 200, None),  # too long for the fast path
]


@pytest.mark.parametrize("s, expected", NUMBERS)
def test_parse_number(s, expected):
    parsed = parse_number(s)
    assert (parsed.value if parsed else None) == expected


# (gold, prediction, equal?)
EQUAL = [
    ("50%", "50", True),  # percent gold, bare prediction
    ("50%", "0.5", True),  # percent gold, fraction prediction
    ("50%", "0.5%", False),  # two percentages compare as written
    ("0.1", "1/10", True),  # decimal against fraction
    ("100", "100.0000004", True),  # within 6 decimals
    ("100", "101", False),  # integers exactly
]


@pytest.mark.parametrize("gold, pred, expected", EQUAL)
def test_numbers_equal(gold, pred, expected):
    assert numbers_equal(parse_number(gold), parse_number(pred)) is expected


# A gold that is not a number, an expression or a set cannot be checked: None, never a score.
# math-verify reads a bare word as a product of one-letter symbols, so "forty two" equals "two forty".
# (completion, gold, expected)
GOLD_CHECKABLE = [
    (r"\boxed{42}", "Answer is forty two.", None),  # prose gold (TRL's accuracy_reward gives None)
    (r"\boxed{two forty}", "forty two", None),  # letter-only words: not f*o*r*t*y*t*w*o
    (r"\boxed{forty two}", "forty two", None),  # ... not even when the completion copies it
    (r"\boxed{sey}", "yes", None),  # a yes/no gold
    (r"\boxed{on}", "no", None),  # ... two letters
    (r"\boxed{Sunday}", r"\text{Sunday}", None),  # a word inside \text
    (r"\boxed{42}", "四十二", None),  # prose in another script
    (r"\boxed{x->y}", "x->y", None),  # math-verify keeps it only as a string: compared as text, not math
    (r"\boxed{@@}", "@@", None),  # ... likewise
    (r"\boxed{\pi}", r"\pi", 1.0),  # a LaTeX constant is symbolic
    (r"\boxed{3.14}", r"\pi", 0.0),  # ... and can be wrong
    (r"\boxed{1+x}", "x+1", 1.0),  # an expression in one-letter variables
    (r"\boxed{x-1}", "x+1", 0.0),
    (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),  # a set
    (r"\boxed{(0, \infty)}", r"(0,\infty)", 1.0),  # an open interval
    (r"\boxed{[0, \infty)}", r"(0,\infty)", 0.0),
    (r"\boxed{\sin x}", r"\sin x", 1.0),  # a function name is not prose
    (r"\boxed{2xy}", "2xy", 1.0),  # a product of variables
    (r"\boxed{C}", r"\text{(C)}", 1.0),  # a multiple-choice letter
    (r"\boxed{5}", r"5\text{ cm}", 1.0),  # a unit after a number
    (r"\boxed{10}", r"10\text{ inches}", 1.0),  # ... even a long one
]


def test_accuracy_gold_must_be_checkable():
    got = Accuracy()(completions=[c for c, _, _ in GOLD_CHECKABLE], answer=[g for _, g, _ in GOLD_CHECKABLE])
    wrong = [(c, g, e, r) for (c, g, e), r in zip(GOLD_CHECKABLE, got) if r != e]
    assert not wrong, wrong


def test_cosine_scaled_abstains_on_a_prose_gold():
    from rewards.length import CosineScaled

    # Seen: the wrong-answer length penalty (-0.75) on a sample nobody can check.
    got = CosineScaled(max_length=8)(completions=[r"\boxed{42}", r"\boxed{42}"], completion_ids=[[0] * 4, [0] * 4],
                                     answer=["forty two", "42"])
    assert got[0] is None and got[1] > 0


# reasoning_accuracy: the answer counts only after the reasoning is closed.
# (completion, gold, expected) with default tags
REASONING = [
    (r"<think>2+2</think> \boxed{4}", "4", 1.0),  # answer after the reasoning
    (r"<think>2+2</think> \boxed{5}", "4", 0.0),  # wrong answer after it
    (r"<think>so \boxed{4}</think> I am not sure", "4", 0.0),  # answer only inside the reasoning
    (r"<think>so \boxed{4}", "4", 0.0),  # reasoning never closed
    (r"\boxed{4}", "4", 0.0),  # no reasoning block at all: nothing committed after one
    (r"<think>a</think> b </think> \boxed{4}", "4", 1.0),  # the last closing tag counts
    (r"<think>\boxed{5}</think> \boxed{4}", "4", 1.0),  # a guess inside, the committed answer outside
    (r"<think>r</think> <think>\boxed{4}", "4", 0.0),  # reasoning reopened and never closed
    (r"<think>r</think> \boxed{4}", "forty two", None),  # a gold nobody can check: None as in accuracy
    (r"2+2 is</think> <answer>4</answer>", "4", 1.0),  # opening tag in the prompt (Qwen3, R1 distills)
]


def test_reasoning_accuracy():
    from rewards.math import ReasoningAccuracy

    got = ReasoningAccuracy()(completions=[conv(c) for c, _, _ in REASONING], answer=[g for _, g, _ in REASONING])
    wrong = [(c, g, e, r) for (c, g, e), r in zip(REASONING, got) if r != e]
    assert not wrong, wrong


def test_reasoning_accuracy_tags_are_configurable():
    from rewards.math import ReasoningAccuracy

    reward = ReasoningAccuracy(close_tags=["</reasoning>", "</think>"], gold_column="solution")
    got = reward(completions=[r"<reasoning>x</reasoning> \boxed{3}", r"<think>x</think> \boxed{3}",
                              r"<reasoning>\boxed{3}"], solution=["3", "3", "3"])
    assert got == [1.0, 1.0, 0.0]


@pytest.mark.parametrize("args", [{"close_tags": []}, {"close_tags": [""]}, {"close_tags": 3}, {"timeout": -1}])
def test_reasoning_accuracy_bad_args(args):
    with pytest.raises(rewards.RewardError):
        rewards.build("reasoning_accuracy", **args)
