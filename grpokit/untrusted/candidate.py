"""The graded code's side of code_tests: runs the completion's code, then answers the trusted side's requests.

This process (the sandbox's "code runner", sandbox/child.py) holds the completion's code, the setup's
imports and class definitions (`setup_for_code`: what the code may need to build and take the setup's objects),
and nothing else of the sample: not the tests, not the setup's values or functions, not the results pipe or its
nonce. The trusted side (sandbox/judge.py, another process) sends requests as plain data
(sandbox/values.py):
call this global or held object with these arguments, read this attribute, take the next item, its truth, its
length, an item. Each answer is plain data too -- the result, the arguments' new state (so a change made in place
reaches the test's own objects), or the exception raised (as its nearest builtin type, or the setup's class, with
its args) -- and an object that is not plain data stays here, sent as a numbered handle the other side may use
in later requests. Each request is timed against the test it belongs to: a test's requests share `time_s`.

>>> setup_for_code("import math\\nK = 3\\nclass Box:\\n    pass\\ndef check(v):\\n    return v == K")
('import math', 'class Box:\\n    pass')
"""

from __future__ import annotations

# This file's own references, taken when it is loaded, before any graded code runs (which may rebind the builtins):
# these names resolve to module globals, whatever `builtins.int = ...` does in the code's process.
from builtins import (AttributeError, BaseException, EOFError, MemoryError, OSError, RecursionError, ValueError, all,
                      bool, callable, compile, dict, exec, getattr, hasattr, isinstance, issubclass, list, object,
                      print, str, tuple, type)
import builtins
import functools
import signal
import sys

from grpokit.untrusted.link import Peer, _text, builtin_base
from grpokit.untrusted.values import MAX_BYTES, BadValue, Handle, encode



@functools.lru_cache(maxsize=256)
def setup_for_code(setup: str) -> tuple:
    """The setup's statements the graded code runs before its own: imports, class definitions and namedtuple
    classes (`P = namedtuple('P', 'x y')`, literal arguments only), each as its own source. Its values and
    functions stay on the trusted side, out of the code's reach (a function could return the expected value)."""
    import ast  # here, not above: the sandbox loads this file and never calls this

    try:
        tree = ast.parse(setup)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()  # the setup fails on the trusted side too, and every test with it
    kept = []
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.ClassDef)) or _namedtuple_class(stmt):
            kept.append(ast.get_source_segment(setup, stmt, padded=True) or ast.unparse(stmt))
    return tuple(kept)


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


