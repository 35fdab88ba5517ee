"""The graded code's side of code_tests: runs the completion's code, then answers the trusted side's requests.

This process (the sandbox's "code runner", rewards/_sandbox_child.py) holds the completion's code, the setup's
imports and class definitions (`setup_for_code`: what the code may need to build and take the setup's objects),
and nothing else of the sample: not the tests, not the setup's values or functions, not the results pipe or its
nonce. The trusted side (rewards/_judge.py, another process) sends requests as plain data (rewards/_values.py):
call this global or held object with these arguments, read this attribute, take the next item, its truth, its
length, an item. Each answer is plain data too -- the result, the arguments' new state (so a change made in place
reaches the test's own objects), or the exception raised (as its nearest builtin type, or the setup's class, with
its args) -- and an object that is not plain data stays here, sent as a numbered handle the other side may use
in later requests. Each request is timed against the test it belongs to: a test's requests share `time_s`.

>>> setup_for_code("import math\\nK = 3\\nclass Box:\\n    pass\\ndef check(v):\\n    return v == K")
['import math', 'class Box:\\n    pass']
"""

from __future__ import annotations

# This file's own references, taken when it is loaded, before any graded code runs (which may rebind the builtins):
# these names resolve to module globals, whatever `builtins.int = ...` does in the code's process.
from builtins import (bytearray, bytes, callable, complex, dict, enumerate, float, frozenset, getattr,  # noqa: E402
                      hasattr, id, int, isinstance, issubclass, iter, len, list, next, print, set, str,
                      tuple, type)
import builtins
import signal
import sys

from rewards._values import BadValue, Decoder, Encoder, Handle, encode

_IMMUTABLE_BASES = (int, float, complex, str, bytes, tuple, frozenset)


def setup_for_code(setup: str) -> list:
    """The setup's statements the graded code runs before its own: imports, class definitions and namedtuple
    classes (`P = namedtuple('P', 'x y')`, literal arguments only), each as its own source. Its values and
    functions stay on the trusted side, out of the code's reach (a function could return the expected value)."""
    import ast  # here, not above: the sandbox loads this file and never calls this

    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []  # the setup fails on the trusted side too, and every test with it
    kept = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.ClassDef)) or _namedtuple_class(stmt):
            kept.append(ast.get_source_segment(setup, stmt, padded=True) or ast.unparse(stmt))
    return kept


def _namedtuple_class(stmt) -> bool:
    import ast

    if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call)):
        return False
    func = stmt.value.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
    parts = [*stmt.value.args, *(k.value for k in stmt.value.keywords)]
    literal = all(isinstance(n, (ast.Constant, ast.List, ast.Tuple, ast.Load)) for p in parts for n in ast.walk(p))
    return name in ("namedtuple", "NamedTuple") and literal and all(isinstance(t, ast.Name) for t in stmt.targets)


class Timeout(BaseException):
    """A test's time ran out during a request (a BaseException: the code's `except Exception` does not eat it)."""


def _raise_timeout(signum, frame):
    raise Timeout()


