"""code_tests' verdicts are Python's, and the graded code never takes part in deciding them.

The setup and every statement of a test run on a trusted side that never runs the graded code; each use of a
name the code defines crosses to the code's sandbox as plain data and comes back as plain data
(grpokit/untrusted/judge.py, candidate.py, values.py).
"""

import pytest

from grpokit.untrusted import Limits, run

FAST = Limits(time_s=1.0, memory_mb=256, processes=16, file_mb=4, output_kb=16)


def python_verdicts(code: str, tests: list, setup: str = "") -> list:
    """Each test's verdict as Python gives it: setup, code and test run together in one namespace."""
    verdicts = []
    for test in tests:
        namespace = {"__name__": "__main__"}
        try:
            exec(setup, namespace)
            exec(code, namespace)
            exec(test, namespace)
            verdicts.append(True)
        except Exception:  # noqa: BLE001 - a failing test, whatever it raised
            verdicts.append(False)
    return verdicts


# --- The expected side is out of the code's reach, whatever the setup defines. ---------------------------------

# (setup, test, a right answer): each wrong answer below returns what the setup holds instead of computing it.
SETUP_VALUES = [
    ("EXPECTED = 4", "assert f(2) == EXPECTED", "def f(x):\n    return x * 2"),
    ("REF = [1, 2, 3]", "assert f(3) == REF", "def f(n):\n    return list(range(1, n + 1))"),
    ("import builtins\nbuiltins.EXPECTED = 4", "assert f(2) == EXPECTED", "def f(x):\n    return x * 2"),
    ("exec('EXPECTED = 4')", "assert f(2) == EXPECTED", "def f(x):\n    return x * 2"),
    ("def expected():\n    return 4", "assert f(2) == expected()", "def f(x):\n    return x * 2"),
]
READS_THE_SETUP = {
    "by name": "def f(*a):\n    return EXPECTED\n",
    "by name, list": "def f(*a):\n    return REF\n",
    "a setup function": "def f(*a):\n    return expected()\n",
    "from the builtins": "import builtins\ndef f(*a):\n    return getattr(builtins, 'EXPECTED', None) or globals().get('REF')\n",
    # every list and int a container reachable through the garbage collector holds, and every string constant
    # of every code object: the setup's and the tests' values and source, wherever the process keeps them
    "gc and code objects": """import gc, sys
def f(*a):
    found = []
    for o in gc.get_objects():
        try:
            if isinstance(o, dict):
                for k, v in list(o.items()):
                    if k in ('EXPECTED', 'REF'):
                        return v
                    if isinstance(v, str) and ('EXPECTED' in v or 'REF' in v):
                        found.append(v)
            if type(o).__name__ == 'code':
                found += [c for c in o.co_consts if isinstance(c, str) and ('EXPECTED' in c or 'REF' in c)]
        except Exception:
            pass
    for text in found:
        for line in text.splitlines():
            if '=' in line:
                try:
                    return eval(line.split('=', 1)[1])
                except Exception:
                    pass
    return None
""",
}


@pytest.mark.parametrize("setup, test, right", SETUP_VALUES, ids=[s.splitlines()[-1] for s, _, _ in SETUP_VALUES])
def test_no_route_from_the_code_reaches_a_value_the_setup_defines(setup, test, right):
    assert run(right, [test], setup, FAST).passed == [True]
    for name, wrong in READS_THE_SETUP.items():
        assert run(wrong, [test], setup, FAST).passed == [False], name


def test_the_code_keeps_the_setups_imports_and_classes():
    # What the code needs of the setup -- its imports, its classes -- it has; only its values stay out of reach.
    setup = "import math\nfrom collections import namedtuple\nP = namedtuple('P', 'x y')\nclass Box:\n    def __init__(self, v):\n        self.v = v"
    code = "def f(x):\n    return math.floor(x)\ndef g():\n    return P(1, 2)\ndef h(v):\n    return Box(v).v * 2"
    tests = ["assert f(2.5) == 2", "assert g() == P(1, 2) and g().y == 2", "assert h(3) == 6"]
    assert run(code, tests, setup, FAST).passed == [True, True, True]