class Lent:
    """An object the judge lent the code (a test's function or generator): using it asks the judge."""

    __slots__ = ("_peer", "_handle")

    def __init__(self, peer: "Server", handle: Handle):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_handle", handle)

    def __call__(self, *args, **kwargs):
        return self._peer.ask("call", self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._peer.ask("getattr", self, name)

    def __iter__(self):
        return self._peer.ask("iter", self)

    def __next__(self):
        return self._peer.ask("next", self)

    def __bool__(self):
        return self._peer.ask("bool", self) is True

    def __len__(self):
        return self._peer.ask("len", self)

    def __getitem__(self, key):
        return self._peer.ask("getitem", self, key)


class Server(Peer):
    """Runs the code, then answers the judge's requests on `pipe` until the link closes."""

    def __init__(self, job: dict, pipe):
        self.time_s, self.left, self.depth, self.watched = job["time_s"], {}, 0, []
        self.capture_limit = job["output_kb"] * 1024  # what one request may print (the job's whole output cap)
        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        signal.signal(signal.SIGALRM, _raise_timeout)
        for source in job["setup_code"]:  # each on its own: one that fails here (it needed a setup value) is skipped
            self.guarded("<setup>", lambda s=source: exec(compile(s, "<setup>", "exec"), self.namespace))
        classes = {k: v for k, v in self.namespace.items() if isinstance(v, type) and v.__module__ == "__main__"}
        super().__init__(pipe, classes)
        code, namespace = job["code"], self.namespace
        self.loaded = self.guarded("<completion>", lambda: exec(compile(code, "<completion>", "exec"), namespace))[0]

    def guarded(self, label: str, run) -> tuple:
        """(True, run()) or (False, the exception), within what is left of `label`'s time (the outermost request
        keeps the clock: one the judge asks while answering the code's own is part of it)."""
        outer = self.depth == 0
        self.depth += 1
        try:
            if outer:
                budget = self.left.get(label, self.time_s)
                if budget <= 0:
                    raise Timeout()
                signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                return True, run()
            finally:
                if outer:
                    self.left[label] = signal.setitimer(signal.ITIMER_REAL, 0)[0]
        except BaseException as err:  # noqa: BLE001 - whatever the code raised, it is the answer
            try:  # one line for whoever reads the output (the trainer keeps its start)
                print(f"{label}: {type(err).__name__}: {_text(err)}", file=sys.stderr)
            except BaseException:  # noqa: BLE001 - stderr closed or replaced
                pass
            return False, err
        finally:
            self.depth -= 1

    def timed_out(self, err: BaseException) -> bool:
        return isinstance(err, Timeout)

    def run(self, op: str, target, a, b):
        if op == "watch":  # the judge reads these globals of the code's as values: it gets them after each answer
            self.watched = [name for name in a if type(name) is str][:256]
            return None
        return super().run(op, target, a, b)

    def capture(self):
        previous, sys.stdout = sys.stdout, Captured(self.capture_limit)
        return previous

    def captured(self, previous) -> str:
        mine, sys.stdout = sys.stdout, previous
        return mine.text() if type(mine) is Captured else ""

    def fresh(self) -> list:
        return [(name, self.namespace[name]) for name in self.watched if name in self.namespace]

    def timeout(self) -> BaseException:
        return Timeout()

    def handle_of(self, x) -> Handle | None:
        return object.__getattribute__(x, "_handle") if type(x) is Lent else None

    def proxy(self, handle: Handle) -> Lent:
        return Lent(self, handle)

    def named(self, name: str):
        if name in self.namespace:
            return self.namespace[name]
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise BadValue(f"name {name!r} is not defined")

    def names(self) -> list:
        """(name, how, payload) for each global the code's run left: a plain value (its bytes), a standard library
        module or object (its module and name, which the judge imports itself if it may), or one of the code's own."""
        out, room = [], MAX_BYTES // 2  # the load report is one message: the values in it share its size
        for name, value in list(self.namespace.items())[:4096]:
            if not isinstance(name, str) or name.startswith("__") and name.endswith("__"):
                continue
            how, payload = _describe(value)
            if how == "value":
                room -= len(payload) + len(name) + 32
                if room < 0:  # past the room left: by reference, as the code's other objects
                    how, payload = "code", None
            out.append((name, how, payload))
        return out

    def serve(self) -> None:
        self.pipe.send(encode(("loaded", self.loaded, self.names())))
        while True:
            try:
                request = self.pipe.receive()
            except (EOFError, OSError):
                return
            self.pipe.send(self.answer(request))


class Captured:
    """sys.stdout during a request (and the Python tool's cell, python_job.py): what the code prints, up to `limit`
    characters; the rest is dropped and counted (`dropped`)."""

    def __init__(self, limit: int):
        self.parts, self.left, self.dropped = [], limit, 0

    def write(self, text) -> int:
        text = str(text)
        kept = text[:max(0, self.left)]
        if kept:
            self.parts.append(kept)
            self.left -= len(kept)
        self.dropped += len(text) - len(kept)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "".join(self.parts)


def _describe(value) -> tuple:
    """How a global crosses: ("value", bytes), ("module", name), ("library", (module, qualname)), ("exception",
    (name, its builtin base's name)) or ("code", None)."""
    try:
        if type(value) is type(sys):
            return "module", value.__name__
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if type(module) is str and type(qualname) is str and module != "__main__" and (callable(value)):
            return "library", (module, qualname)
        if isinstance(value, type) and issubclass(value, BaseException) and module == "__main__":
            return "exception", (value.__name__, builtin_base(value))  # the judge makes a stand-in: `except TheirError`
    except BaseException:  # noqa: BLE001 - the code's own __getattr__ or properties
        return "code", None
    try:
        return "value", encode(value)
    except BaseException:  # noqa: BLE001 - not plain data, or too big to send: used by reference
        return "code", None


def serve(job: dict, pipe) -> None:
    """The code runner's whole life after the sandbox set itself up: load, then answer until the link closes."""
    Server(job, pipe).serve()
