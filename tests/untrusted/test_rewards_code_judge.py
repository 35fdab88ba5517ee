"""code_tests' verdicts: nothing the graded code executes can change its own verdict.

The judge (grpokit/untrusted/judge.py) runs the setup and every statement of every test; the code runs in
another process (sandbox/candidate.py) that never sees the tests or the setup's values, and answers each call as plain data
(grpokit/untrusted/values.py).
"""

import importlib
import marshal
import math
import time
from pathlib import Path

import pytest

from grpokit.untrusted import Limits, build_job, run
from grpokit.untrusted.values import BadValue, decode, encode
from rewards.code import CodeTests

ROOT = Path(__file__).resolve().parents[2]
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


def test_the_code_holds_no_results_descriptor_and_a_flooded_link_fails_its_tests_at_once():
    # The results descriptor's number is on the command line, but the code's process closed it before the code
    # ran; its own link to the judge it may flood, which ends the link (a frame past its cap), not the trainer.
    flood = "import os, sys\nfd = int(sys.argv[1])\nos.write(fd, b'x')\n"
    out = run("def add(a, b):\n    return a + b\n" + flood, ADD_TESTS, limits=FAST)
    assert out.passed == [False] * 3 and b"Bad file descriptor" in out.output
    link = ("import gc\ndef add(a, b):\n    server = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n"
            "    server.pipe.send(b'x' * (8 << 20))\n    return a + b\n")
    start = time.monotonic()
    out = run(link, ADD_TESTS, limits=Limits(time_s=5.0))
    assert out.passed == [False] * 3 and time.monotonic() - start < 5.0


def test_the_codes_process_is_sent_no_test_and_no_setup_value():
    tests = ["assert add(20, 22) == 4242", "assert set(pairs(7)) == {(1, 9191)}", "assert abs(ratio(3) - 0.7171) < 1e-6"]
    setup = "import math\nEXPECTED = 6161\ndef helper():\n    return 5151\nclass Box:\n    size = 3"
    job, secret = build_job(WRONG_ADD, tests, setup, FAST)
    sent = marshal.dumps(job)
    for hidden in (b"4242", b"9191", b"7171", b"6161", b"5151", b"assert", b"EXPECTED", b"helper"):
        assert hidden not in sent, hidden
    assert job["setup_code"] == ("import math", "class Box:\n    size = 3")
    assert secret == {"setup": setup, "tests": tests}


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
    ("assert f(1) != f(2)", "!= between two calls"),
    ("assert f(1) < 3 <= f(2)", "chained < and <="),
    ("assert f(5) > 5 and f(5) >= 6", "> and >= under and"),
    ("assert f(1) in [2, 4]", "in a literal"),
    ("assert 'b' in words('a b')", "in a returned list"),
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
    "assert nan() == nan()", "assert math.isnan(nan())", "assert type(count('aab')) == dict", "assert str(point()) == 'P(x=1, y=2)'", "assert [nan()] == [nan()]", "assert inf() < -1e308",
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
    assert expected.count(False) >= 5  # the table holds failing cases too
    assert run(KINDS_CODE, KINDS, limits=FAST).passed == expected


def test_every_plain_value_survives_the_trip_to_the_judge():
    values = [None, True, False, 0, -1, 2**200, -(2**4000), 1.5, -0.0, float("inf"), 1e-310, complex(1, -2), "",
              "héllo\n\ud800", b"\x00\n", [], (1,), {1, 2}, frozenset({"a"}), {"k": [1, (2, None)], 3: {4.5}},
              [[[[]]]], {(1, 2): frozenset({(3,)})}]
    for value in values:
        back = decode(encode(value))
        assert back == value and type(back) is type(value), value
    assert math.isnan(decode(encode(float("nan"))))
    with pytest.raises(BadValue):  # not plain data, and nothing to hold it by reference: refused
        encode(iter(range(3)))


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
    tests = ["assert len(big()) == 10**5", "assert deep() != []", "assert thing() != 1", "assert gen() != 1",
             "assert loop() != [] and loop()[0] is not None", "assert ok() == 3"]
    out = run(code, tests, limits=FAST)
    assert out.passed == [False] * 4 + [True, True], out.notes  # a list holding itself is one object, as in Python
    assert "too big" in out.notes[0] and "too deep" in out.notes[1] and "Thing" in out.notes[2], out.notes


def test_forged_answers_from_the_graded_code_fail_without_harm():
    # The code replaces its own process's answers with hostile bytes for the first four requests; the judge refuses
    # them (each a test failed), and the last test's answer it leaves alone.
    forge = ("import gc\nbad = [b'l1:' * 100000 + b'N', " + repr(b"S40:" + _COLLIDING) + ", b'l4294967295:', b'\\n\\n']\n"
             "server = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n_answer = server.answer\n"
             "server.answer = lambda request: bad.pop(0) if bad else _answer(request)\n"
             "def add(a, b):\n    return a + b\n")
    tests = ADD_TESTS + ["assert add(3, 3) == 6", "assert add(4, 4) == 8"]
    out = run(forge, tests, limits=FAST)
    assert out.passed == [False, False, False, False, True], out


