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
from dataclasses import dataclass

from rewards._evaluate import BUILTINS, MATH, MISSING, evaluate
from rewards._values import BadValue, Budget, decode

MAX_ASSERTS = 64  # asserts in one test (a loop's included) judged here; more make it opaque


class Opaque(Exception):
    """The test is not a value check (see the module docstring)."""


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
        cutter = _Cutter(setup_names, constants)
        parts = [cutter.cut(e) for e in _asserted(tree.body, {})]
        if not cutter.probes:
            raise Opaque
        expr = parts[0] if len(parts) == 1 else ast.BoolOp(ast.And(), parts)
        return Check(test, ast.fix_missing_locations(expr), tuple(cutter.probes), tuple(sorted(cutter.used)))
    except (Opaque, SyntaxError, ValueError, RecursionError, MemoryError):
        return Check(test)


def _asserted(body: list, bound: dict) -> list:
    """What a run of `assert` statements asserts, in order; a `for` over a literal list or tuple, or a
    `range` of literal ints, is unrolled, its names replaced by the items (`for x, y in [(1, 2)]: assert
    f(x) == y`). Opaque for any other statement, or past MAX_ASSERTS."""
    out, scope = [], dict(bound)
    for stmt in body:
        if isinstance(stmt, ast.Assert):
            out.append(_Substitute(scope).visit(stmt.test))
        elif isinstance(stmt, ast.For) and not stmt.orelse:
            for item in _items(_Substitute(scope).visit(stmt.iter)):
                scope.update(_bind(stmt.target, item))  # the loop's names stay bound after it, as in Python
                out += _asserted(stmt.body, scope)
                if len(out) > MAX_ASSERTS:
                    raise Opaque
        else:
            raise Opaque
        if len(out) > MAX_ASSERTS:
            raise Opaque
    return out


def _items(node: ast.expr) -> list:
    """The items a loop runs over, as expressions: a list or tuple display's, or `range(<ints>)`'s."""
    if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        return node.elts
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and not node.keywords and 1 <= len(node.args) <= 3
            and all(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args)):
        span = range(*(a.value for a in node.args))
        if len(span) <= MAX_ASSERTS:
            return [ast.Constant(i) for i in span]
    raise Opaque


def _bind(target: ast.expr, item: ast.expr) -> dict:
    """{name: item's part} for a loop target (`x`, or `x, y` over tuple items); Opaque when they differ."""
    if isinstance(target, ast.Name):
        return {target.id: item}
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(item, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(item.elts):
        return {k: v for t, i in zip(target.elts, item.elts) for k, v in _bind(t, i).items()}
    raise Opaque


class _Substitute(ast.NodeTransformer):
    """A copy of an expression with some names replaced (lambdas and comprehensions stay opaque anyway)."""

    def __init__(self, bound: dict):
        self.bound = bound

    def visit(self, node):
        return super().visit(copy.deepcopy(node)) if self.bound else node

    def visit_Name(self, node):
        return copy.deepcopy(self.bound[node.id]) if node.id in self.bound else node


class _Cutter:
    """Replaces each probe in an expression by a `<probe i>` name; Opaque where that is not possible."""

    def __init__(self, setup_names: frozenset, constants: frozenset):
        self.setup_names, self.constants, self.probes, self.used = setup_names, constants, [], set()

    def known(self, name: str) -> bool:
        return name in BUILTINS and name not in self.setup_names

    def cut(self, node: ast.expr, iterable: bool = False) -> ast.expr:
        if isinstance(node, ast.Constant):
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
            return ast.Dict([self.cut(k) for k in node.keys], [self.cut(v) for v in node.values])
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
        if not isinstance(root, ast.Name) or root.id in self.setup_names or root.id in ambient:
            raise Opaque
        self.probes.append((ast.unparse(node), iterable))
        return ast.Name(f"<probe {len(self.probes) - 1}>", ast.Load())


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