# --- What a test observes of a value is what Python shows. ---------------------------------------------------------

KINDS_CODE = """
import math
from collections import Counter, OrderedDict, defaultdict, namedtuple, deque
from fractions import Fraction
from decimal import Decimal
Point = namedtuple('Point', 'x y')
class I(int):
    pass
class S(str):
    pass
def count(s): return Counter(s)
def ordered(): return OrderedDict([('b', 1), ('a', 2)])
def grouped():
    d = defaultdict(list)
    d['k'].append(1)
    return d
def point(): return Point(1, 2)
def small(): return I(3)
def word(): return S('ab')
def nan(): return float('nan')
def inf(): return float('-inf')
def cx(): return complex(1, -2)
def raw(): return b'\\x00a'
def items(): return {1, 2}, frozenset({3}), [None, (1.5, 'x')]
def queue(): return deque([1, 2])
def half(): return Fraction(1, 2)
def dec(): return Decimal('1.10')
def span(): return range(1, 4)
def nothing(): return None
"""
KINDS = [
    "assert type(count('aab')) == dict", "assert type(count('aab')) == Counter", "assert count('aab') == {'a': 2, 'b': 1}",
    "assert count('aab').most_common(1) == [('a', 2)]", "assert repr(count('ab')) == \"Counter({'a': 1, 'b': 1})\"",
    "assert isinstance(ordered(), OrderedDict) and list(ordered()) == ['b', 'a']", "assert str(ordered()) == \"OrderedDict([('b', 1), ('a', 2)])\"",
    "assert grouped() == {'k': [1]} and type(grouped()).__name__ == 'defaultdict'", "assert grouped()['new'] == []",
    "assert str(point()) == 'Point(x=1, y=2)'", "assert point() == (1, 2) and point().x == 1 and type(point()).__name__ == 'Point'",
    "assert point()._asdict() == {'x': 1, 'y': 2}", "assert type(point()) == tuple",
    "assert small() == 3 and isinstance(small(), int)", "assert type(small()) == int", "assert type(small()).__name__ == 'I'",
    "assert word() == 'ab' and word().upper() == 'AB'", "assert type(word()) is str",
    "assert nan() != nan()", "assert math.isnan(nan())", "assert [nan()] == [nan()]", "assert inf() < -1e308",
    "assert cx() == 1 - 2j", "assert raw() == b'\\x00a' and type(raw()) is bytes", "assert items() == ({2, 1}, frozenset({3}), [None, (1.5, 'x')])",
    "assert type(items()[1]) is frozenset", "assert queue() == deque([1, 2]) and queue().popleft() == 1", "assert queue() == [1, 2]",
    "assert half() == 0.5 and str(half()) == '1/2'", "assert str(dec()) == '1.10' and dec() == Decimal('1.1')",
    "assert span() == range(1, 4) and list(span()) == [1, 2, 3]", "assert nothing() is None", "assert str(nothing()) == 'None'",
]


def test_what_a_test_observes_of_a_value_matches_python():
    expected = python_verdicts(KINDS_CODE, KINDS)
    assert expected.count(False) >= 3  # the table holds failing cases too
    got = run(KINDS_CODE, KINDS, limits=FAST).passed
    assert got == expected, [test for test, g, e in zip(KINDS, got, expected) if g != e]


def test_an_exception_the_code_raises_is_caught_as_python_catches_it():
    code = ("class Bad(ValueError):\n    pass\n"
            "def f(x):\n    if x < 0:\n        raise Bad('negative')\n    return x\n"
            "def g(x):\n    raise KeyError(x)\n")
    tests = ["try:\n    f(-1)\nexcept ValueError as e:\n    assert str(e) == 'negative'\nelse:\n    assert False",
             "try:\n    g(1)\nexcept LookupError:\n    pass",
             "try:\n    g(1)\nexcept ValueError:\n    pass",
             "assert f(2) == 2"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True, True, False, True]


