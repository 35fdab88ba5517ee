"""Hostile code against one promise: code under test never decides its own score.

Moved unchanged from tests/test_hostile_pass.py and tests/test_hostile_pass2.py (named by the round that found them);
to be folded into the code verifier's tests by the rule each guards. Each test pins one rule (its `Rule:` comment).
"""

from __future__ import annotations

import pytest


# Rule: a setup that binds names other than by assignment, def or import -- a star import (`from string import *`,
# MBPP-style test_imports), `globals()[...] = ...`, `exec(...)` -- makes a test comparing with such a name
# (`assert add(1, 2) == EXPECTED`) opaque, never a value check whose expected side the graded code can rebind:
# a wrong solution does not score 1.0 (docs/troubleshooting.md: a test that needs the setup's names is opaque;
# value checks cannot be forged).
@pytest.mark.parametrize("setup, test, code", [
    ("globals()['EXPECTED'] = 3", "assert add(1, 2) == EXPECTED",
     "def add(a, b):\n    global EXPECTED\n    EXPECTED = 0\n    return 0"),
    ("exec('REF = [1, 2, 3]')", "assert my_sort([3, 1, 2]) == REF",
     "def my_sort(x):\n    global REF\n    REF = None\n    return None"),
    ("from string import *", "assert count_letters() == len(ascii_lowercase)",
     "def count_letters():\n    global ascii_lowercase\n    ascii_lowercase = 'abc'\n    return 3"),
])
def test_a_wrong_solution_cannot_rebind_a_setup_name_it_is_compared_with(setup, test, code):
    from rewards._sandbox import run

    assert run(code, [test], setup).passed == [False]


# Rule: a `for` over a literal whose item holds a probe (`for v in [f(4)]: ...`) evaluates the item once, as Python
# does: graded code that counts its calls and answers each use differently (10 for `v > 3`, then 0 for `v < 5`)
# cannot pass a test that no single value but 4 passes; a wrong solution does not score 1.0
# (docs/troubleshooting.md: a loop over a literal is a value check, which cannot be forged).
def test_an_unrolled_loop_item_is_one_value_not_one_probe_per_use():
    from rewards._sandbox import run

    code = "calls = [0]\ndef f(x):\n    calls[0] += 1\n    return 10 if calls[0] % 2 else 0"
    test = "for v in [f(4)]:\n    assert v > 3 and v < 5"
    with pytest.raises(AssertionError):  # Python itself: the code fails the test
        namespace = {}
        exec(code, namespace)
        exec(test, namespace)
    assert run(code, [test]).passed == [False]


# Rule: a dataset test looping over `range(<literal past 2**63>)` (too long for a C ssize_t) is opaque, never an
# exception out of CodeTests for the whole batch: one such row in the dataset must not stop every run that draws it.
def test_a_huge_literal_range_loop_is_opaque_not_a_crash():
    from rewards._judge import plan

    (check,) = plan(("for i in range(100000000000000000000):\n    assert f(i) == i",), "")
    assert check.expr is None
