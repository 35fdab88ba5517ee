"""Evaluating the trainer's side of a value check: the test's expression with each probe replaced by
the value the sandbox sent, using literals, comparisons, boolean and arithmetic operators, subscripts,
and the real builtins of `BUILTINS` and `MATH` -- nothing else, and nothing that could allocate without
bound for a value the graded code chose (`[0] * f(x)`, `f(x) ** 9`, `'%*d' % (f(x), 1)`, a set of keys
chosen to share one hash).

>>> import ast
>>> evaluate(ast.parse("sorted(set(v)) == [1, 2]", mode="eval").body, {"v": [2, 1, 2]})
True
"""

from __future__ import annotations

import ast
import builtins
import math
import operator

from rewards._values import MAX_ITEMS, BadValue, safe_dict, safe_set

# An int the evaluator may produce (`f(x) ** 9`, `int(s, 2)`): dividing two such takes ~40 ms here.
MAX_RESULT_BITS = 1 << 18
MISSING = object()  # a probe that raised, timed out, or sent no value / a malformed one


def evaluate(expr: ast.expr, env: dict):
    """`expr`'s value, its free names looked up in `env` first; raises for a MISSING value or any error."""
    return _Evaluator(env).eval(expr)


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
# those that could allocate without bound, or hash keys chosen to collide, are replaced by `SAFE`'s.
BUILTINS = {name: getattr(builtins, name) for name in (
    "abs", "all", "any", "bool", "chr", "complex", "dict", "divmod", "float", "frozenset", "int", "isinstance",
    "len", "list", "max", "min", "ord", "pow", "range", "repr", "round", "set", "sorted", "str", "sum", "tuple",
    "type", "reversed", "enumerate", "zip", "bin", "hex", "oct")}
SAFE = {set: lambda *a: safe_set(*a) if a else set(),
         frozenset: lambda *a: safe_set(*a, kind=frozenset) if a else frozenset(),
         dict: lambda *a, **kw: {**(safe_dict(*a) if a else {}), **kw},  # dict(pairs), dict(a=1), or both
         sum: _sum, pow: _pow, round: _round, range: _range, type: _type, int: _int}
MATH = {name: getattr(math, name) for name in (
    "isclose", "fabs", "sqrt", "floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "copysign", "exp", "log",
    "log2", "log10", "hypot", "gcd", "pi", "e", "tau", "inf", "nan")}

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
        return BUILTINS[node.id]

    def _Attribute(self, node):
        return MATH[node.attr]

    def _Call(self, node):
        func = self.eval(node.func)
        func = SAFE.get(func, func)
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

    def _NamedExpr(self, node):  # a loop item bound once to its name (rewards/_judge.py)
        value = self.env[node.target.id] = self.eval(node.value)
        return value

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
            repeated = isinstance(seq, (str, bytes, list, tuple)) and isinstance(n, int)
            if repeated and len(seq) * max(n, 0) > MAX_ITEMS * 8:
                raise BadValue("repetition too long")
        ints = isinstance(left, int) and isinstance(right, int)
        if ints and left.bit_length() + right.bit_length() > MAX_RESULT_BITS:
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
