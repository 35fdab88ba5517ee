"""Deciding pass/fail for code_tests where the graded code cannot reach: in the trainer, from values.

Each test is parsed here before anything runs. A test made of `assert EXPR` statements (messages
ignored; `for` loops over a literal list, tuple or `range(<ints>)` are unrolled) whose EXPRs are built
from literals, comparisons, `and`/`or`/`not`, arithmetic, subscripts and a short list of pure builtins
(rewards/_evaluate.py: `BUILTINS`, and `math.isclose` and friends) is a *value check*: each smallest
sub-expression rooted in the graded code's own names (`add(1, 2)`, `f(x)` in `set(f(x)) == {1, 2}`) is
cut out as a *probe*, and the sandbox is sent only the probes. It evaluates each and sends back its
value (literal types only, see rewards/_values.py); the rest of the test -- the expected value, the
comparison, the builtins around the probe -- is evaluated here, with the real builtins, whatever the
code redefined. So nothing the code executes can change a value check's verdict: it can only choose the
values of its own probes, without seeing what they are compared with.

Each sub-expression is evaluated once, in Python's order, as Python would: a loop's items once each, before
its body, their values bound to the loop's names for every use (`for v in [f(4)]: assert 3 < v < 5` is one
probe, not one per use of `v`); a chained comparison's operands once each; a dict display key, then value.
The sandbox evaluates every probe of a test, including those Python's `and`, `or`, `if/else` or a chained
comparison would skip (telling it which are needed would show it the expected side); the trainer reads only the
values Python would have evaluated, so a skipped probe's error or value decides nothing. What a skipped probe
does in the sandbox still happens there: state the code keeps changes, and its time counts against the test's.

Values are compared as their base types: a Counter, OrderedDict or defaultdict arrives as a dict, a
namedtuple as a tuple, an int or str subclass as int or str, so `==` holds as Python's does between those
and literals; a value of any other type (a custom object, a Fraction, a generator outside `list(...)`
and the other consumers), or past the caps (65,536 items, 512 KiB or 64 levels deep; 262,144 items for
all of one candidate's values together) fails its test.

The setup's names (`setup_column`) are never the code's: a name the setup binds is not a probe's root.
Which names those are is learned by running the setup alone, with no candidate's code, in a sandbox of
its own, once per distinct setup per process (rewards/_sandbox.py, `survey`) -- not from its text,
which misses what `from m import *`, `globals()[...] =`, `exec(...)` or `builtins.X =` bind, and not
from the candidate's run, which the code could change. So a test's classification depends only on the
tests and the setup. A setup name holding a plain value (`EXPECTED = 3`, `REF = [1, 2]`, a star-imported
string) is a *constant* of the value check: the candidate's sandbox reports its value right after the
setup ran and before the code runs (the value the code saw, random or not; the first report of a step
counts), and it is evaluated here, so rebinding it changes nothing. (Making such tests opaque instead
would not do: an opaque test runs in the code's namespace, where the code rebinds the name.) Names the tests bind (`expected =
3` in an earlier test) are not the code's either. Where the setup's run sent no list (it hung, or bound
too much to send), the setup's names are those its text binds, and a setup that may bind others
(`binds_unseen`) makes every test opaque. A value check judges a constant as the setup made it: a test
that expects the code to change a setup value in place fails.

Everything else is an *opaque* test, run whole inside the sandbox as before, its verdict reported from
there: other statements (an assignment, a call for its side effects, try/except, a loop over anything
but a literal), comprehensions, lambdas, f-strings, method calls on literals, `is` between two values,
a loop item the code returned that is passed back to it (`for x in [g(1)]: assert f(x) == 2`: only the
sandbox holds that object) or a list, set or dict item passed to the code and used again (`for xs in [[3, 1]]:
assert f(xs) is None and xs == [1, 3]`: one object in Python, which the code may change), a test past the
planner's bounds (MAX_PROBES and MAX_DEPTH here, MAX_ASSERTS and MAX_WORK in rewards/_unroll.py: a `range`
past 2**63, a loop of thousands of items, an expression nested hundreds deep) or one it cannot parse,
a test with no probe at all (`assert sorted([3, 1]) == [1, 3]` where the task is to write `sorted`), and
one whose other side needs a setup name that is not a plain value or a module's (`assert check(f(x))`,
`assert isinstance(f(x), Box)`, `assert f(5) == math.factorial(5)`). An opaque test runs in the code's
own namespace, so its verdict can be forged: by rebinding a name it uses (`check`, a name an earlier test
bound, or one a setup function binds when a test calls it) or by walking the harness's stack frames
(the report function and its nonce are in reach of the interpreter the code runs in).

>>> checks = plan(("assert add(1, 2) == 3",), "")
>>> [c.probes for c in checks]
[(('add(1, 2)', False),)]
>>> judge(checks[0], [b"i3;"]), judge(checks[0], [b"i0;"])
((True, ''), (False, 'AssertionError (add(1, 2) = 0)'))
"""

