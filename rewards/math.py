"""Math answer checking: extract the final answer, compare plain numbers fast, everything else via math-verify.

Most RLVR math data (GSM8K, most of MATH) has a plain number as its answer. Those are compared here in
microseconds with exact rational arithmetic; only answers that are not plain numbers (fractions in
LaTeX, roots, pi, intervals, sets, tuples, equations) go to math-verify, in the untrusted-work pool's caged
workers, killed if they run past the time limit (see `grpokit.untrusted.pool`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from rewards import is_integer, is_number, register, text
from grpokit.untrusted.pool import Kind, shared

MATH_VERIFY = Kind("grpokit.untrusted.math_job", "math-verify", "import math_verify")

MAX_ANSWER_CHARS = 1000  # a longer "final answer" is not an answer; it scores 0.0 without parsing

# ----------------------------------------------------------------------------------------------------
# Extraction

# `\\.` swallows escaped characters, so `\{` and `\}` (set braces) do not count as grouping braces.
_BRACE_TOKENS = re.compile(r"\\(?:boxed|fbox)\s*\{|\\.|[{}]", re.S)
_LAST_NUMBER = re.compile(r"-?\d(?:[\d,]*\d)?(?:\.\d+)?")


def last_boxed(s: str) -> str | None:
    """The content of the last complete `\\boxed{...}` (nested braces allowed), or None.

    >>> last_boxed(r"so \\boxed{1} or rather \\boxed{\\frac{1}{2}}")
    '\\\\frac{1}{2}'
    """
    if "boxed" not in s and "fbox" not in s:
        return None
    stack: list[int] = []  # for each open brace: content start if it opens a box, else -1
    best_start, best = -1, None
    for m in _BRACE_TOKENS.finditer(s):
        tok = m.group()
        if tok == "}":
            if stack:
                start = stack.pop()
                if start > best_start:  # a box that starts later wins, even if nested in an earlier one
                    best_start, best = start, s[start : m.start()]
        elif tok == "{":
            stack.append(-1)
        elif tok.endswith("{") and tok[1] in "bf":
            stack.append(m.end())
    return best


def tagged_answer(s: str) -> str | None:
    """The content of the last `<answer>...</answer>`, or None."""
    end = s.rfind("</answer>")
    if end < 0:
        return None
    start = s.rfind("<answer>", 0, end)
    return None if start < 0 else s[start + len("<answer>") : end]


def gsm8k_answer(s: str) -> str | None:
    """What follows the last `####` on its line (GSM8K's answer marker), or None."""
    i = s.rfind("####")
    return None if i < 0 else s[i + 4 :].split("\n", 1)[0]


def extract_answer(s: str, allow_last_number: bool = False) -> str | None:
    """The final answer of a completion: last `\\boxed{}`, else `<answer>` tags, else `#### N`; else, only
    when `allow_last_number`, the last number in the text. Empty answers count as none.

    >>> extract_answer("<think>2+2</think> <answer>4</answer>")
    '4'
    >>> extract_answer("it is 4", allow_last_number=True)
    '4'
    """
    found = _extract(s, allow_last_number)
    return None if found is None else found[0]


def _extract(s: str, allow_last_number: bool) -> tuple[str, bool] | None:
    """(answer, came from a box) or None."""
    for find in (last_boxed, tagged_answer, gsm8k_answer):
        found = find(s)
        if found is not None and found.strip():
            return found.strip(), find is last_boxed
    if allow_last_number:
        last = None
        for last in _LAST_NUMBER.finditer(s):
            pass
        return (last.group(), False) if last else None
    return None


def gold_answer(value) -> str | None:
    """The gold answer from a dataset cell: a GSM8K solution `... #### 42` gives `42`, a solution with a
    `\\boxed{}` gives its content, a number gives its text; None for an empty cell."""
    if value is None or isinstance(value, bool):
        return None
    s = value if isinstance(value, str) else str(value)
    if "####" in s:
        s = gsm8k_answer(s) or ""
    elif "boxed" in s:
        s = last_boxed(s) or s
    s = s.strip()
    return s or None


# ----------------------------------------------------------------------------------------------------
# Plain numbers, compared exactly without sympy


@dataclass(frozen=True)
class Number:
    value: Fraction
    is_float: bool  # written with a decimal point or exponent: compared to 6 decimals, as math-verify does
    is_percent: bool


_DECIMAL = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d*))?|\.(?P<frac_only>\d+))"
    r"(?:[eE](?P<exp>[+-]?\d{1,4})|\s*(?:\\times|\\cdot|×)\s*10\^(?:\{(?P<exp_braced>[+-]?\d{1,4})\}|(?P<exp_digit>\d)))?"
)
_FRACTION = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<num>\d+)\s*/\s*(?P<den>\d+)"
    r"|\\[dt]?frac(?:\{(?P<bnum>\d+)\}\{(?P<bden>\d+)\}|(?P<dnum>\d)(?P<dden>\d)))"
)
_STRIP = ("\\!", "\\,", "\\;", "\\:", "\\$", "$", "\\left", "\\right")
_MAX_EXPONENT = 400  # beyond this a "plain number" goes to math-verify rather than building a huge int


