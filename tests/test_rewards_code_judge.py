"""code_tests' verdicts: nothing the graded code executes can change its own verdict.

The trainer side decides pass/fail from values; the graded side computes only the sub-expressions that
need its names and never sees the expected answer (rewards/_judge.py).
"""

import importlib
import importlib.util
import json
import marshal
import math
from pathlib import Path

import pytest

from rewards._judge import plan
from rewards._sandbox import CHILD, VALUE_ITEMS, Limits, build_job, run, survey
from rewards._values import BadValue, decode
from rewards.code import CodeTests

ROOT = Path(__file__).resolve().parent.parent
FAST = Limits(time_s=0.5, memory_mb=256, processes=16, file_mb=4, output_kb=16)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]
WRONG_ADD = "def add(a, b):\n    return 0\n"

# Each line, appended to a wrong `add`, tries to turn its failing asserts into passes.
ATTACKS = {
    # rewrites the harness's own report lines on their way out
    "patched_os_write": "import os; _w=os.write; os.write=lambda fd,b: _w(fd, b[:-2]+b'1\\n' if b.endswith(b' 0\\n') else b)",
    # the harness formats its verdict with int()
    "patched_int": "import builtins; builtins.int=lambda *a,**k: 1",
    # the harness compiles and runs each test with the builtins of the interpreter it shares with the code
    "patched_compile": "import builtins; _c=builtins.compile; builtins.compile=lambda s,f,m,*a,**k: _c('pass',f,m)",
    "patched_exec": "import builtins; builtins.exec=lambda *a,**k: None",
    # finds the reporter on the stack and reports every test passed (in the report forms of the harness
    # before and after values were sent), then leaves before any test runs
    "frame_walk": ("import sys, os\nf = sys._getframe()\nwhile f is not None and 'report' not in f.f_locals:\n"
                   "    f = f.f_back\nfor i in range(3):\n    f.f_locals['report']('test', f'{i} 1')\n"
                   "    f.f_locals['report']('pass', i)\nos._exit(0)"),
    # the same through the garbage collector's list of live objects
    "gc_walk": ("import gc, os\nfor o in gc.get_objects():\n    if getattr(o, '__name__', '') == 'report' and callable(o):\n"
                "        for i in range(3):\n            o('test', f'{i} 1')\n            o('pass', i)\nos._exit(0)"),
    # a value that claims to equal anything
    "always_equal": "class _Any:\n    __eq__ = lambda s, o: True\nadd = lambda a, b: _Any()",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_wrong_answer_scores_zero_whatever_else_the_code_runs(name):
    completion = f"```python\n{WRONG_ADD}{ATTACKS[name]}\n```"
    assert CodeTests(timeout=FAST.time_s)(completions=[completion], tests=[ADD_TESTS]) == [0.0]


def test_the_attacks_leave_a_right_answer_passing():
    # Each attack line is harmless in itself: with a right `add` before it the score stays what it was,
    # so the zeros above come from the verdicts, not from code that no longer runs.
    right = "def add(a, b):\n    return a + b\n"
    for name in ("patched_os_write", "patched_int", "patched_compile", "patched_exec"):
        assert run(right + ATTACKS[name], ADD_TESTS, limits=FAST).passed == [True] * 3, name


def test_flooding_the_results_pipe_ends_the_candidate_early():
    # The results descriptor's number is on the command line; an endless writer to it is cut off once
    # the parent has read its cap, rather than being read until the wall-clock deadline.
    flood = ("import os, sys\nfd = int(sys.argv[1])\nchunk = b'x' * 65536\nwhile True:\n    os.write(fd, chunk)\n")
    out = run("def add(a, b):\n    return a + b\n" + flood, ADD_TESTS, limits=Limits(time_s=5.0))
    assert out.ended == "results" and out.passed == [False] * 3


def test_the_sandbox_is_sent_the_probes_and_never_the_expected_side():
    tests = ["assert add(20, 22) == 4242", "assert set(pairs(7)) == {(1, 9191)}", "assert abs(ratio(3) - 0.7171) < 1e-6",
             "assert math.isclose(root(2), 1.4142, rel_tol=1e-3)", "assert not is_odd(8080)"]
    job, checks, _ = build_job(WRONG_ADD, tests, "", FAST)
    assert [step[:2] for step in job["steps"]] == [
        ("eval", "add(20, 22)"), ("eval", "pairs(7)"), ("eval", "ratio(3)"), ("eval", "root(2)"), ("eval", "is_odd(8080)")]
    sent = marshal.dumps(job)
    for hidden in (b"4242", b"9191", b"7171", b"1.4142", b"isclose", b"abs", b"==", b"assert", b"not"):
        assert hidden not in sent, hidden
    assert all(check.expr is not None for check in checks)  # every one judged in the trainer


# Functions for the forms below; WRONG returns a falsy string that none of the tests accept.
FORMS_CODE = """
import math
def f(x): return x + 1
def is_even(n): return n % 2 == 0
def nothing(): return None
def evens(n): return (i for i in range(0, n, 2))
def halve(x): return x / 2
def pair(): return (3, 4)
def words(s): return s.split()
"""
WRONG = "\n".join(f"def {name}(*a): return ''" for name in ("f", "is_even", "nothing", "evens", "halve", "pair", "words"))
# (test, what the form is)
FORMS = [
    ("assert f(1) == 2", "=="),
    ("assert f(1) != f(2)", "!= between two probes"),
    ("assert f(1) < 3 <= f(2)", "chained < and <="),
    ("assert f(5) > 5 and f(5) >= 6", "> and >= under and"),
    ("assert f(1) in [2, 4]", "in a literal"),
    ("assert 'b' in words('a b')", "in a probe"),
    ("assert 9 not in words('a b') or words('a') == 'a'", "not in, or"),
    ("assert nothing() is None", "is None"),
    ("assert f(0) is not None and f(0)", "is not None"),
    ("assert math.isclose(halve(3), 1.5000001, rel_tol=1e-6)", "math.isclose with a keyword"),
    ("assert abs(halve(7) - 3.5) < 1e-6", "abs of a difference"),
    ("assert is_even(4)", "bare assert"),
    ("assert not is_even(3) and is_even(2)", "not"),
    ("assert set(evens(5)) == set([0, 2, 4])", "set() of a generator"),
    ("assert sorted(evens(7), reverse=True) == [6, 4, 2, 0]", "sorted() of a generator, keyword"),
    ("assert sum(evens(5)) == 6 and max(evens(5)) == 4", "sum and max of a generator"),
    ("assert pair()[1] == 4 and pair() == (3, 4)", "subscript; tuple"),
    ("assert isinstance(pair(), tuple) and len(words('x y z')) == 3", "isinstance, len"),
    ("assert f(2) ** 2 == 9 and -f(2) == -3 and f(9) // 3 == 3", "arithmetic"),
    ("assert str(f(1)) == '2' and int('3') == f(2)", "str, int"),
    ("assert f(1) == float('inf') or f(1) == 2", "float('inf') on the expected side"),
]


def test_a_right_answer_passes_every_supported_form_and_a_wrong_one_none():
    tests = [test for test, _ in FORMS]
    assert all(check.expr is not None for check in plan(tuple(tests), "")), "each form is judged in the trainer"
    right, wrong = run(FORMS_CODE, tests, limits=FAST), run(WRONG, tests, limits=FAST)
    assert right.passed == [True] * len(FORMS), [form for (_, form), ok in zip(FORMS, right.passed) if not ok]
    assert wrong.passed == [False] * len(FORMS), [form for (_, form), ok in zip(FORMS, wrong.passed) if ok]


# Values whose type is a subclass of a plain one, nan and inf: the verdict must be Python's own.
KINDS_CODE = """
import math
from collections import Counter, OrderedDict, defaultdict, namedtuple
P = namedtuple('P', 'x y')
class I(int):
    pass
def count(s): return Counter(s)
def ordered(): return OrderedDict([('b', 1), ('a', 2)])
def grouped():
    d = defaultdict(list)
    d['k'].append(1)
    return d
def point(): return P(1, 2)
def small(): return I(3)
def nan(): return float('nan')
def inf(): return float('-inf')
def cx(): return complex(1, -2)
"""
KINDS = [
    "assert count('aab') == {'a': 2, 'b': 1}", "assert count('aab') == {'a': 2}", "assert count('aab')['b'] == 1",
    "assert count('') == {}", "assert ordered() == {'a': 2, 'b': 1}", "assert list(ordered()) == ['b', 'a']",
    "assert grouped() == {'k': [1]}", "assert point() == (1, 2)", "assert point() == [1, 2]", "assert point()[1] == 2",
    "assert point().x == 1", "assert small() == 3", "assert isinstance(small(), int)", "assert nan() != nan()",
    "assert nan() == nan()", "assert math.isnan(nan())", "assert [nan()] == [nan()]", "assert inf() < -1e308",
    "assert inf() == float('-inf')", "assert math.isinf(inf())", "assert cx() == 1 - 2j", "assert abs(cx()) > 2",
]


def test_values_of_subclasses_nan_and_inf_compare_as_python_compares_them():
    expected = []
    for test in KINDS:  # Python's own verdict, the code and the test run together here
        namespace = {}
        exec(KINDS_CODE, namespace)
        try:
            exec(test, namespace)
            expected.append(True)
        except AssertionError:
            expected.append(False)
    assert expected.count(False) >= 4  # the table holds failing cases too
    assert run(KINDS_CODE, KINDS, limits=FAST).passed == expected


def _child_encoder():
    """The sandbox's own `_encode`, loaded from its file (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("sandbox_child_for_test", CHILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._encode


def test_every_plain_value_survives_the_trip_to_the_trainer():
    encode = _child_encoder()
    values = [None, True, False, 0, -1, 2**200, -(2**4000), 1.5, -0.0, float("inf"), 1e-310, complex(1, -2), "",
              "héllo\n\ud800", b"\x00\n", [], (1,), {1, 2}, frozenset({"a"}), {"k": [1, (2, None)], 3: {4.5}},
              [[[[]]]], {(1, 2): frozenset({(3,)})}]
    for value in values:
        back = decode(encode(value, False))
        assert back == value and type(back) is type(value), value
    assert math.isnan(decode(encode(float("nan"), False)))
    assert decode(encode(iter(range(3)), True)) == [0, 1, 2]  # an iterable where a consumer takes it


# (bytes, what is wrong with them): each is refused, quickly, without harm to this process.
_COLLIDING = b"".join(b"i%x;" % (k * (2**61 - 1)) for k in range(1, 41))  # 40 ints with one hash
MALFORMED = [
    (b"", "nothing"), (b"X", "unknown tag"), (b"N N", "bytes after the value"), (b"i;", "empty int"),
    (b"i" + b"f" * 40_000 + b";", "int over the size cap"), (b"i" + b"f" * 10**6, "unterminated digits"),
    (b"s10:abc", "string past the end"), (b"l4294967295:N", "count past the end"),
    (b"l1:" * 100 + b"N", "too deep"), (b"l1:" * 100_000 + b"N", "far too deep"),
    (b"l65536:" + b"N" * 65536, "too many items"), (b"S40:" + _COLLIDING, "a set of colliding keys"),
    (b"d40:" + _COLLIDING.replace(b";", b";N"), "a dict of colliding keys"), (b"S1:l0:", "unhashable set item"),
    (b"s2:\xff\xfe", "not UTF-8"), (b"fnope;", "not a float"), (b"l-1:", "negative count"),
]


@pytest.mark.parametrize("data, why", MALFORMED, ids=[why for _, why in MALFORMED])
def test_malformed_or_oversized_values_are_refused(data, why):
    with pytest.raises(BadValue):
        decode(data)


def test_values_too_big_deep_or_strange_fail_their_own_test_only():
    code = ("def big(): return list(range(10**5))\n"
            "def deep():\n    x = []\n    for _ in range(1000):\n        x = [x]\n    return x\n"
            "def loop():\n    x = []\n    x.append(x)\n    return x\n"
            "class Thing:\n    pass\n"
            "def thing(): return Thing()\n"
            "def gen(): return (i for i in range(3))\n"
            "def ok(): return 3\n")
    tests = ["assert len(big()) == 10**5", "assert deep() != []", "assert loop() != []", "assert thing() != 1",
             "assert gen() != 1", "assert ok() == 3"]
    assert run(code, tests, limits=FAST).passed == [False] * 5 + [True]


def test_forged_values_from_the_graded_code_fail_without_harm():
    # The code finds the reporter and sends hostile bytes as the first value of each probe (the first
    # report of a step counts); the last test's probe it leaves alone.
    forge = ("import sys\nf = sys._getframe()\nwhile 'report' not in f.f_locals:\n    f = f.f_back\n"
             "r = f.f_locals['report']\n"
             f"for j, bad in enumerate([b'l1:' * 100000 + b'N', {b'S40:' + _COLLIDING!r}, b'l4294967295:', b'\\n\\n']):\n"
             "    r('value', j, bad)\n"
             "def add(a, b):\n    return a + b\n")
    tests = ADD_TESTS + ["assert add(3, 3) == 6", "assert add(4, 4) == 8"]
    out = run(forge, tests, limits=FAST)
    assert out.passed == [False, False, False, False, True], out


# A value the code chose must not make the trainer allocate without bound (each would take gigabytes).
GREEDY = ["assert [0] * n() == []", "assert 'ab' * n() == ''", "assert n() ** n() > 0", "assert 10 ** n() > 0",
          "assert 1 << n() > 0", "assert '%*d' % (n(), 1) == ''", "assert set(range(n())) == set()",
          "assert round(3, -n()) == 0", "assert " + " * ".join(["huge()"] * 12) + " > 0",
          "assert int(hexes(), 16) > 0", "assert pow(huge(), huge(), huge() - 1) >= 0"]


def test_values_the_code_chose_cannot_make_the_trainer_allocate_without_bound():
    code = "def n(): return 10**12\ndef huge(): return 2**100000\ndef hexes(): return 'f' * 300000\n"
    out = run(code, GREEDY, limits=FAST)
    assert out.passed == [False] * len(GREEDY), out.notes
    assert all("BadValue" in note or "ValueError" in note for note in out.notes), out.notes


def test_opaque_tests_still_run_whole_in_the_sandbox():
    # An assignment before the assert, a generator expression, and an expected value the setup defines
    # (the code could rebind it): all three run as before.
    tests = ["total = add(1, 2)\nassert total == 3", "assert all(add(i, i) == 2 * i for i in range(3))",
             "assert add(1, 2) == EXPECTED"]
    assert all(check.expr is None for check in plan(tuple(tests), "EXPECTED = 3"))
    right = run("def add(a, b):\n    return a + b\n", tests, setup="EXPECTED = 3", limits=FAST)
    wrong = run(WRONG_ADD, tests, setup="EXPECTED = 3", limits=FAST)
    assert right.passed == [True] * 3 and wrong.passed == [False] * 3


def test_several_asserts_and_loops_over_literals_are_judged_in_the_trainer():
    tests = ["assert add(1, 2) == 3\nassert add(2, 2) == 4",
             "for a, b in [(1, 2), (2, 2), (0, 5)]:\n    assert add(a, b) == a + b",
             "for i in range(4):\n    for j in (i, 7):\n        assert add(i, j) - j == i",
             "for i in [1, 2]:\n    assert add(i, 0) == i\nassert add(i, i) == 4"]  # i stays bound after its loop
    checks = plan(tuple(tests), "")
    assert all(check.expr is not None for check in checks)
    assert [len(check.probes) for check in checks] == [2, 3, 8, 3]
    assert run("def add(a, b):\n    return a + b\n", tests, limits=FAST).passed == [True] * 4
    assert run("def add(a, b):\n    return a + b if a < 2 else 0\n", tests, limits=FAST).passed == [False] * 4
    assert run(WRONG_ADD + ATTACKS["frame_walk"], tests, limits=FAST).passed == [False] * 4


def test_the_judge_modules_document_themselves():
    import doctest

    for module in ("rewards._judge", "rewards._unroll", "rewards._evaluate", "rewards._values"):
        assert doctest.testmod(importlib.import_module(module)).failed == 0, module


@pytest.mark.parametrize("name", ["patched_os_write", "patched_int", "patched_compile", "patched_exec"])
def test_opaque_tests_resist_the_cheap_attacks_too(name):
    # A generator expression is run whole in the sandbox; the harness there uses its own exec, compile and
    # os.write, bound before the code ran, and formats its reports without the builtins the code can replace.
    loop = ["assert all(add(a, b) == a + b for a, b in [(1, 2), (2, 2), (0, 5)])"]
    assert plan(tuple(loop), "")[0].expr is None
    completion = f"```python\n{WRONG_ADD}{ATTACKS[name]}\n```"
    assert CodeTests(timeout=FAST.time_s)(completions=[completion], tests=[loop]) == [0.0]


def test_every_shipped_code_test_is_judged_in_the_trainer():
    # A function whose name is also a standard module's (`chunk`) is still the code's: only a module
    # before a dot (`math.factorial(5)`) is taken for one.
    rows = [json.loads(line) for line in (ROOT / "grpokit/assets/code20.jsonl").read_text().splitlines()]
    for row in rows:
        assert all(check.expr is not None for check in plan(tuple(row["tests"]), "")), row["tests"]
    assert plan(("assert f(5) == math.factorial(5)",), "")[0].expr is None


def test_one_candidates_values_share_a_bounded_number_of_items():
    # Each value is within the per-value cap; together they pass VALUE_ITEMS, so the last is not decoded.
    per_value = 60_000
    assert 4 * (per_value + 1) <= VALUE_ITEMS < 5 * (per_value + 1)
    code = f"def big(): return [1] * {per_value}\n"
    out = run(code, [f"assert len(big()) == {per_value}"] * 5, limits=FAST)
    assert out.passed == [True] * 4 + [False]


def test_the_sub_expressions_of_one_test_share_its_time():
    # A loop of 8 hanging calls is one test: it gets one timeout in all, not one per call.
    hang = "def f(x):\n    while True:\n        pass\n"
    tests = ["for i in range(8):\n    assert f(i) == i", "assert f(0) == 0 or True"]
    out = run(hang, tests, limits=Limits(time_s=0.3))
    assert out.passed == [False, False] and out.ended == "done"
    assert out.output.count(b"_Timeout") == 9  # each call says why it stopped; the test's time ran out once


def test_an_expected_side_built_with_a_library_name_is_never_a_probe():
    # `Counter` and `sqrt` here exist only because the code imported them: sent as probes they would show
    # the code the expected value and let it choose it, so these tests run whole in the sandbox instead.
    tests = ["assert tally('aab') == Counter({'a': 2, 'b': 1})", "assert root(2) == sqrt(2)"]
    assert all(check.expr is None for check in plan(tuple(tests), ""))
    code = "from collections import Counter\nfrom math import sqrt\ndef tally(s): return Counter(s)\ndef root(x): return sqrt(x)\n"
    assert run(code, tests, limits=FAST).passed == [True, True]


# (setup, test, a right `f`): setups binding the name a test compares with, visibly or not. The wrong `f`
# below rebinds that name (in the namespace and in the builtins) and returns what it set it to.
SETUP_CASES = [
    ("EXPECTED = 3", "assert f(1) == EXPECTED", "def f(x):\n    return x + 2"),  # an assignment
    ("globals()['EXPECTED'] = 3", "assert f(1) == EXPECTED", "def f(x):\n    return x + 2"),  # the namespace's dict
    ("exec('EXPECTED = 3')", "assert f(1) == EXPECTED", "def f(x):\n    return x + 2"),
    ("import builtins\nbuiltins.EXPECTED = 3", "assert f(1) == EXPECTED", "def f(x):\n    return x + 2"),  # a builtin
    ("from string import *", "assert f(1) == ascii_lowercase[:2]", "def f(x):\n    return 'ab'"),  # a star import
    ("REF = {'a': [1, 2]}", "assert f(1) == REF['a'] and len(REF) == 1", "def f(x):\n    return [1, 2]"),
]
REBIND = ("def f(x):\n    import builtins\n    for name in ('EXPECTED', 'ascii_lowercase', 'REF'):\n"
          "        globals()[name] = 'zz'\n        setattr(builtins, name, 'zz')\n    return 'zz'\n")


@pytest.mark.parametrize("setup, test, right", SETUP_CASES, ids=[case[0].splitlines()[-1] for case in SETUP_CASES])
def test_a_value_the_setup_binds_is_the_setups_whatever_the_code_rebinds(setup, test, right):
    # Found by running the setup alone, it is a constant of a value check: read in the candidate's own
    # sandbox before its code runs, compared here.
    check = plan((test,), setup, *_surveyed(setup))[0]
    assert check.expr is not None and check.constants
    assert run(right, [test], setup, limits=FAST).passed == [True]
    assert run(REBIND, [test], setup, limits=FAST).passed == [False]
    assert run(REBIND + ATTACKS["frame_walk"].replace("range(3)", "range(4)"), [test], setup, limits=FAST).passed == [False]


def _surveyed(setup):
    names, values = survey(setup, FAST)
    return names, frozenset(values)


def test_a_setup_value_is_the_one_the_candidates_own_setup_made():
    # A setup that draws a random number: each candidate's sandbox draws its own, and its test is judged
    # against that one (not the survey's), as Python would judge it.
    setup = "import random\nSEED = random.random()"
    tests = ["assert f(SEED) == SEED * 2", "assert g() == SEED"]
    code = "def f(x):\n    return x * 2\ndef g():\n    return SEED\n"
    assert all(check.expr is not None for check in plan(tuple(tests), setup, *_surveyed(setup)))
    assert run(code, tests, setup, limits=FAST).passed == [True, True]


def test_what_the_setup_binds_that_is_not_plain_data_keeps_a_test_opaque():
    # A function, a module, a class: not values the trainer can hold, so the test runs whole in the sandbox.
    setup = "import string\ndef check(v):\n    return v == 3\nclass Box:\n    pass"
    tests = ["assert check(f(1))", "assert f(1) == string.digits", "assert isinstance(f(1), Box)"]
    names, constants = _surveyed(setup)
    assert {"string", "check", "Box"} <= names and not constants & {"string", "check", "Box"}
    assert all(check.expr is None for check in plan(tuple(tests), setup, names, constants))


def test_without_a_survey_a_setup_that_may_bind_unseen_names_makes_every_test_opaque():
    # The fallback where running the setup alone sent nothing back (it hung, or bound too much to list).
    for setup in ("from string import *", "globals()['X'] = 1", "exec('X = 1')", "import builtins", "vars()['X'] = 1"):
        assert plan(("assert f(1) == X",), setup)[0].expr is None, setup
    assert plan(("assert f(1) == 2",), "import math\nK = 2")[0].expr is not None
    hang = "while True:\n    pass"
    assert survey(hang, FAST) is None


def test_a_name_a_test_binds_is_never_the_codes():
    # `expected` is bound by an earlier test, not by the code: it is not sent as a probe.
    tests = ("expected = 3", "assert add(1, 2) == expected")
    assert [check.expr for check in plan(tests, "")] == [None, None]


def test_the_plan_depends_on_the_tests_and_the_setup_only():
    # Classification is done before the code runs, from the tests and a run of the setup alone: two
    # completions, one of which rebinds every name, are sent the same steps.
    setup, tests = "from string import *\nK = 2", ["assert f(K) == K + 1", "assert f(1) == len(digits)"]
    first, checks_a, _ = build_job("def f(x): return x + 1", tests, setup, FAST)
    second, checks_b, _ = build_job(REBIND, tests, setup, FAST)
    assert first["steps"] == second["steps"] and checks_a == checks_b
    assert [step[:2] for step in first["steps"]] == [("const", "K"), ("const", "digits"), ("eval", "f(K)"), ("eval", "f(1)")]


# Python evaluates each sub-expression of a test once, left to right, and skips what `and`, `or`, `if/else` and a
# chained comparison short-circuit past. The sandbox evaluates each probe once, in that order; the trainer reads a
# probe's value only where Python would have evaluated it. A code that counts its calls answers 10 on odd calls and
# 0 on even ones, so a probe evaluated twice for one Python evaluation would see two different values.
COUNTING = "calls = [0]\ndef f(x):\n    calls[0] += 1\n    return 10 if calls[0] % 2 else 0\n"
ONCE_CASES = [
    "for v in [f(4)]:\n    assert v > 3 and v < 5",  # a loop item is one value, bound to every use of its name
    "for v, want in [(f(4), 4)]:\n    assert v > 3 and v < 5 and v == want",  # a part of a tuple item, likewise
    "for v in [f(4)]:\n    for w in [v, v]:\n        assert w > 3 and w < 5",  # an item naming an earlier item
    "for v in [f(4)]:\n    assert v > 3\nassert v < 5",  # the name stays bound, to the same value, after the loop
    "assert 3 < f(4) < 5",  # a chained comparison's middle operand
]


@pytest.mark.parametrize("test", ONCE_CASES)
def test_each_sub_expression_is_evaluated_once_as_in_python(test):
    assert len(plan((test,), "")[0].probes) == 1
    with pytest.raises(AssertionError):  # Python's own verdict: 10 is not between 3 and 5
        exec(test, _namespace(COUNTING))
    assert run(COUNTING, [test], limits=FAST).passed == [False]
    assert run("def f(x):\n    return 4\n", [test], limits=FAST).passed == [True]


def _namespace(code: str) -> dict:
    namespace = {}
    exec(code, namespace)
    return namespace


def test_a_loop_item_is_evaluated_where_python_evaluates_it():
    # The whole list is built before the body runs: f(1), f(2), then the asserts; an item that raises fails the test
    # even where no assert reads it.
    (check,) = plan(("for v in [f(1), f(2)]:\n    assert v == 1 or True",), "")
    assert [source for source, _ in check.probes] == ["f(1)", "f(2)"]
    tests = ["for v in [f(1)[5]]:\n    assert True or v"]
    assert plan(tuple(tests), "")[0].expr is not None
    assert run("def f(x):\n    return [1]\n", tests, limits=FAST).passed == [False]


def test_a_loop_item_is_consumed_as_python_consumes_it():
    # A generator item listed once is its items; listed twice, the second listing is empty, as in Python.
    code = "def evens(n):\n    return (i for i in range(0, n, 2))\n"
    tests = ["for v in [evens(4)]:\n    assert list(v) == [0, 2]",
             "for v in [evens(4)]:\n    assert list(v) == [0, 2] and list(v) == [0, 2]",
             "for v in [evens(4)]:\n    assert v == [0, 2]"]
    assert all(check.expr is not None for check in plan(tuple(tests), ""))
    assert run(code, tests, limits=FAST).passed == [True, False, False] == [_passes(code, test) for test in tests]


def _passes(code: str, test: str) -> bool:
    try:
        exec(test, _namespace(code))
    except AssertionError:
        return False
    return True


def test_a_loop_item_from_the_code_passed_back_to_it_runs_whole_in_the_sandbox():
    # `f(x)` needs the very object g(1) returned, which only the sandbox holds; a literal list passed to the code
    # and used again is one object in Python (the code may change it), so it is not copied into each use either.
    sort_in_place = "def f(xs):\n    xs.sort()\n\ndef g(x):\n    return [x]\n\ndef h(xs):\n    return xs\n"
    tests = ["for x in [g(1)]:\n    assert h(x) == [1]",
             "for xs in [[3, 1, 2]]:\n    assert f(xs) is None and xs == [1, 2, 3]"]
    assert [check.expr for check in plan(tuple(tests), "")] == [None, None]
    assert run(sort_in_place, tests, limits=FAST).passed == [True, True]
    # A literal item passed to the code once, or an immutable one passed to it several times, is copied in.
    copied = ["for xs, want in [([3, 1], [1, 3])]:\n    assert h(xs) == want", "for x in [(1, 2)]:\n    assert h(x) == h(x)"]
    assert all(check.expr is not None for check in plan(tuple(copied), ""))


SHORT_CIRCUIT = [
    "assert f(1) == 1 or boom(2) == 2",  # `or` past a true operand
    "assert not (f(1) == 2 and boom(2) == 2)",  # `and` past a false operand
    "assert (boom(2) if f(1) == 2 else f(1)) == 1",  # the branch not taken
    "assert not (f(1) < 0 < boom(2))",  # a chained comparison past a false link
    "for v in [f(1)]:\n    assert v == 1 or boom(2) == 2",
]


@pytest.mark.parametrize("test", SHORT_CIRCUIT)
def test_a_probe_python_would_not_evaluate_neither_decides_nor_breaks_the_test(test):
    # boom raises: it is evaluated in the sandbox (the code cannot be told which branch the trainer takes), and its
    # missing value is never read; and where its value would be wrong, it changes nothing either.
    code = "def f(x):\n    return 1\n\ndef boom(x):\n    raise RuntimeError(x)\n"
    exec(test, _namespace(code))  # Python passes it
    assert plan((test,), "")[0].expr is not None
    assert run(code, [test], limits=FAST).passed == [True]
    assert run(code.replace("raise RuntimeError(x)", "return 2"), [test], limits=FAST).passed == [True]


def test_a_dict_display_is_evaluated_key_then_value():
    (check,) = plan(("assert {f(1): g(1), f(2): g(2)} == {1: 2}",), "")
    assert [source for source, _ in check.probes] == ["f(1)", "g(1)", "f(2)", "g(2)"]


# Valid tests the planner cannot (or should not) unroll or nest that deep: each is run whole in the sandbox, and
# planning it neither raises nor takes long. "Long" is counted in function calls (cProfile's count: the same for the
# same input on any machine, however loaded), not in seconds: the largest case here makes ~4.6 M calls, and an
# unbounded unroll of any of them would make orders of magnitude more.
MAX_PLANNING_CALLS = 10_000_000
UNPLANNABLE = {
    "range past 2**63": "for i in range(100000000000000000000):\n    assert f(i) == i",
    "range past 2**63, negative": "for i in range(0, -100000000000000000000, -1):\n    assert f(i) == i",
    "a long literal list": "for x in [" + "0, " * 100_000 + "]:\n    assert f(x) == 0",
    "nested loops with no assert": "for a in range(60):\n for b in range(60):\n  for c in range(60):\n   for d in []:\n    assert f(1)",
    "a deep expression": "assert f(1) == " + "[" * 150 + "]" * 150,
    "a long chain of operators": "assert f(1) == " + "1 + " * 100_000 + "1",
    "a deep unary chain": "assert f(1) == " + "-" * 100_000 + "1",
    "many probes": "assert " + " and ".join(["f(1)"] * 5_000),
    "a large item copied into many uses": "for x in [[" + "0, " * 20_000 + "]]:\n" + "    assert g(x) == 1\n" * 60,
}


@pytest.mark.parametrize("test", UNPLANNABLE.values(), ids=UNPLANNABLE.keys())
def test_a_test_the_planner_cannot_bound_runs_whole_in_the_sandbox(test):
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    try:
        (check,) = plan((test,), "")
    finally:
        profile.disable()
    assert check.expr is None
    assert pstats.Stats(profile).total_calls < MAX_PLANNING_CALLS


def test_a_large_literal_in_a_test_is_still_a_value_check():
    tests = ["assert f(1) == '" + "x" * 1_000_000 + "'", "assert f(1) == [" + "0, " * 50_000 + "]"]
    assert all(check.expr is not None for check in plan(tuple(tests), ""))


def test_dict_with_keywords_in_a_check_is_pythons_dict():
    """`dict(a=1)` on the expected side is judged as Python builds it (a correct answer must pass)."""
    from rewards._sandbox import run

    assert run("def f():\n    return {'a': 1, 'b': 2}", ["assert f() == dict(a=1, b=2)", "assert f() == dict([('a', 1)], b=2)",
                                                          "assert f() != dict(a=1)"]).passed == [True, True, True]