def test_an_exception_class_the_code_defines_is_caught_by_its_name_and_its_bases():
    code = ("class EmptyError(LookupError):\n    pass\nclass Odd(EmptyError):\n    pass\n"
            "def first(xs):\n    if not xs:\n        raise EmptyError('empty')\n    if len(xs) % 2:\n        raise Odd(len(xs))\n    return xs[0]\n")
    tests = ["try:\n    first([])\nexcept EmptyError as e:\n    assert e.args == ('empty',) and type(e).__name__ == 'EmptyError'",
             "try:\n    first([1])\nexcept LookupError as e:\n    assert str(e) == '1'", "try:\n    first([1])\nexcept Odd:\n    pass",
             "try:\n    first([1, 2, 3])\nexcept KeyError:\n    pass", "assert first([4, 5]) == 4"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True, True, True, False, True]


def test_an_argument_the_code_changes_in_place_is_changed_for_the_test():
    code = "def f(xs):\n    xs.sort()\ndef g(d):\n    d['k'] = 1\ndef h(xs, ys):\n    ys.append(len(xs))"
    tests = ["xs = [3, 1]\nf(xs)\nassert xs == [1, 3]", "d = {}\nassert g(d) is None and d == {'k': 1}",
             "a, b = [1, 2], []\nh(a, b)\nh(a, b)\nassert b == [2, 2]", "xs = [2, 1]\nf(xs)\nassert xs == [2, 1]"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True, True, True, False]


# --- No statement's verdict is computed where the code runs. -------------------------------------------------------