def parse_number(s: str) -> Number | None:
    """A plain number (`1,234`, `$5`, `12.50`, `-0`, `50%`, `1/2`, `\\frac{1}{2}`, `1.5e3`,
    `3\\times 10^{4}`), or None for anything else.

    >>> parse_number("$1,234.50").value
    Fraction(2469, 2)
    """
    if len(s) > 100:
        return None
    s = s.strip().replace("\u2212", "-").replace("{,}", ",")
    for junk in _STRIP:
        if junk in s:
            s = s.replace(junk, "")
    s = s.strip()
    is_percent = s.endswith("%")
    if is_percent:
        s = s[:-2] if s.endswith("\\%") else s[:-1]
        s = s.rstrip()
    if len(s) > 1 and s[-1] == "." and s[-2].isdigit():  # "the answer is 42."
        s = s[:-1]
    if len(s) > 2 and s[0] == "{" and s[-1] == "}":  # \boxed{{42}}
        s = s[1:-1].strip()
    m = _DECIMAL.fullmatch(s)
    if m:
        digits_int = (m["int"] or "").replace(",", "")
        digits_frac = m["frac"] if m["frac"] is not None else (m["frac_only"] or "")
        exp_text = m["exp"] or m["exp_braced"] or m["exp_digit"]
        exp = int(exp_text) if exp_text else 0
        if abs(exp) > _MAX_EXPONENT:
            return None
        value = Fraction(int(digits_int + digits_frac or "0")) * Fraction(10) ** (exp - len(digits_frac))
        is_float = m["frac"] is not None or m["frac_only"] is not None or exp_text is not None
        return Number(-value if m["sign"] == "-" else value, is_float, is_percent)
    m = _FRACTION.fullmatch(s)
    if m:
        num = int(m["num"] or m["bnum"] or m["dnum"])
        den = int(m["den"] or m["bden"] or m["dden"])
        if den == 0:
            return None
        value = Fraction(num, den)
        return Number(-value if m["sign"] == "-" else value, False, is_percent)
    return None


def _close(a: Fraction, b: Fraction, rounded: bool) -> bool:
    return a == b or (rounded and round(a, 6) == round(b, 6))


def numbers_equal(gold: Number, pred: Number) -> bool:
    """Exact equality; to 6 decimals when either side was written as a decimal (1/3 = 0.333333, as in
    math-verify); a percentage on one side only matches either its value or its value / 100
    (50% = 50 and 50% = 0.5, again as math-verify does).

    >>> numbers_equal(parse_number("1/2"), parse_number("0.50"))
    True
    """
    rounded = gold.is_float or pred.is_float
    if _close(gold.value, pred.value, rounded):
        return True
    if pred.is_percent and not gold.is_percent:
        return _close(gold.value, pred.value / 100, True)
    if gold.is_percent and not pred.is_percent:
        return _close(gold.value / 100, pred.value, True)
    return False


# ----------------------------------------------------------------------------------------------------
# Which golds can be checked at all


