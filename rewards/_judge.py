"""Deciding pass/fail for code_tests where the graded code cannot reach: in the trainer, from values.

Each test is parsed here before anything runs. A test of the form `assert EXPR` (any message ignored)
whose EXPR is built from literals, comparisons, `and`/`or`/`not`, arithmetic, subscripts and a short list
of pure builtins (`_BUILTINS`, plus `math.isclose` and friends) is a *value check*: each smallest
sub-expression that needs the graded code's names (`add(1, 2)`, `f(x)` in `set(f(x)) == {1, 2}`) is cut
out as a *probe*, and the sandbox is sent only the probes. It evaluates each and sends back its value
(literal types only, see rewards/_values.py); the rest of the test -- the expected value, the
comparison, the builtins around the probe -- is evaluated here, with the real builtins, whatever the
code redefined. So nothing the code executes can change a value check's verdict: it can only choose the
values of its own probes, without seeing what they are compared with.

Values are compared as their base types: a Counter, OrderedDict or defaultdict arrives as a dict, a
namedtuple as a tuple, an int or str subclass as int or str, so `==` holds as Python's does between those
and literals; a value of any other type (a custom object, a generator outside `list(...)` and the other
consumers) fails its test.

Everything else is an *opaque* test, run whole inside the sandbox as before, its verdict reported from
there: several statements, loops, comprehensions, lambdas, f-strings, method calls on literals, a test
with no probe at all (`assert sorted([3, 1]) == [1, 3]` where the task is to write `sorted`), and one
whose other side needs names the setup defined (`assert f(x) == EXPECTED`, `assert check(f)`), since the
graded code could rebind them. An opaque test's verdict can be forged by code that walks the harness's
stack frames (the report function and its nonce are in reach of the interpreter the code runs in).

>>> checks = plan(("assert add(1, 2) == 3",), "")
>>> [c.probes for c in checks]
[(('add(1, 2)', False),)]
>>> judge(checks[0], [b"i3;"]), judge(checks[0], [b"i0;"])
((True, ''), (False, 'AssertionError (add(1, 2) = 0)'))
"""

from __future__ import annotations

import ast
import builtins
import functools
import math
import operator
import reprlib
import sys
from dataclasses import dataclass

from rewards._values import MAX_ITEMS, BadValue, decode, safe_dict, safe_set

# An int the evaluator may produce (`f(x) ** 9`, `int(s, 2)`): dividing two such takes ~40 ms here.
MAX_RESULT_BITS = 1 << 18
MISSING = object()  # a probe that raised, timed out, or sent no value / a malformed one


class Opaque(Exception):
    """The test is not a value check (see the module docstring)."""


def _sum(items, start=0):
    """`sum`, but lists and tuples are joined in one pass (Python's repeated `+` is quadratic)."""
    items = list(items)
    if all(isinstance(x, (int, float, complex)) for x in [*items, start]):
        return sum(items, start)
    for kind in (list, tuple):
        if isinstance(start, kind) and all(isinstance(x, kind) for x in items):
            if len(start) + sum(len(x) for x in items) > MAX_ITEMS * 8:
                raise BadValue("sum too long")
            return kind([*start, *(y for x in items for y in x)])
    raise TypeError("sum: numbers, or lists (tuples) with a list (tuple) start")


def _pow(base, exp, mod=None):
    if mod is None:
        _guard_pow(base, exp)
    elif isinstance(exp, int) and isinstance(mod, int) and max(exp.bit_length(), mod.bit_length()) > 4096:
        raise BadValue("modular power too big")  # its time grows as exp's bits times mod's squared
    return pow(base, exp, mod)


def _int(*args, **kwargs):
    value = int(*args, **kwargs)
    if value.bit_length() > MAX_RESULT_BITS:  # int(s, 16) knows no digit limit
        raise BadValue("int too big")
    return value


def _round(x, ndigits=None):
    if ndigits is not None and not -1000 <= ndigits <= 1000:
        raise ValueError("round: ndigits out of range")
    return round(x) if ndigits is None else round(x, ndigits)


def _range(*args):
    r = range(*args)
    if len(r) > MAX_ITEMS:
        raise BadValue("range too long")
    return r


def _type(x):
    return type(x)


