"""A test's statements as the steps Python takes, for rewards/_judge.py to cut into probes: a run of `assert`
statements, `for` loops over a literal list, tuple or `range(<ints>)` unrolled, each loop item a *let* evaluated
once where Python builds the loop's list and bound to the loop's names for every use. Anything else, or a test
past the bounds below, raises Opaque: the test then runs whole in the sandbox.

>>> steps = Unrolled(ast.parse("for v in [f(4)]:\\n    assert 3 < v < 5").body).steps
>>> [(kind, node if kind == "let" else ast.unparse(node)) for kind, node in steps]
[('let', '<item 0>'), ('assert', '3 < <item 0> < 5')]
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

MAX_ASSERTS = 64  # asserts in one test (a loop's included) judged in the trainer; more make it opaque
MAX_WORK = 1 << 18  # syntax nodes copied to unroll one test (a loop turn counts as 256); more make it opaque


class Opaque(Exception):
    """The test is not a value check (see rewards/_judge.py)."""


def depth(tree: ast.AST) -> int:
    """How deeply `tree` nests, found without recursion (a test may nest past Python's recursion limit)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


@dataclass
class Let:
    """A loop item (or a part of one, for `for x, y in ...`) bound to a loop name: `value`, evaluated once where
    Python builds the loop's list. `inert`: a literal with no names, which may be copied into a probe (the code
    reads a copy of it: the same value); `mutable`: a list, set or dict display, which Python passes to the code
    as one object that every later use sees, changed or not."""

    value: ast.expr
    inert: bool
    mutable: bool


# What an inert loop item may hold: literals and the operators on them, no names (nothing the code could rebind).
_INERT = (ast.Constant, ast.Tuple, ast.List, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.BoolOp, ast.Compare,
          ast.IfExp, ast.Subscript, ast.Slice, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


class Unrolled:
    """A run of `assert` statements as the steps Python takes: ("assert", expr) and ("let", name), `lets[name]`
    binding one loop item's value. A `for` over a literal list or tuple, or a `range` of literal ints, is unrolled
    as Python runs it: every item evaluated once, in order, before the body (`for x, y in [(f(1), 2)]: assert
    x == y` lets x be f(1)'s value and y 2), then the body once per item with the loop's names bound to them (and
    still bound after the loop). Opaque for any other statement, past MAX_ASSERTS asserts, or past MAX_WORK
    (nodes copied, and loop turns taken)."""

    def __init__(self, body: list):
        self.steps, self.lets, self.scope, self.work, self.asserts = [], {}, {}, 0, 0
        self.statements(body)

    def statements(self, body: list) -> None:
        for stmt in body:
            if isinstance(stmt, ast.Assert):
                self.asserts += 1
                if self.asserts > MAX_ASSERTS:
                    raise Opaque
                self.steps.append(("assert", self.substitute(stmt.test)))
            elif isinstance(stmt, ast.For) and not stmt.orelse:
                items = [self.bind(stmt.target, item) for item in _items(self.substitute(stmt.iter))]
                for names in items:  # the list is built whole before the body runs, as in Python
                    self.spend(256)  # a nest of loops over nothing unrolls no assert, but takes time
                    self.scope.update(names)  # module-level names: they stay bound after the loop
                    self.statements(stmt.body)
            else:
                raise Opaque

    def spend(self, work: int) -> None:
        self.work += work
        if self.work > MAX_WORK:
            raise Opaque

    def substitute(self, node: ast.expr) -> ast.expr:
        """A copy of `node` with the loop names bound so far replaced by their lets' names."""
        if not self.scope:
            return node
        self.spend(sum(1 for _ in ast.walk(node)))
        return _Substitute(self.scope).visit(node)

    def bind(self, target: ast.expr, item: ast.expr) -> dict:
        """{loop name: its let's name} for one item, matched to the target's shape (`x`, `x, y`); Opaque when they
        differ. Each part of the item becomes a let, in Python's order; a part that is a let already keeps it (the
        same value, as in Python)."""
        if isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(item, (ast.Tuple, ast.List)) or len(target.elts) != len(item.elts):
                raise Opaque
            return {k: v for t, i in zip(target.elts, item.elts) for k, v in self.bind(t, i).items()}
        if not isinstance(target, ast.Name):
            raise Opaque
        if isinstance(item, ast.Name) and item.id in self.lets:
            return {target.id: item}
        item = Inline(self.lets).visit(item)  # earlier immutable literal items, so that this one may be inert
        nodes = list(ast.walk(item))
        self.spend(len(nodes))
        name = f"<item {len(self.lets)}>"
        self.lets[name] = Let(item, all(isinstance(n, _INERT) for n in nodes),
                               any(isinstance(n, (ast.List, ast.Set, ast.Dict)) for n in nodes))
        self.steps.append(("let", name))
        return {target.id: ast.Name(name, ast.Load())}


def _items(node: ast.expr) -> list:
    """The items a loop runs over, as expressions: a list or tuple display's, or `range(<ints>)`'s."""
    if isinstance(node, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in node.elts):
        if len(node.elts) > MAX_ASSERTS:
            raise Opaque  # each item needs an assert of its own, or a nested loop unrolling to nothing
        return node.elts
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range"
            and not node.keywords and 1 <= len(node.args) <= 3
            and all(isinstance(a, ast.Constant) and type(a.value) is int for a in node.args)):
        span = range(*(a.value for a in node.args))[:MAX_ASSERTS + 1]  # len() of the whole may not fit a C size
        if len(span) <= MAX_ASSERTS:
            return [ast.Constant(i) for i in span]
    raise Opaque


class _Substitute(ast.NodeTransformer):
    """A copy of an expression with some names replaced (lambdas and comprehensions stay opaque anyway)."""

    def __init__(self, bound: dict):
        self.bound = bound

    def visit(self, node):
        return super().visit(copy.deepcopy(node)) if self.bound else node

    def visit_Name(self, node):
        return copy.deepcopy(self.bound[node.id]) if node.id in self.bound else node


class Inline(ast.NodeTransformer):
    """An expression with the names of immutable literal lets replaced by (copies of) their values."""

    def __init__(self, lets: dict):
        self.lets = lets

    def visit_Name(self, node):
        let = self.lets.get(node.id)
        return copy.deepcopy(let.value) if let and let.inert and not let.mutable else node