SETUP_CHECK = "def check(v):\n    return v == 3"
FORMS = [  # each passes for a right f (f(x) = x + 1) and fails for a wrong one
    "x = f(1)\nassert x == 2",
    "assert [f(i) for i in range(3)] == [1, 2, 3]",
    "assert all(f(i) == i + 1 for i in range(3))",
    "assert check(f(2))",
    "for i in range(3):\n    y = f(i)\n    assert y - i == 1",
    "def twice(v):\n    return f(f(v))\nassert twice(0) == 2",
]
RIGHT = "def f(x):\n    return x + 1\n"
WRONG = "def f(x):\n    return 0\n"
FORGERIES = {
    # finds the reporter (and anything holding the nonce) through the garbage collector or the stack, reports passes
    "gc walk": """import gc, os
for o in gc.get_objects():
    try:
        if callable(o) and getattr(o, '__name__', '') in ('report', 'reporter', '_report'):
            for i in range(8):
                o('pass', i)
    except BaseException:
        pass
""",
    "frame walk": """import sys
def f(x):
    fr = sys._getframe()
    while fr is not None:
        for v in list(fr.f_locals.values()):
            if callable(v) and getattr(v, '__name__', '') in ('report', 'reporter'):
                for i in range(8):
                    v('pass', i)
        fr = fr.f_back
    return 0
""",
    # rebinds the setup's helper and the builtins the test uses
    "rebinding": """import builtins
check = lambda v: True
builtins.all = lambda *a: True
builtins.AssertionError = type('Nope', (Exception,), {})
""",
    # a value that equals, hashes and prints as anything
    "lying value": """class Any:
    __eq__ = lambda s, o: True
    __ne__ = lambda s, o: False
    __hash__ = lambda s: 3
    __str__ = __repr__ = lambda s: '2'
    __bool__ = lambda s: True
    def __sub__(s, o): return 1
    def __rsub__(s, o): return 1
    def __iter__(s): return iter([1, 2, 3])
def f(x):
    return Any()
""",
    # replaces modules the harness might look up at run time
    "sys.modules": """import sys
for name in list(sys.modules):
    if name not in ('sys', 'builtins'):
        sys.modules[name] = None
""",
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_wrong_answer_forges_no_test_whatever_it_runs(name):
    assert run(RIGHT, FORMS, SETUP_CHECK, FAST).passed == [True] * len(FORMS)
    out = run(WRONG + FORGERIES[name], FORMS, SETUP_CHECK, FAST)
    assert out.passed == [False] * len(FORMS), (out.passed, out.notes, out.output[-600:])


def test_an_instance_of_a_class_the_code_defines_is_used_through_its_methods_only():
    # Its methods run in the code's sandbox and their results cross as plain data; comparing, hashing or printing
    # the instance itself would run the code's own methods on the trusted side, so such a test fails, saying why.
    code = ("class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, v):\n        self.items.append(v)\n"
            "    def pop(self):\n        return self.items.pop()\n    def __eq__(self, other):\n        return True\n"
            "def make():\n    return Stack()\n")
    tests = ["s = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2 and s.items == [1]", "assert make() == 5"]
    out = run(code, tests, limits=FAST)
    assert out.passed == [True, False]
    assert "Stack" in out.notes[0] and "defines" in out.notes[0], out.notes


def test_an_instance_of_a_class_the_setup_defines_is_judged_with_the_setups_class():
    setup = ("class Node:\n    def __init__(self, v, nxt=None):\n        self.v, self.nxt = v, nxt\n"
             "    def __eq__(self, other):\n        return isinstance(other, Node) and (self.v, self.nxt) == (other.v, other.nxt)\n")
    code = ("def rev(node):\n    out = None\n    while node:\n        out, node = Node(node.v, out), node.nxt\n    return out\n")
    lying = "class Node:\n    def __init__(self, *a):\n        pass\n    __eq__ = lambda s, o: True\ndef rev(node):\n    return Node()\n"
    tests = ["assert rev(Node(1, Node(2))) == Node(2, Node(1))", "assert isinstance(rev(Node(1)), Node)"]
    assert run(code, tests, setup, FAST).passed == [True, True]
    assert run(lying, tests, setup, FAST).passed == [False, False]


# --- A hostile pass: each wrong answer tries one more way to pass, and scores nothing, within the job's time. ----

SMUGGLE = """import sys
def f(x):
    return 0
def run_it(text):
    return 0
def src():
    return ("import sys\\nfr = sys._getframe()\\nwhile fr is not None:\\n"
            "    r = fr.f_locals.get('report')\\n    if callable(r):\\n        [r('pass', i) for i in range(4)]\\n"
            "    fr = fr.f_back\\n")
run_it.__module__, run_it.__qualname__ = MODULE, NAME
"""
# (name, code, tests, setup): the code's answers are wrong; every test must fail.
HOSTILE = [
    # a `math` of the code's own, as an object or a class: a test's `math` is the judge's own module
    ("fake math module", "class _M:\n    isclose = staticmethod(lambda *a, **k: True)\nmath = _M()\ndef f(x):\n    return 0",
     ["assert math.isclose(f(2), 1.414, rel_tol=1e-3)"], ""),
    ("math as a class", "class math:\n    isclose = staticmethod(lambda *a, **k: True)\ndef f(x):\n    return 0",
     ["assert math.isclose(f(2), 1.414, rel_tol=1e-3)"], ""),
    # a function claiming to be a library one that runs text: the judge never imports it, the call stays the code's
    *[(f"claims to be {m}.{n}", SMUGGLE.replace("MODULE", repr(m)).replace("NAME", repr(n)),
       ["assert run_it(src()) is None", "assert f(1) == 2", "assert f(2) == 3", "assert f(3) == 4"], "")
      for m, n in [("builtins", "eval"), ("builtins", "exec"), ("functools", "__builtins__.exec"), ("timeit", "timeit"),
                   ("typing", "get_type_hints"), ("pickle", "loads"), ("os", "system")]],
    # an exception whose class claims a builtin's name is caught as what it is
    ("exception named AssertionError", "class E(Exception):\n    pass\nE.__name__ = E.__qualname__ = 'AssertionError'\n"
     "def f(x):\n    raise E()", ["try:\n    f(1)\nexcept AssertionError:\n    pass\nelse:\n    raise ValueError"], ""),
    ("SystemExit from a call", "def f(x):\n    raise SystemExit(0)", ["assert f(1) == 2", "r = f(1)\nassert r is None"], ""),
    # a generator whose items lie, and one that never ends
    ("lying items", "class A:\n    __eq__ = lambda s, o: True\n    __hash__ = lambda s: 0\ndef f(n):\n    for _ in range(n):\n        yield A()",
     ["assert list(f(3)) == [0, 1, 2]", "assert set(f(2)) == {0, 1}", "assert sorted(f(2)) == [0, 1]"], ""),
    ("endless generator", "import itertools\ndef f(n):\n    return itertools.count()", ["assert sum(1 for _ in f(3)) == 3"], ""),
    # values past the caps
    ("huge values", "def f(x):\n    return 'x' * 10**7\ndef g(x):\n    return 10 ** 100000\ndef h(x):\n    return list(range(10**6))",
     ["assert len(f(1)) == 3", "assert g(1) > 0 and False", "assert len(h(1)) == 3"], ""),
    # reads every process's memory map, environment, command line and open files for the setup's secret
    ("reads /proc", """import os, re
def f():
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        for part in ['environ', 'cmdline', 'mem'] + ['fd/' + fd for fd in os.listdir(f'/proc/{pid}/fd') if True] if os.access(f'/proc/{pid}/fd', os.R_OK) else ['environ', 'cmdline']:
            try:
                with open(f'/proc/{pid}/{part}', 'rb') as file:
                    found = re.search(rb'zq-secret-[0-9]+', file.read(1 << 20))
                if found:
                    return found.group().decode()
            except (OSError, ValueError):
                pass
    return None
""", ["assert f() == SECRET"], "SECRET = 'zq-secret-' + '91'"),
    # a code runner that stops answering once loaded (a global a test reads is asked for first)
    ("silent code runner", "import gc, time\nK = 1\nserver = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n"
     "server.answer = lambda request: time.sleep(60)\ndef f(x):\n    return 0", ["assert K == 1 and f(1) == 1", "assert f(2) == 2"], ""),
    ("silent code runner, no globals read", "import gc, time\nserver = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')\n"
     "server.answer = lambda request: time.sleep(60)\ndef f(x):\n    return 0", ["assert f(1) == 1", "assert f(2) == 2"], ""),
    # answers a test's call only after the judge has given up on it, to confuse the next test's answer with it
    ("late answers", "import time\ndef f(x):\n    end = time.monotonic() + 1.5\n    while time.monotonic() < end:\n        try:\n"
     "            time.sleep(0.05)\n        except BaseException:\n            pass\n    return x + 1",
     ["assert f(1) == 2", "assert f(2) == 4"], ""),
]


@pytest.mark.parametrize("name, code, tests, setup", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_a_hostile_wrong_answer_scores_nothing_within_the_jobs_time(name, code, tests, setup):
    import time

    start = time.monotonic()
    out = run(code, tests, setup, FAST)
    assert out.passed == [False] * len(tests), (out.passed, out.notes, out.output[-600:])
    assert time.monotonic() - start < FAST.wall_s(len(tests)) + 3


def test_a_right_answer_passes_the_same_tests():
    # The hostile table's tests are fair: an honest answer to the same tests passes them.
    right = "import math\ndef f(x):\n    return 1.4142 if x == 2 else x + 1\ndef g(n):\n    return list(range(n))\n"
    tests = ["assert math.isclose(f(2), 1.414, rel_tol=1e-3)", "assert f(1) == 2", "assert list(g(3)) == [0, 1, 2]"]
    assert run(right, tests, limits=FAST).passed == [True, True, True]


@pytest.mark.parametrize("data", [
    b"xs5:setups4:Boxd1:s9:__class__N",  # an attribute that would change the rebuilt object's class
    b"xs5:setups4:BoxNd1:s8:__dict__d0:",  # or replace its attributes wholesale
    b"xs5:setups7:MissingNd0:",  # a class this side does not have
    b"xs10:namedtuples1:Pl1:s5:classt1:N",  # a namedtuple field Python refuses
    b"xs11:defaultdicts4:evald0:",  # a factory other than a plain type
])
def test_a_forged_value_naming_classes_or_attributes_is_refused(data):
    from grpokit.untrusted.values import BadValue, decode

    class Box:
        pass

    with pytest.raises(BadValue):
        decode(data, {"Box": Box})


# --- A test may hand the code its own functions and generators: the code's calls on them run on the trusted side. -

def test_a_function_or_generator_a_test_passes_to_the_code_works_as_in_python():
    setup = "def check(v):\n    return v == 3"
    code = ("def apply(fn, x):\n    return fn(x)\ndef sort_by(xs, key):\n    return sorted(xs, key=key)\n"
            "def total(items):\n    return sum(items)\ndef keep(pred, xs):\n    return [x for x in xs if pred(x)]\n")
    tests = ["assert apply(lambda x: x * 2, 3) == 6", "assert sort_by(['bb', 'a', 'ccc'], key=len) == ['a', 'bb', 'ccc']",
             "assert total(x for x in range(4)) == 6", "assert apply(check, 3) and not apply(check, 4)",
             "assert keep(lambda x: apply(lambda y: y % 2, x), [1, 2, 3]) == [1, 3]",  # the code and the test, nested
             "def twice(v):\n    return 2 * v\nassert apply(twice, 5) == 11"]
    assert run(code, tests, setup, FAST).passed == python_verdicts(code, tests, setup) == [True] * 5 + [False]


def test_what_a_test_lends_the_code_gives_it_no_way_into_the_trusted_side():
    # The code asks, through its own side of the link, for the lent function's globals, builtins and code, and calls
    # it with values meant to walk the trusted side's frames; it gets errors, and its wrong answers score nothing.
    code = """import gc
def apply(fn, x):
    server = next(o for o in gc.get_objects() if type(o).__name__ == 'Server')
    for name in ('__globals__', '__builtins__', '__code__', '_link', 'f_back'):
        try:
            got = server.ask('getattr', fn, name)
            return got['report'] if isinstance(got, dict) else got
        except BaseException:
            pass
    return 0
"""
    tests = ["assert apply(lambda v: v + 1, 1) == 2", "assert apply(len, [1]) == 1"]
    out = run(code, tests, "", FAST)
    assert out.passed == [False, False], out.notes


def test_the_codes_plain_globals_identity_and_isinstance_read_as_in_python():
    code = ("K = 3\ndef f(xs):\n    xs.append(1)\n    return xs\ndef pair(x):\n    return [x, x]\n"
            "class Shape:\n    def area(self):\n        return 0\nclass Square(Shape):\n    def __init__(self, s):\n"
            "        self.s = s\n    def area(self):\n        return self.s ** 2\n")
    tests = ["assert K == 3", "a = []\nassert f(a) is a and a == [1]", "p = pair([])\np[0].append(2)\nassert p[1] == [2]",
             "sq = Square(3)\nassert sq.area() == 9 and isinstance(sq, Shape) and sq.s == 3",
             "assert not isinstance(Shape(), Square)", "assert list(map(len, pair('ab'))) == [2, 2]",
             "assert type(Square(1)).__name__ == 'Square'"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True] * 7


def test_a_global_of_the_codes_that_a_test_reads_is_as_the_codes_last_answer_left_it():
    code = "COUNT = 0\nSEEN = []\ndef tick(x):\n    global COUNT\n    COUNT += 1\n    SEEN.append(x)\n    return COUNT\n"
    tests = ["assert COUNT == 0", "tick('a')\nassert COUNT == 1 and SEEN == ['a']", "seen = SEEN\ntick('b')\nassert seen == ['a', 'b']",
             "assert COUNT == 3", "assert [tick(0), COUNT] == [3, 3]", "assert COUNT == 2"]
    assert run(code, tests, limits=FAST).passed == python_verdicts_in_one_namespace(code, tests) == [True] * 3 + [False, True, False]


def python_verdicts_in_one_namespace(code: str, tests: list) -> list:
    """Python's verdicts when the tests run one after another in the code's namespace, as code_tests runs them."""
    namespace, verdicts = {"__name__": "__main__"}, []
    exec(code, namespace)
    for test in tests:
        try:
            exec(test, namespace)
            verdicts.append(True)
        except Exception:  # noqa: BLE001
            verdicts.append(False)
    return verdicts


# A setup that binds the compared name other than by a plain assignment; the wrong answer rebinds that name as a
# global of its own: the test's name is the setup's.
@pytest.mark.parametrize("setup, test, code", [
    ("globals()['EXPECTED'] = 3", "assert add(1, 2) == EXPECTED",
     "def add(a, b):\n    global EXPECTED\n    EXPECTED = 0\n    return 0"),
    ("exec('REF = [1, 2, 3]')", "assert my_sort([3, 1, 2]) == REF",
     "def my_sort(x):\n    global REF\n    REF = None\n    return None"),
    ("from string import *", "assert count_letters() == len(ascii_lowercase)",
     "def count_letters():\n    global ascii_lowercase\n    ascii_lowercase = 'abc'\n    return 3"),
])
def test_a_wrong_solution_cannot_rebind_a_setup_name_it_is_compared_with(setup, test, code):
    assert run(code, [test], setup, FAST).passed == [False]


def test_a_test_looping_past_any_bound_fails_alone_and_never_raises_out_of_the_reward():
    from rewards.code import CodeTests

    tests = ["for i in range(100000000000000000000):\n    assert f(i) == i", "assert f(3) == 3"]
    assert CodeTests(timeout=0.5)(completions=["def f(x):\n    return x"], tests=[tests]) == [0.5]


def test_what_the_code_prints_during_a_call_is_what_the_test_captures():
    code = "def hello(name):\n    print('hi', name)\n    return len(name)\n"
    tests = ["import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    n = hello('bo')\n"
             "assert buf.getvalue() == 'hi bo\\n' and n == 2",
             "import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    hello('x')\nassert buf.getvalue() == 'bye\\n'"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True, False]


def test_large_globals_of_the_codes_do_not_stop_it_loading():
    # Each table is within one value's caps; together they pass the load report's size: the rest go by reference.
    code = "A = list(range(60000))\nB = list(range(60000))\nC = list(range(60000))\ndef f():\n    return 1\n"
    assert run(code, ["assert f() == 1", "assert len(C) == 60000 and C[5] == 5"], limits=FAST).passed == [True, True]


def test_objects_of_the_codes_class_that_a_test_builds_go_back_to_the_code_as_themselves():
    # MBPP's max_chain_length: the tests build the code's Pair objects and pass a list of them to the code.
    code = ("class Pair:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\n"
            "def max_chain_length(arr, n):\n    best = [1] * n\n    for i in range(1, n):\n        for j in range(i):\n"
            "            if arr[i].a > arr[j].b and best[i] < best[j] + 1:\n                best[i] = best[j] + 1\n"
            "    return max(best)\n")
    tests = ["assert max_chain_length([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4) == 3",
             "assert max_chain_length([Pair(1, 2), Pair(3, 4), Pair(5, 6), Pair(7, 8)], 4) == 4"]
    assert run(code, tests, limits=FAST).passed == python_verdicts(code, tests) == [True, True]