class Server:
    """Runs the code and answers requests on `pipe` until the link closes."""

    def __init__(self, job: dict, pipe):
        self.pipe, self.time_s, self.left = pipe, job["time_s"], {}
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        self.held, self.numbers = [], {}
        signal.signal(signal.SIGALRM, _raise_timeout)
        for source in job["setup_code"]:  # each on its own: one that fails here (it needed a setup value) is skipped
            self.timed("<setup>", lambda s=source: exec(compile(s, "<setup>", "exec"), self.namespace))
        self.classes = {v: k for k, v in self.namespace.items() if isinstance(v, type) and v.__module__ == "__main__"}
        self.encoder = Encoder(self.classes, self.hold)
        self.decoder = Decoder({k: v for v, k in self.classes.items()}, self.resolve)
        self.loaded = self.timed("<completion>", lambda: exec(compile(job["code"], "<completion>", "exec"), self.namespace))[0]

    def timed(self, label: str, run) -> tuple:
        """(True, run()) or (False, the exception), within what is left of `label`'s time."""
        try:
            budget = self.left.get(label, self.time_s)
            if budget <= 0:
                raise Timeout()
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                return True, run()
            finally:
                self.left[label] = signal.setitimer(signal.ITIMER_REAL, 0)[0]
        except BaseException as err:  # noqa: BLE001 - whatever the code raised, it is the answer
            try:  # one line for whoever reads the output (the trainer keeps its start)
                print(f"{label}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
            except BaseException:  # noqa: BLE001 - stderr closed or replaced, or a __str__ that raises
                pass
            return False, err

    def hold(self, x) -> Handle:
        """A handle for an object that stays here: the same number each time it is sent."""
        number = self.numbers.get(id(x))
        if number is None:
            number = self.numbers[id(x)] = len(self.held)
            self.held.append(x)  # kept alive: its id stays its own
        try:
            kind = type(x).__name__
        except BaseException:  # noqa: BLE001 - a metaclass's own __name__
            kind = "object"
        return Handle(number, None, kind if isinstance(kind, str) else "object")

    def resolve(self, handle: Handle):
        if handle.name is not None:
            if handle.name in self.namespace:
                return self.namespace[handle.name]
            if hasattr(builtins, handle.name):
                return getattr(builtins, handle.name)
            raise BadValue(f"name {handle.name!r} is not defined")
        if not 0 <= handle.number < len(self.held):
            raise BadValue("no such handle")
        return self.held[handle.number]

    def names(self) -> list:
        """(name, how, payload) for each global the code's run left: a plain value (its bytes), a standard library
        module or object (its module and name, which the trusted side imports itself), or one of the code's own."""
        out = []
        for name, value in list(self.namespace.items())[:4096]:
            if not isinstance(name, str) or name.startswith("__") and name.endswith("__"):
                continue
            out.append((name, *_describe(value)))
        return out

    def serve(self) -> None:
        self.pipe.send(encode(("loaded", self.loaded, self.names())))
        while True:
            try:
                request = self.pipe.receive()
            except (EOFError, OSError):
                return
            self.pipe.send(self.answer(request))

    def answer(self, request: bytes) -> bytes:
        try:
            seq, label, op, target, a, b = self.decoder.decode(request)
        except (BadValue, ValueError, TypeError) as err:  # an argument this side cannot rebuild (e.g. no such class)
            return encode((-1, "unsendable", f"an argument: {err}"))
        ok, result = self.timed(str(label), lambda: self.run(op, target, a, b))
        if ok:
            changed = [(k, arg) for k, arg in [*enumerate(a or ()), *(b or {}).items()] if self.mutable(arg)] \
                if op == "call" else []
            try:
                return self.encoder.encode((seq, "ok", result, changed))
            except BaseException as err:  # noqa: BLE001 - too big to send, or the code's own value misbehaving
                return encode((seq, "unsendable", f"{type(err).__name__}: {_text(err)}"))
        if isinstance(result, Timeout):
            return encode((seq, "timeout"))
        return encode((seq, "raise", *self.exception(result)))

    def run(self, op: str, target, a, b):
        if op == "call":
            return target(*a, **b)
        if op == "getattr":
            return getattr(target, a)
        if op == "iter":
            return iter(target)
        if op == "next":
            return next(target)
        if op == "bool":
            return bool(target)
        if op == "len":
            return len(target)
        if op == "getitem":
            return target[a]
        if op == "isinstance":
            return isinstance(a, target)
        raise ValueError(f"unknown request {op!r}")

    def mutable(self, arg) -> bool:
        kind = type(arg)
        return isinstance(arg, (list, dict, set, bytearray)) or (kind in self.classes and not issubclass(kind, _IMMUTABLE_BASES)) \
            or kind.__name__ == "deque" and kind.__module__ == "collections"

    def exception(self, err: BaseException) -> tuple:
        """(its nearest builtin type's name, the setup's class's name or None, its args as plain data)."""
        kind = type(err)
        builtin = next((c.__name__ for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c), "Exception")
        setup = self.classes.get(kind) if kind in self.classes else None
        try:
            args = err.args if isinstance(err.args, tuple) else ()
            encode(args)
        except BaseException:  # noqa: BLE001 - args that are not plain data: their text
            try:
                args = (str(err),)
            except BaseException:  # noqa: BLE001
                args = ()
        return builtin, setup, args


def _text(err: BaseException) -> str:
    try:
        return str(err)[:200]
    except BaseException:  # noqa: BLE001 - the code's own __str__
        return ""


def _describe(value) -> tuple:
    """How a global crosses: ("value", bytes), ("module", name), ("library", (module, qualname)) or ("code", None)."""
    try:
        if type(value) is type(sys):
            return "module", value.__name__
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if type(module) is str and type(qualname) is str and module != "__main__" and (callable(value)):
            return "library", (module, qualname)
    except BaseException:  # noqa: BLE001 - the code's own __getattr__ or properties
        return "code", None
    try:
        return "value", encode(value)
    except BaseException:  # noqa: BLE001 - not plain data, or too big to send: used by reference
        return "code", None


def serve(job: dict, pipe) -> None:
    """The code runner's whole life after the sandbox set itself up: load, then answer until the link closes."""
    Server(job, pipe).serve()