# Pure builtins a test may use here (as names they are the real ones: `isinstance(x, set)`); when called,
# those that could allocate without bound, or hash keys chosen to collide, are replaced by `_SAFE`'s.
_BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "chr", "complex", "dict", "divmod", "float", "frozenset", "int", "isinstance",
    "len", "list", "max", "min", "ord", "pow", "range", "repr", "round", "set", "sorted", "str", "sum", "tuple",
    "type", "reversed", "enumerate", "zip", "bin", "hex", "oct")}
_SAFE = {set: lambda *a: safe_set(*a) if a else set(),
         frozenset: lambda *a: safe_set(*a, kind=frozenset) if a else frozenset(),
         dict: lambda *a: safe_dict(*a) if a else {},
         sum: _sum, pow: _pow, round: _round, range: _range, type: _type, int: _int}
# Names that are not the graded code's own, though it could rebind them where it runs.
_BUILTIN_NAMES = frozenset(dir(builtins))
_MODULES = _BUILTIN_NAMES | frozenset(sys.stdlib_module_names)
_MATH = {name: getattr(math, name) for name in (
    "isclose", "fabs", "sqrt", "floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "copysign", "exp", "log",
    "log2", "log10", "hypot", "gcd", "pi", "e", "tau", "inf", "nan")}
# Builtins that only iterate their first argument (min and max: their only one; zip: every one): a
# probe there may be any iterable (a generator, a map), which the sandbox turns into a list first.
_CONSUMERS = {"list", "tuple", "set", "frozenset", "sorted", "sum", "any", "all", "dict", "enumerate"}
# Never inside a probe: the sandbox would see (and could decide) a comparison.
_NOT_IN_PROBES = (ast.Compare, ast.BoolOp, ast.IfExp, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                  ast.GeneratorExp, ast.NamedExpr, ast.Yield, ast.YieldFrom, ast.Await)
_SINGLETONS = (None, True, False)


@dataclass(frozen=True)
class Check:
    """One test: `expr` (probes replaced by names `<probe i>`) and its probes' (source, iterable) pairs,
    or, for an opaque test, `expr` None and `source` run whole in the sandbox."""

    source: str
    expr: ast.expr | None = None
    probes: tuple = ()


@functools.lru_cache(maxsize=256)
def plan(tests: tuple, setup: str) -> tuple:
    """A Check per test (cached: the completions of one prompt share their tests)."""
    setup_names = _bound_names(setup)
    return tuple(_check(test, setup_names) for test in tests)


def _bound_names(setup: str) -> frozenset:
    """Every name the setup code binds anywhere (an over-estimate is safe: those names go opaque)."""
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


def _check(test: str, setup_names: frozenset) -> Check:
    try:
        tree = ast.parse(test)
        if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
            raise Opaque
        cutter = _Cutter(setup_names)
        expr = cutter.cut(tree.body[0].test)
        if not cutter.probes:
            raise Opaque
        return Check(test, ast.fix_missing_locations(expr), tuple(cutter.probes))
    except (Opaque, SyntaxError, ValueError, RecursionError, MemoryError):
        return Check(test)


class _Cutter:
    """Replaces each probe in an expression by a `<probe i>` name; Opaque where that is not possible."""

    def __init__(self, setup_names: frozenset):
        self.setup_names, self.probes = setup_names, []

    def known(self, name: str) -> bool:
        return name in _BUILTINS and name not in self.setup_names

    def cut(self, node: ast.expr, iterable: bool = False) -> ast.expr:
        if isinstance(node, ast.Constant):
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
            return type(node)([self.cut(e) for e in node.elts], **({} if isinstance(node, ast.Set) else {"ctx": ast.Load()}))
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
        # `math.factorial(5)` (a module only before a dot: `chunk(xs, 2)` is the code's function).
        ambient = _MODULES if isinstance(above, ast.Attribute) else _BUILTIN_NAMES
        if not isinstance(root, ast.Name) or root.id in self.setup_names or root.id in ambient:
            raise Opaque
        self.probes.append((ast.unparse(node), iterable))
        return ast.Name(f"<probe {len(self.probes) - 1}>", ast.Load())


def _consumes(name: str, i: int, n_args: int) -> bool:
    """Does builtin `name` only iterate its argument i of n_args?"""
    return (name in _CONSUMERS and i == 0) or (name in ("min", "max") and n_args == 1) or name == "zip"