from __future__ import annotations

import ast
import builtins
import copy
import functools
import reprlib
import sys
from collections import Counter
from dataclasses import dataclass

from rewards._evaluate import BUILTINS, MATH, MISSING, evaluate
from rewards._unroll import Inline, Let, Opaque, Unrolled, depth
from rewards._values import BadValue, Budget, decode

MAX_PROBES = 1024  # probes in one test, each a step in the sandbox; more make it opaque
MAX_DEPTH = 100  # nesting of a test's syntax, before and after unrolling: the trainer's evaluator recurses once a level

# Names that are not the graded code's own, though it could rebind them where it runs: the builtins, and
# library names a test may build its expected value with after the code imported them (`Counter({'a': 2})`,
# `sqrt(2)`); names a task's function plausibly has (`gcd`, `factorial`, `add`) are left to the code.
_AMBIENT = frozenset(dir(builtins)) | {
    "Counter", "OrderedDict", "defaultdict", "deque", "namedtuple", "ChainMap", "Fraction", "Decimal",
    "sqrt", "isqrt", "pi", "e", "tau", "inf", "nan", "isclose", "floor", "ceil", "trunc", "fabs", "log", "log2",
    "log10", "exp", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "radians", "degrees", "hypot"}
_MODULES = _AMBIENT | frozenset(sys.stdlib_module_names)
# Builtins that only iterate their first argument (min and max: their only one; zip: every one): a
# probe there may be any iterable (a generator, a map), which the sandbox turns into a list first.
_CONSUMERS = {"list", "tuple", "set", "frozenset", "sorted", "sum", "any", "all", "dict", "enumerate"}
# Never inside a probe: the sandbox would see (and could decide) a comparison.
_NOT_IN_PROBES = (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                  ast.GeneratorExp, ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)
_SINGLETONS = (None, True, False)


@dataclass(frozen=True)
class Check:
    """One test: `expr` (probes replaced by names `<probe i>`, the setup's constants left as their names),
    its probes' (source, iterable) pairs and the constants it reads; or, for an opaque test, `expr` None
    and `source` run whole in the sandbox."""

    source: str
    expr: ast.expr | None = None
    probes: tuple = ()
    constants: tuple = ()


@functools.lru_cache(maxsize=256)
def plan(tests: tuple, setup: str, surveyed: frozenset | None = None, constants: frozenset = frozenset()) -> tuple:
    """A Check per test (cached: the completions of one prompt share their tests). `surveyed`: the names
    a run of the setup alone bound (rewards/_sandbox.py, `survey`), `constants` those of them holding
    plain values; None where it was not run or failed: then the setup's names are those it binds
    visibly, and a setup that may bind others makes every test opaque."""
    setup_names = _bound_names(setup) | frozenset().union(*(_bound_names(t) for t in tests))
    if surveyed is None:
        if binds_unseen(setup):
            return tuple(Check(test) for test in tests)
        constants = frozenset()
    setup_names |= surveyed or frozenset()
    return tuple(_check(test, setup_names, constants) for test in tests)