_UNIT_AFTER_NUMBER = re.compile(r"(?<=\d)\s*\\(?:text|mbox|mathrm|textrm)\s*\{[^{}]*\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|mbox|mathrm|textrm|textbf|mathbf|textit|mathit|operatorname)\s*\{([^{}]*)\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTER_RUN = re.compile(r"[^\W\d_]+")
# Bare names math-verify reads as functions or constants, not as a product of letters.
_MATH_NAMES = frozenset(
    "sin cos tan cot sec csc arcsin arccos arctan arccot sinh cosh tanh coth log ln lg exp sqrt pi inf infty "
    "oo max min gcd lcm mod det dim ker deg arg lim".split()
)
# Two-letter English words that would otherwise pass for a product of two variables (a yes/no gold "no").
_SHORT_WORDS = frozenset("no is or of to an in it at be by on as if so we he up do go me my us am".split())


def checkable_gold(gold: str) -> bool:
    """False when the gold is prose rather than a number, an expression or a set, so no answer can be checked.

    math-verify reads a bare word as a product of one-letter symbols, so a gold "forty two" equals the
    answer "two forty", and "yes" equals "sey". A gold counts as prose when, with LaTeX commands and a
    unit after a number (`5\\text{ cm}`) set aside, it holds a run of three or more letters that is not a
    function name (`sin`, `log`, ...), or a two-letter English word (`no`). One-letter variables, products
    like `2xy`, and a multiple-choice `\\text{(C)}` stay checkable.

    >>> [checkable_gold(g) for g in ["x+1", r"\\pi", r"\\{1,2\\}", "forty two", "Answer is 42", r"\\text{(C)}"]]
    [True, True, True, False, False, True]
    """
    scan = _UNIT_AFTER_NUMBER.sub(" ", gold)
    scan = _TEXT_WRAPPER.sub(lambda m: f" {m.group(1)} ", scan)
    scan = _COMMAND.sub(" ", scan)
    for run in _LETTER_RUN.findall(scan):
        word = run.lower()
        if (len(word) >= 3 and word not in _MATH_NAMES) or (len(word) == 2 and word in _SHORT_WORDS):
            return False
    return True


# ----------------------------------------------------------------------------------------------------
# The reward


_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


def _math_verify_input(answer: str, boxed: bool) -> tuple[str, ...]:
    """What the worker hands to math-verify's `parse`, in order of preference (first non-empty parse wins).

    math-verify finds LaTeX by its delimiters, so a bare `x^2+1` or `\\frac{\\pi}{2}` is wrapped in a box for
    it; text with delimiters or prose ("the answer is 42") is tried as it is first, since boxed, prose
    would read as a product of letters.
    """
    wrapped = "\\boxed{" + answer + "}"
    if boxed:
        return (wrapped,)
    delimited = any(d in answer for d in ("$", "\\(", "\\[", "\\boxed"))
    if delimited or len(_PROSE_WORD.findall(answer)) >= 2:
        return (answer, wrapped)
    return (wrapped,)


@register("accuracy")
class Accuracy:
    """1.0 when the completion's final answer equals the gold answer, else 0.0; None when the gold cannot be checked.

    r = 1[ verify(gold, extract(completion)) ]

    The answer is the last `\\boxed{...}`, else the last `<answer>...</answer>`, else GSM8K's `#### N`;
    with `allow_last_number=True`, else the last number in the text (off by default: a model learns to
    end every completion with a list of guesses). The gold comes from the dataset column `gold_column`;
    a GSM8K solution ending in `#### 42` counts as `42`. A gold that is not a number, an expression or a
    set (prose such as "forty two", which math-verify would read as a product of letters; see
    `checkable_gold`) gives None, as does one math-verify cannot parse: TRL skips None. Plain numbers on both sides (thousands
    separators, `$`, `%`, trailing zeros, `-0`, `1/2` vs `0.5`, `1.5e3`) are compared exactly, in
    microseconds; everything else goes to math-verify (`verify(parse(gold), parse(answer))`, gold first)
    in a pool of `workers` processes, once per distinct (gold, answer) pair in a call, and a check that
    takes over `timeout` seconds (e.g. `\\boxed{9^{9^{9^{9}}}}`) is killed and scores 0.0, from any thread. The workers start in the
    background on the first call (importing sympy takes a second or two); they are shared by every
    instance in the process and stop at exit.

    >>> Accuracy()(completions=["so \\\\boxed{1,000}", "#### 999"], answer=["... #### 1000", "1000"])
    [1.0, 0.0]
    """

    def __init__(self, gold_column: str = "answer", allow_last_number: bool = False, timeout: float = 1.0,
                 workers: int = 2):
        if not isinstance(gold_column, str) or not gold_column:
            raise ValueError(f"gold_column must name a dataset column, got {gold_column!r}")
        if not is_number(timeout) or not 0 < timeout <= 60:
            raise ValueError(f"timeout must be a number of seconds in (0, 60], got {timeout!r}")
        if not is_integer(workers) or not 1 <= workers <= 64:
            raise ValueError(f"workers must be an integer in [1, 64], got {workers!r}")
        self.gold_column = gold_column
        self.allow_last_number = bool(allow_last_number)
        self.timeout = float(timeout)
        self.workers = workers
        # No pool here: instances pickle, and a recipe check (which builds every reward) starts no process.
        self._started = False

    def __getstate__(self):
        return {**self.__dict__, "_started": False}  # a copy in another process starts its own workers

    def __call__(self, completions, **kwargs) -> list[float | None]:
        golds = kwargs.get(self.gold_column)
        if golds is None:
            columns = sorted(k for k, v in kwargs.items() if isinstance(v, list) and k not in ("prompts", "completion_ids"))
            raise ValueError(
                f"accuracy reads the gold answer from dataset column {self.gold_column!r}, which is not in the batch; "
                f"columns: {', '.join(columns) or 'none'}; set args: {{gold_column: <column>}}"
            )
        if len(golds) != len(completions):
            raise ValueError(f"got {len(completions)} completions but {len(golds)} values of {self.gold_column!r}")
        if not self._started:  # start the workers now, so the first LaTeX answer does not wait for them
            shared(MATH_VERIFY, self.workers).start()
            self._started = True
        out: list[float | None] = []
        # Distinct (gold, prediction) checks for math-verify -> the samples waiting on each: a group
        # of completions often repeats one answer, and a hard one would otherwise time out once per copy.
        slow: dict[tuple[tuple, tuple | None], list[int]] = {}
        for i, (completion, gold_value) in enumerate(zip(completions, golds)):
            gold = gold_answer(gold_value)
            gold_number = None if gold is None else parse_number(gold)
            if gold is None or (gold_number is None and not checkable_gold(gold)):
                out.append(None)
                continue
            out.append(0.0)
            found = _extract(text(completion), self.allow_last_number)
            pred, boxed = found if found is not None and len(found[0]) <= MAX_ANSWER_CHARS else (None, False)
            if gold_number is not None:
                if pred is None:
                    continue
                pred_number = parse_number(pred)
                if pred_number is not None:
                    out[i] = 1.0 if numbers_equal(gold_number, pred_number) else 0.0
                    continue
            # Not both plain numbers (or no answer, and the gold still has to be shown parseable).
            check = (_math_verify_input(gold, False), None if pred is None else _math_verify_input(pred, boxed))
            slow.setdefault(check, []).append(i)
        if slow:
            replies = shared(MATH_VERIFY, self.workers).run([list(check) for check in slow], self.timeout)
            for samples, reply in zip(slow.values(), replies):
                for i in samples:
                    out[i] = _verdict(reply)
        return out


def _verdict(reply) -> float | None:
    """A math-verify job's score: 1.0 or 0.0, None where the gold could not be parsed (no verdict). Past its time, or
    crashing sympy, a check scores 0.0 once its gold has parsed, else None."""
    if reply.how == "result":
        return None if reply.value is None else 1.0 if reply.value is True else 0.0
    return 0.0 if reply.marked else None


def _tags(name: str, value) -> tuple[str, ...]:
    tags = (value,) if isinstance(value, str) else value
    if not isinstance(tags, (list, tuple)) or not tags or not all(isinstance(t, str) and t.strip() for t in tags):
        raise ValueError(f"{name} must be a non-empty list of non-empty tag strings, got {value!r}")
    return tuple(tags)


@register("reasoning_accuracy")
class ReasoningAccuracy:
    """`accuracy` of the text after the reasoning closes: 0.0 with no closing tag, or an answer only inside it.

    r = accuracy(gold, text after the last of `close_tags`),  r = 0 when no closing tag is present

    The policy is paid only for an answer it committed to after reasoning, not for a guess inside the
    reasoning (TRL's `reasoning_accuracy_reward`). A reasoning block reopened after the last closing tag
    (`</think> <think> \\boxed{4}`, never closed) counts as no answer: for a closing tag `</name>` the
    opening tag is `<name>`. The gold, its column and the checking are `accuracy`'s (None when the gold
    cannot be checked). The opening tag itself is not required, so a chat template that opens
    `<think>` in the prompt (Qwen3, DeepSeek-R1 distills) works unchanged.

    >>> ReasoningAccuracy()(completions=["<think>\\\\boxed{2}</think> \\\\boxed{4}", "<think>so \\\\boxed{4}"], answer=["4", "4"])
    [1.0, 0.0]
    """

    def __init__(self, close_tags: list[str] | str = ("</think>",), gold_column: str = "answer",
                 allow_last_number: bool = False, timeout: float = 1.0, workers: int = 2):
        self.close_tags = _tags("reasoning_accuracy: close_tags", close_tags)
        self.open_tags = tuple("<" + t[2:] for t in self.close_tags if t.startswith("</"))
        self.accuracy = Accuracy(gold_column, allow_last_number, timeout, workers)

    def after_reasoning(self, s: str) -> str:
        """The text after the last closing tag; "" when there is none or the reasoning is reopened after it."""
        end, tag = max((s.rfind(t), t) for t in self.close_tags)
        if end < 0:
            return ""
        rest = s[end + len(tag):]
        return "" if any(t in rest for t in self.open_tags) else rest

    def __call__(self, completions, **kwargs) -> list[float | None]:
        answers = [self.after_reasoning(text(c)) for c in completions]
        return self.accuracy(completions=answers, **kwargs)