def _is_math(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math"
            and node.attr in _MATH)


def _singleton(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and any(node.value is s for s in _SINGLETONS)


def judge(check: Check, payloads: list) -> tuple[bool, str]:
    """(passed, why not) for a value check, given each probe's encoded value (None where it sent none).

    >>> judge(plan(("assert abs(f(2) - 1.41) < 0.01",), "")[0], [b"f0x1.6a09e667f3bcdp+0;"])
    (True, '')
    """
    values = []
    for payload in payloads:
        try:
            values.append(MISSING if payload is None else decode(payload))
        except BadValue:
            values.append(MISSING)
    try:
        if evaluate(check, values):
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


def evaluate(check: Check, values: list):
    """The test's expression with its probes replaced by `values`; raises for a MISSING value or any error."""
    env = {f"<probe {i}>": v for i, v in enumerate(values)}
    return _Evaluator(env).eval(check.expr)


_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
           ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_, ast.Invert: operator.invert}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: operator.is_, ast.IsNot: operator.is_not,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


class _Evaluator:
    """Evaluates the node types `_Cutter` keeps, on literal-typed values, with bounded allocation."""

    def __init__(self, env: dict):
        self.env = env

    def eval(self, node: ast.expr):
        method = getattr(self, "_" + type(node).__name__)
        return method(node)

    def _Constant(self, node):
        return node.value

    def _Name(self, node):
        if node.id in self.env:
            value = self.env[node.id]
            if value is MISSING:
                raise LookupError(f"no value for {node.id}")
            return value
        return _BUILTINS[node.id]

    def _Attribute(self, node):
        return _MATH[node.attr]

    def _Call(self, node):
        func = self.eval(node.func)
        func = _SAFE.get(func, func)
        return func(*[self.eval(a) for a in node.args], **{k.arg: self.eval(k.value) for k in node.keywords})

    def _Compare(self, node):
        left = self.eval(node.left)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True

    def _BoolOp(self, node):
        value = None
        for value_node in node.values:
            value = self.eval(value_node)
            if bool(value) is isinstance(node.op, ast.Or):
                return value
        return value

    def _BinOp(self, node):
        left, right = self.eval(node.left), self.eval(node.right)
        _guard(node.op, left, right)
        return _BINOPS[type(node.op)](left, right)

    def _UnaryOp(self, node):
        return _UNARY[type(node.op)](self.eval(node.operand))

    def _IfExp(self, node):
        return self.eval(node.body) if self.eval(node.test) else self.eval(node.orelse)

    def _Subscript(self, node):
        return self.eval(node.value)[self.eval(node.slice)]

    def _Slice(self, node):
        return slice(*(None if p is None else self.eval(p) for p in (node.lower, node.upper, node.step)))

    def _Tuple(self, node):
        return tuple(self.eval(e) for e in node.elts)

    def _List(self, node):
        return [self.eval(e) for e in node.elts]

    def _Set(self, node):
        return safe_set(self.eval(e) for e in node.elts)

    def _Dict(self, node):
        return safe_dict((self.eval(k), self.eval(v)) for k, v in zip(node.keys, node.values))


def _guard(op: ast.operator, left, right) -> None:
    """Refuse an operation whose result could be unboundedly large: values here may be the code's choice."""
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_ITEMS * 8:
                raise BadValue("repetition too long")
        if isinstance(left, int) and isinstance(right, int) and left.bit_length() + right.bit_length() > MAX_RESULT_BITS:
            raise BadValue("product too big")
    elif isinstance(op, ast.Pow):
        _guard_pow(left, right)
    elif isinstance(op, ast.LShift) and isinstance(right, int) and isinstance(left, int):
        if left.bit_length() + right > MAX_RESULT_BITS:
            raise BadValue("shift too big")
    elif isinstance(op, ast.Mod) and isinstance(left, (str, bytes)):
        raise BadValue("%-formatting is not evaluated")  # '%*d' % (10**9, 1) allocates a gigabyte
    elif isinstance(op, ast.MatMult):
        raise BadValue("@ is not evaluated")


def _guard_pow(base, exp) -> None:
    if isinstance(base, int) and isinstance(exp, int) and exp > 0 and abs(base) > 1:
        if base.bit_length() * exp > MAX_RESULT_BITS:
            raise BadValue("power too big")