# What binds names no parse of the code can list: `from m import *`, exec/eval, the namespace's own
# dict (globals(), vars(), locals(), sys.modules[__name__]), setattr on a module, the builtins module.
_UNSEEN = frozenset({"exec", "eval", "compile", "globals", "vars", "locals", "setattr", "__import__", "importlib",
                     "builtins", "__builtins__", "__dict__", "modules", "runpy"})


def binds_unseen(code: str) -> bool:
    """Might `code` bind names that `_bound_names` cannot see?

    >>> binds_unseen("from string import *"), binds_unseen("globals()['X'] = 1"), binds_unseen("import math")
    (True, True, False)
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False  # it fails in the sandbox too, and every test with it
    for node in ast.walk(tree):
        if isinstance(node, ast.alias) and node.name == "*":
            return True
        if isinstance(node, ast.Name) and node.id in _UNSEEN or isinstance(node, ast.Attribute) and node.attr in _UNSEEN:
            return True
        if isinstance(node, ast.alias) and node.name.split(".")[0] in _UNSEEN:
            return True
    return False


def _bound_names(setup: str) -> frozenset:
    """Every name the code binds visibly (an over-estimate is safe: those names go opaque)."""
    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()  # the setup fails in the sandbox too, and every test with it
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return frozenset(names)


def _check(test: str, setup_names: frozenset, constants: frozenset) -> Check:
    try:
        tree = ast.parse(test)
        if depth(tree) > MAX_DEPTH:
            raise Opaque
        unrolled = Unrolled(tree.body)
        cutter = _Cutter(setup_names, constants, unrolled.lets, unrolled.spend)
        parts, consumed = [], cutter.consumed_once(unrolled.steps)
        for kind, node in unrolled.steps:  # in Python's order, so that the probes are sent in it
            if kind == "let":  # `(<item k> := value) or True`: the item evaluated once, then the test goes on
                value = cutter.cut(unrolled.lets[node].value, iterable=node in consumed)
                let = ast.NamedExpr(ast.Name(node, ast.Store()), value)
                parts.append(ast.BoolOp(ast.Or(), [let, ast.Constant(True)]))
            else:
                parts.append(cutter.cut(node))
        cutter.check_aliases()
        if not cutter.probes:
            raise Opaque
        expr = parts[0] if len(parts) == 1 else ast.BoolOp(ast.And(), parts)
        if depth(expr) > MAX_DEPTH:
            raise Opaque  # the trainer's evaluator recurses once per level
        return Check(test, ast.fix_missing_locations(expr), tuple(cutter.probes), tuple(sorted(cutter.used)))
    except Exception:  # noqa: BLE001 - whatever stops the plan (Opaque, a test Python cannot parse, a bound
        # passed), the test runs whole in the sandbox, as Python would run it; the reward never raises for it
        return Check(test)


class _Cutter:
    """Replaces each probe in an expression by a `<probe i>` name; Opaque where that is not possible."""

    def __init__(self, setup_names: frozenset, constants: frozenset, lets: dict, spend):
        self.setup_names, self.constants, self.probes, self.used = setup_names, constants, [], set()
        self.lets, self.uses = lets, {name: [0, 0] for name in lets}  # a let's uses here, and inside probes
        self.spend = spend  # the unrolling's work budget: copying items into probes counts too

    def known(self, name: str) -> bool:
        return name in BUILTINS and name not in self.setup_names

    def cut(self, node: ast.expr, iterable: bool = False) -> ast.expr:
        if isinstance(node, ast.Constant):
            return node
        if isinstance(node, ast.Name) and node.id in self.lets:
            self.uses[node.id][0] += 1  # a loop item's value, evaluated once here
            return node
        if isinstance(node, ast.Name) and node.id in self.constants:
            self.used.add(node.id)  # the setup's value, sent before the code ran; never the code's
            return node
        if isinstance(node, ast.Name):
            return node if self.known(node.id) else self.probe(node, iterable)
        if isinstance(node, ast.Attribute):
            return node if _is_math(node) else self.probe(node, iterable)
        if isinstance(node, ast.Call):
            return self.call(node, iterable)
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Is, ast.IsNot)) and not _singleton(node.left) and not _singleton(right):
                    raise Opaque  # identity means nothing for values that crossed a pipe
            return ast.Compare(self.cut(node.left), node.ops, [self.cut(c) for c in node.comparators])
        if isinstance(node, ast.BoolOp):
            return ast.BoolOp(node.op, [self.cut(v) for v in node.values])
        if isinstance(node, ast.BinOp):
            return ast.BinOp(self.cut(node.left), node.op, self.cut(node.right))
        if isinstance(node, ast.UnaryOp):
            return ast.UnaryOp(node.op, self.cut(node.operand))
        if isinstance(node, ast.IfExp):
            return ast.IfExp(self.cut(node.test), self.cut(node.body), self.cut(node.orelse))
        if isinstance(node, ast.Subscript):
            return ast.Subscript(self.cut(node.value), self.cut(node.slice), ast.Load())
        if isinstance(node, ast.Slice):
            parts = (node.lower, node.upper, node.step)
            return ast.Slice(*(None if p is None else self.cut(p) for p in parts))
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = [self.cut(e) for e in node.elts]
            return ast.Set(elts) if isinstance(node, ast.Set) else type(node)(elts, ast.Load())
        if isinstance(node, ast.Dict) and None not in node.keys:
            pairs = [(self.cut(k), self.cut(v)) for k, v in zip(node.keys, node.values)]  # Python's order
            return ast.Dict([k for k, _ in pairs], [v for _, v in pairs])
        raise Opaque  # starred items, comprehensions, lambdas, f-strings, walrus ...

    def call(self, node: ast.Call, iterable: bool) -> ast.expr:
        func = node.func
        ours = isinstance(func, ast.Name) and self.known(func.id) or _is_math(func)
        if not ours:
            return self.probe(node, iterable)
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            raise Opaque
        name = func.id if isinstance(func, ast.Name) else ""
        args = [self.cut(a, iterable=_consumes(name, i, len(node.args))) for i, a in enumerate(node.args)]
        return ast.Call(func, args, [ast.keyword(k.arg, self.cut(k.value)) for k in node.keywords])

    def probe(self, node: ast.expr, iterable: bool) -> ast.Name:
        if any(isinstance(n, _NOT_IN_PROBES) for n in ast.walk(node)):
            raise Opaque
        root, above = node, None
        while isinstance(root, (ast.Call, ast.Attribute, ast.Subscript)):
            root, above = (root.func if isinstance(root, ast.Call) else root.value), root
        # A probe is the code's own name applied to inputs. Rooted anywhere else it would hand the code
        # what it is compared with, which the code could rebind: `EXPECTED`, `check(f(1))`, `bin(5)`,
        # `Counter('aab')`, `math.factorial(5)` (a module only before a dot: `chunk(xs, 2)` is the code's).
        ambient = _MODULES if isinstance(above, ast.Attribute) else _AMBIENT
        if not isinstance(root, ast.Name) or root.id in self.setup_names or root.id in ambient or root.id in self.lets:
            raise Opaque
        if len(self.probes) >= MAX_PROBES:
            raise Opaque
        self.probes.append((ast.unparse(self.copy_lets(node)), iterable))
        return ast.Name(f"<probe {len(self.probes) - 1}>", ast.Load())


    def copy_lets(self, node: ast.expr) -> ast.expr:
        """`node` with the loop items it passes to the code copied in, where Python's would be the same value:
        a literal (not a value the code returned, which only the sandbox holds as the object Python would pass)."""
        lets = [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in self.lets]
        if any(not self.lets[name].inert for name in lets):
            raise Opaque
        for name in lets:
            self.uses[name][1] += 1
            self.spend(sum(1 for _ in ast.walk(self.lets[name].value)))
        self.check_aliases()  # before copying a large list into a hundred probes
        return Inline({name: Let(let.value, True, False) for name, let in self.lets.items()}).visit(
            copy.deepcopy(node)) if lets else node

    def consumed_once(self, steps: list) -> set:
        """The lets used once, as what a consumer builtin iterates (`for v in [evens(4)]: assert list(v) == [0, 2]`):
        their values may be any iterable, listed in the sandbox as `list(evens(4))` would be. Used more than once,
        a generator would be used up by the first use, as in Python."""
        uses, consumed = Counter(), Counter()
        for kind, node in steps:
            for n in ast.walk(self.lets[node].value if kind == "let" else node):
                if isinstance(n, ast.Name) and n.id in self.lets:
                    uses[n.id] += 1
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and self.known(n.func.id):
                    consumed.update(a.id for i, a in enumerate(n.args) if isinstance(a, ast.Name)
                                    and a.id in self.lets and _consumes(n.func.id, i, len(n.args)))
        return {name for name, count in consumed.items() if count == uses[name] == 1}

    def check_aliases(self) -> None:
        """Opaque where a list, set or dict item is passed to the code and used again: in Python both uses see one
        object, which the code may change (`for xs in [[3, 1]]: assert f(xs) is None and xs == [1, 3]`)."""
        for name, (here, in_probes) in self.uses.items():
            if self.lets[name].mutable and in_probes and here + in_probes > 1:
                raise Opaque


def _consumes(name: str, i: int, n_args: int) -> bool:
    """Does builtin `name` only iterate its argument i of n_args?"""
    return (name in _CONSUMERS and i == 0) or (name in ("min", "max") and n_args == 1) or name == "zip"


def _is_math(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and node.attr in MATH)


def _singleton(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and any(node.value is s for s in _SINGLETONS)


def judge(check: Check, payloads: list, budget: Budget | None = None, constants: dict | None = None) -> tuple[bool, str]:
    """(passed, why not) for a value check, given each probe's encoded value (None where it sent none)
    and the setup's constants' values (MISSING where there was none); the values' items are taken from
    `budget` (rewards/_values.py), shared by one candidate's tests.

    >>> judge(plan(("assert abs(f(2) - 1.41) < 0.01",), "")[0], [b"f0x1.6a09e667f3bcdp+0;"])
    (True, '')
    """
    values = []
    for payload in payloads:
        try:
            values.append(MISSING if payload is None else decode(payload, budget))
        except BadValue:
            values.append(MISSING)
    try:
        if _outcome(check, values, constants or {}):
            return True, ""
        why = "AssertionError"
    except Exception as err:  # noqa: BLE001 - whatever the values make of the test, it did not pass
        why = f"{type(err).__name__}: {str(err)[:100]}"
    shown = ", ".join(f"{src} = {_show(v)}" for (src, _), v in zip(check.probes, values))
    return False, f"{why} ({shown})"


def _show(value) -> str:
    """A short repr (reprlib's, which looks at a few items only) of a value, for a failure note."""
    if value is MISSING:
        return "(no value)"
    try:
        return reprlib.repr(value)
    except ValueError:  # an int past Python's digit limit
        return "(too long to show)"


def _outcome(check: Check, values: list, constants: dict):
    """The test's expression with its probes replaced by `values`, its constants by theirs (rewards/_evaluate.py)."""
    env = {name: constants.get(name, MISSING) for name in check.constants}
    return evaluate(check.expr, env | {f"<probe {i}>": v for i, v in enumerate(values)})