# A value the code chose must not make the judge hang or the trainer allocate (each would take gigabytes or hours).
GREEDY = ["assert [0] * n() == []", "assert 'ab' * n() == ''", "assert n() ** n() > 0", "assert 10 ** n() > 0",
          "assert 1 << n() > 0", "assert '%*d' % (n(), 1) == ''", "assert set(range(n())) == set()",
          "assert round(3, -n()) == 0", "assert " + " * ".join(["huge()"] * 12) + " < 0",
          "assert int(hexes(), 16) < 0", "assert pow(huge(), huge(), huge() - 1) < 0"]


def test_values_the_code_chose_fail_their_tests_within_the_jobs_time():
    # The judge is sandboxed like the code (memory, CPU, wall time): a test its values blow up fails, the trainer
    # holds nothing of them, and the job ends by its deadline.
    code = "def n(): return 10**12\ndef huge(): return 2**100000\ndef hexes(): return 'f' * 300000\n"
    start = time.monotonic()
    out = run(code, GREEDY, limits=FAST)
    assert out.passed == [False] * len(GREEDY), out.notes
    assert time.monotonic() - start < FAST.wall_s(len(GREEDY)) + 3


def test_several_asserts_and_loops_are_judged_by_the_tests_own_statements():
    tests = ["assert add(1, 2) == 3\nassert add(2, 2) == 4",
             "for a, b in [(1, 2), (2, 2), (0, 5)]:\n    assert add(a, b) == a + b",
             "for i in range(4):\n    for j in (i, 7):\n        assert add(i, j) - j == i",
             "for i in [1, 2]:\n    assert add(i, 0) == i\nassert add(i, i) == 4"]  # i stays bound after its loop
    assert run("def add(a, b):\n    return a + b\n", tests, limits=FAST).passed == [True] * 4
    assert run("def add(a, b):\n    return a + b if a < 2 else 0\n", tests, limits=FAST).passed == [False] * 4
    assert run(WRONG_ADD + ATTACKS["frame_walk"], tests, limits=FAST).passed == [False] * 4


def test_the_judge_modules_document_themselves():
    import doctest

    for module in (f"grpokit.untrusted.{name}" for name in ("judge", "candidate", "values", "link")):
        assert doctest.testmod(importlib.import_module(module)).failed == 0, module


@pytest.mark.parametrize("name", ["patched_os_write", "patched_int", "patched_compile", "patched_exec"])
def test_a_generator_expression_resists_the_cheap_attacks_too(name):
    # The judge's own builtins, compile and os.write are in another process than the code's.
    loop = ["assert all(add(a, b) == a + b for a, b in [(1, 2), (2, 2), (0, 5)])"]
    completion = f"```python\n{WRONG_ADD}{ATTACKS[name]}\n```"
    assert CodeTests(timeout=FAST.time_s)(completions=[completion], tests=[loop]) == [0.0]


def test_the_calls_of_one_test_share_its_time():
    # A loop of 8 hanging calls is one test: it gets one timeout in all, not one per call.
    hang = "def f(x):\n    while True:\n        pass\n"
    tests = ["for i in range(8):\n    assert f(i) == i", "assert f(0) == 0 or True"]
    start = time.monotonic()
    out = run(hang, tests, limits=Limits(time_s=0.3))
    assert out.passed == [False, False] and out.ended == "done"
    assert time.monotonic() - start < 8 * 0.3


def test_a_library_name_the_code_imported_is_the_judges_own():
    # `Counter`, `sqrt` and `math` here exist only because the code imported them: the judge imports its own, so the
    # code cannot choose what they compute (a module patched in the code's process is patched there only).
    tests = ["assert tally('aab') == Counter({'a': 2, 'b': 1})", "assert root(2) == sqrt(2)",
             "assert math.isclose(root(2), 1.4142135623)"]
    code = "from collections import Counter\nfrom math import sqrt\nimport math\ndef tally(s): return Counter(s)\ndef root(x): return sqrt(x)\n"
    assert run(code, tests, limits=FAST).passed == [True, True, True]
    patched = ("import math, collections\nfrom math import sqrt\nfrom collections import Counter\n"
               "math.isclose = lambda *a, **k: True\ncollections.Counter.__eq__ = lambda s, o: True\n"
               "math.sqrt = lambda x: 0\ndef tally(s): return Counter()\ndef root(x): return 0\n")
    assert run(patched, tests, limits=FAST).passed == [False, False, False]


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
    # The setup runs in the judge only; the code's process never had the name to rebind.
    assert run(right, [test], setup, limits=FAST).passed == [True]
    assert run(REBIND, [test], setup, limits=FAST).passed == [False]
    assert run(REBIND + ATTACKS["frame_walk"].replace("range(3)", "range(4)"), [test], setup, limits=FAST).passed == [False]


