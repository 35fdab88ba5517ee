"""A math-verify job, as the untrusted-work pool's workers run it (`sandbox.pool`; imported in the cage).

A job is [gold, prediction]: each a list of strings to try with math-verify's `parse` in order, the first non-empty
parse counting (the prediction None when the completion had no answer). Parsing the gold is the job's trusted part
(`prepare`, within the job's own limit, timed apart); a job past its time after it scores 0.0, not None. The result
is None (the gold cannot be parsed: no verdict), True or False, and the keeper takes nothing else (`check`).

math-verify does not run the answer's text as Python: its only `parse_expr` (sympy's, which evaluates) is reached
from a regex whose characters are digits, '.', white space and the operators + - * x / ^ ( ) ÷ (math_verify/parser.py,
`lazy_expr_regex`), and latex2sympy builds sympy objects from a grammar. It runs caged all the same: sympy on a
power tower computes for minutes, and only a process can be stopped.
"""

from __future__ import annotations

from functools import lru_cache

_WARM_UP = [  # (gold, prediction) pairs covering the kinds of answer math-verify builds differently
    ("$\\frac{1}{2}$", "\\boxed{\\sqrt{x}+0.5}"),
    ("\\boxed{(0,\\infty)}", "\\boxed{[0, 1)}"),
    ("\\boxed{\\{1,2\\}}", "\\boxed{\\{2,1\\}}"),
    ("\\boxed{\\pi}", "\\boxed{3.14}"),
    ("\\boxed{1 \\le x \\le 2}", "\\boxed{x=3}"),
    ("\\boxed{x^2+1}", "\\boxed{\\sin x}"),
    ("\\boxed{(1, 2)}", "\\boxed{\\text{(C)}}"),
    ("\\boxed{3}", "\\boxed{1+2}"),
]
_parse = _verify = None


def warm() -> None:
    """Import math-verify and build what its first parses build (the LaTeX parser, ~0.2 s of CPU; the first interval,
    set, pi or inequality pulls in more of sympy, 40-90 ms each, measured): once, in the zygote, so that no job pays
    it inside its time limit."""
    global _parse, _verify
    import logging
    import warnings

    warnings.simplefilter("ignore")
    # math-verify warns that its own timeout is off: the pool enforces the limit by killing the worker.
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import parse, verify

    _parse, _verify = parse, verify
    for gold, pred in _WARM_UP:
        verify(parse(gold), parse(pred), timeout_seconds=None)


def _parse_first(candidates: tuple) -> list:
    for candidate in candidates:
        parsed = _parse(candidate, parsing_timeout=None)
        if parsed:
            return parsed
    return []


_parse_gold = lru_cache(maxsize=4096)(_parse_first)  # a gold is checked against each completion of its group


PREPARE_S = None  # parsing the gold: within the job's own limit


def _gold(gold: list) -> list:
    try:
        return _parse_gold(tuple(gold))
    except Exception:  # noqa: BLE001 - any failure means "cannot be parsed"
        return []


def prepare(job: list) -> bool:
    """The trusted part: the gold parsed. Only a number, an expression or a set counts: a parse that is nothing but
    the input string would be compared as text, and the answer scored against prose nobody can check (False: no
    verdict)."""
    return any(not isinstance(p, str) for p in _gold(job[0]))


def run(job: list) -> bool:
    gold, pred = job
    parsed_gold = _gold(gold)  # kept by `prepare`
    try:
        return pred is not None and bool(_verify(parsed_gold, _parse_first(tuple(pred)), timeout_seconds=None))
    except Exception:  # noqa: BLE001 - a prediction that breaks sympy is a wrong answer
        return False


def check(job: list, value) -> bool | None:
    """The keeper's check of a result: a verdict or none."""
    if value is None or isinstance(value, bool):
        return value
    raise ValueError(f"a verdict is true, false or none, got {type(value).__name__}")