def test_a_setup_value_reaches_the_code_only_as_an_argument():
    # A setup that draws a random number: the judge draws it, a test passes it to the code; the code cannot read it.
    setup = "import random\nSEED = random.random()"
    tests = ["assert f(SEED) == SEED * 2", "assert g() == SEED"]
    code = "def f(x):\n    return x * 2\ndef g():\n    return SEED\n"
    out = run(code, tests, setup, limits=FAST)
    assert out.passed == [True, False] and "NameError" in out.notes[0], out.notes


def test_the_setups_functions_classes_and_modules_are_the_judges():
    setup = "import string\ndef check(v):\n    return v == 3\nclass Box:\n    pass"
    tests = ["assert check(f(1))", "assert g() == string.digits", "assert isinstance(h(), Box)"]
    right = "def f(x):\n    return x + 2\ndef g():\n    return '0123456789'\ndef h():\n    return Box()\n"
    wrong = ("import string, builtins\nstring.digits = 'x'\ncheck = lambda v: True\nbuiltins.isinstance = lambda *a: True\n"
             "def f(x):\n    return 0\ndef g():\n    return 'x'\ndef h():\n    return 1\n")
    assert run(right, tests, setup, limits=FAST).passed == [True, True, True]
    assert run(wrong, tests, setup, limits=FAST).passed == [False, False, False]


def test_a_name_a_test_binds_is_never_the_codes():
    # `expected` is bound by an earlier test, in the judge; the code's own `expected` is not the test's.
    tests = ["expected = 3", "assert add(1, 2) == expected"]
    assert run("expected = 0\ndef add(a, b):\n    return 0\n", tests, limits=FAST).passed == [True, False]
    assert run("def add(a, b):\n    return a + b\n", tests, limits=FAST).passed == [True, True]


# Python evaluates each sub-expression of a test once, left to right, and skips what `and`, `or`, `if/else` and a
# chained comparison short-circuit past. The judge runs the test's own statements, so each call into the code is
# made once, where Python makes it. A code that counts its calls answers 10 on odd calls and 0 on even ones, so a
# call made twice for one Python evaluation would see two different values.
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
    tests = ["for v in [f(1)[5]]:\n    assert True or v"]
    assert run("def f(x):\n    return [1]\n", tests, limits=FAST).passed == [False]


def test_a_loop_item_is_consumed_as_python_consumes_it():
    # A generator item listed once is its items; listed twice, the second listing is empty, as in Python.
    code = "def evens(n):\n    return (i for i in range(0, n, 2))\n"
    tests = ["for v in [evens(4)]:\n    assert list(v) == [0, 2]",
             "for v in [evens(4)]:\n    assert list(v) == [0, 2] and list(v) == [0, 2]",
             "for v in [evens(4)]:\n    assert v == [0, 2]"]
    assert run(code, tests, limits=FAST).passed == [True, False, False] == [_passes(code, test) for test in tests]


def _passes(code: str, test: str) -> bool:
    try:
        exec(test, _namespace(code))
    except AssertionError:
        return False
    return True


def test_a_value_passed_back_to_the_code_and_changed_there_is_changed_for_the_test():
    # The list g(1) returned crosses back as an argument; a literal list the code sorts in place is sorted here too.
    sort_in_place = "def f(xs):\n    xs.sort()\n\ndef g(x):\n    return [x]\n\ndef h(xs):\n    return xs\n"
    tests = ["for x in [g(1)]:\n    assert h(x) == [1]",
             "for xs in [[3, 1, 2]]:\n    assert f(xs) is None and xs == [1, 2, 3]"]
    assert run(sort_in_place, tests, limits=FAST).passed == [True, True]


SHORT_CIRCUIT = [
    "assert f(1) == 1 or boom(2) == 2",  # `or` past a true operand
    "assert not (f(1) == 2 and boom(2) == 2)",  # `and` past a false operand
    "assert (boom(2) if f(1) == 2 else f(1)) == 1",  # the branch not taken
    "assert not (f(1) < 0 < boom(2))",  # a chained comparison past a false link
    "for v in [f(1)]:\n    assert v == 1 or boom(2) == 2",
]


@pytest.mark.parametrize("test", SHORT_CIRCUIT)
def test_a_call_python_would_not_make_is_not_made(test):
    # boom raises: the test's own `and`, `or`, `if`-`else` skip it, as Python's do.
    code = "def f(x):\n    return 1\n\ndef boom(x):\n    raise RuntimeError(x)\n"
    exec(test, _namespace(code))  # Python passes it
    assert run(code, [test], limits=FAST).passed == [True]
    assert run(code.replace("raise RuntimeError(x)", "return 2"), [test], limits=FAST).passed == [True]


def test_dict_with_keywords_in_a_check_is_pythons_dict():
    """`dict(a=1)` on the expected side is judged as Python builds it (a correct answer must pass)."""
    assert run("def f():\n    return {'a': 1, 'b': 2}", ["assert f() == dict(a=1, b=2)", "assert f() == dict([('a', 1)], b=2)",
                                                          "assert f() != dict(a=1)"]).passed == [True, True, True]
