"""The trusted side of code_tests: runs the setup and every statement of every test, and never the graded code.

This process (the sandbox's "judge", sandbox/child.py) runs the sample's setup, then each test whole --
assignments, loops, comprehensions, helper functions, try/except, asserts -- in one namespace, as Python would run
them after the code, and reports each verdict to the trainer. The graded code runs in another process
(sandbox/candidate.py), which holds the code and the setup's imports and class definitions, and never the
tests, the setup's values or functions, or the results pipe. A name a test uses is, in this order:

  - the setup's, the builtins', or one a test bound, whatever the code binds (`check(f(2))` calls the setup's
    `check`; `len`, `AssertionError` are the real ones);
  - this process's own import of `math`, `re`, `collections` and the other modules of `_MODULES` when a test
    names them, whatever the code binds to those names;
  - otherwise the code's: its value when plain data (`K = 3`, as the code's run left it); this process's own
    standard library object when the code bound one from `_LIBRARY` (`from math import sqrt`: the test's
    `sqrt(2)` is never the code's choice); else a `CodeValue`.

Using a CodeValue -- calling it, reading an attribute, iterating it, asking its truth, length, an item, or
`isinstance` against it -- sends the request to the code's process (sandbox/link.py) with the arguments as
plain data (sandbox/values.py) and returns the answer as plain data, or raises the exception the code raised,
with its args, as the setup's own class or as a stand-in of its own class's name deriving from its nearest builtin
type (so `except ValueError` and `except TheirError` in a test work; the code's exception classes are such stand-ins
here too). An
argument the code changed in place (`f(xs)` sorting `xs`) is changed here too, and a result that is an argument is
that object; what the call printed is printed here (`contextlib.redirect_stdout` in a test captures it). What a
test passes that is not data -- a lambda, a function of the setup's, a generator -- is lent: the code's calls on it
run here, on the code's data, and reach no underscore attribute.

So every verdict is computed here, by the test's own statements: the code chooses what its functions return, never
how the test reads it. What crosses keeps what a test can observe: a Counter stays a Counter (its `type`, `str`,
`most_common`), a namedtuple a namedtuple of the same name and fields, an OrderedDict, defaultdict, deque, Fraction,
Decimal, range or dict view itself, an instance of a class the setup defines is rebuilt from this side's own
class, and a subclass of a plain type that the code defines (`class I(int)`) a stand-in subclass of the same name
that compares, hashes and prints as its base does (its own methods would be the code's). What cannot be made
trustworthy is refused rather than guessed: a CodeValue -- an instance of a class the code defines, a generator, a
closure -- cannot be compared, hashed, printed or computed with here (its own `__eq__`, `__str__`, `__add__` would
decide), so such a test fails with a TypeError naming its class. A value past the caps (65,536 items, 512 KiB,
64 levels, an int of 131,072 bits) fails its test, as does an answer the code's process cannot send (`Broken`,
which a test's `except Exception` does not catch).

>>> from grpokit.untrusted import run
>>> out = run("def f(x):\\n    return x + 1", ["assert f(1) == 2", "assert f(1) == 3"])
>>> out.passed, out.notes
([True, False], ['<test 1>: AssertionError (f(1) = 2)'])
"""

from __future__ import annotations

import builtins
import reprlib
import signal
import sys

from grpokit.untrusted.link import Peer
from grpokit.untrusted.values import BadValue, Handle, refill, stand_in

# A test's `math`, `re`, `collections`, ... is this side's own import whatever the code binds to the name.
_MODULES = {"math", "cmath", "collections", "itertools", "functools", "operator", "string", "re", "fractions",
            "decimal", "heapq", "statistics", "datetime", "bisect"}
# Modules whose objects (and which modules themselves) this side imports itself where a global of the code's names
# one: modules of values and pure functions, none of which runs code or reaches an object's attributes by a name it
# is handed (so not `operator`, with its attrgetter and methodcaller). Anything else stays the code's (a CodeValue).
_LIBRARY = (_MODULES - {"operator"}) | {"numbers", "array", "copy", "json", "textwrap", "unicodedata", "random", "time",
                                        "calendar"}
_MARGIN_S = 0.25  # a test's time here: the code's share (time_s) plus this, so that the code's timer fires first


class Timeout(BaseException):
    """A test's time ran out (a BaseException: a test's `except Exception` does not eat it)."""


def _raise_timeout(signum, frame):
    raise Timeout()


class CodeValue:
    """An object that stays in the code's process: a global of the code's, or what one of its calls returned."""

    __slots__ = ("_link", "_handle")

    def __init__(self, link: "Link", handle: Handle):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_handle", handle)

    def __call__(self, *args, **kwargs):
        return self._link.ask("call", self, args, kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # a protocol probe (copy, pickle): this side's business, never the code's
        return self._link.ask("getattr", self, name)

    def __iter__(self):
        return self._link.ask("iter", self)

    def __next__(self):
        return self._link.ask("next", self)

    def __bool__(self):
        return self._link.answer_of(bool, "bool", self)

    def __len__(self):
        return self._link.answer_of(int, "len", self)

    def __getitem__(self, key):
        return self._link.ask("getitem", self, key)

    def __instancecheck__(self, obj):
        return self._link.answer_of(bool, "isinstance", self, obj)

    def __setattr__(self, name, value):
        raise TypeError("setting an attribute of the code's object is not supported here")

    def _refuse(self, *args):
        handle = object.__getattribute__(self, "_handle")
        raise TypeError(f"a {handle.kind or handle.name} (an object of a class the code defines, or of its making) "
                        "cannot be compared, hashed, printed or computed with by the test: its own methods would "
                        "decide; use its methods and attributes")


for _name in ("eq ne lt le gt ge hash contains str repr format add radd sub rsub mul rmul truediv rtruediv floordiv "
              "rfloordiv mod rmod pow rpow neg pos abs invert int float index round and rand or ror xor rxor "
              "lshift rlshift rshift rrshift matmul rmatmul divmod rdivmod complex").split():
    setattr(CodeValue, f"__{_name}__", CodeValue._refuse)


class Link(Peer):
    """This side's end of the link: the code's objects are CodeValues here; what a test passes to the code that is
    not data -- its own functions, generators and objects -- is lent (the code's calls on them run here, on the
    code's data, and answer as data), never a module or the setup's values by reference."""

    def __init__(self, pipe, classes: dict):
        super().__init__(pipe, classes)
        self.calls = []  # what the current test asked the code, for its failure note
        self.namespace, self.watched = {}, {}  # the tests' namespace; {name: value bound} of the code's plain globals

    def handle_of(self, x) -> Handle | None:
        if isinstance(x, CodeValue):
            return object.__getattribute__(x, "_handle")
        name = getattr(x, "__name__", None)
        if isinstance(name, str) and getattr(builtins, name, None) is x:
            return Handle(None, name)  # a builtin (`key=len`): the code's process has its own
        return None

    def lend(self, x) -> bool:
        return not isinstance(x, type(sys)) and not isinstance(x, type)

    def proxy(self, handle: Handle) -> CodeValue:
        return _kind(handle.kind)(self, handle)

    def run(self, op: str, target, a, b):
        if op == "getattr" and not (type(a) is str and a.isidentifier() and not a.startswith("_")):
            raise AttributeError(f"the code may read only plain attribute names of what a test lends it, not {a!r}")
        return super().run(op, target, a, b)

    def timeout(self) -> BaseException:
        return Timeout()

    def loaded(self) -> tuple:
        """(the code ran, [(name, how, payload)]) from the code's first message."""
        message = self.decoder.decode(self.pipe.receive())
        if not (type(message) is tuple and len(message) == 3 and message[0] == "loaded" and type(message[2]) is list):
            raise BadValue("not a load report")
        return message[1] is True, message[2]

    def bind(self, names: list, namespace: dict, tests: list) -> None:
        """The code's globals that the test may use: those neither the setup, the tests so far nor the builtins bound,
        nor a module of `_MODULES` that a test names (this side's own import)."""
        for module in _MODULES:
            if module not in namespace and any(_mentions(test, module) for test in tests):
                namespace[module] = __import__(module)
        for entry in names:
            if not (type(entry) is tuple and len(entry) == 3 and type(entry[0]) is str) or entry[0] in namespace \
                    or hasattr(builtins, entry[0]):
                continue
            name, how, payload = entry
            try:
                namespace[name] = self.library(how, payload) if how in ("module", "library") else \
                    self.decoder.decode(payload) if how == "value" and type(payload) is bytes else \
                    self.exception_class(payload) if how == "exception" else None
            except (BadValue, ImportError, AttributeError, TypeError, ValueError, RecursionError, MemoryError):
                namespace.pop(name, None)
            if namespace.get(name) is None and how != "value":
                namespace[name] = CodeValue(self, Handle(None, name, name))
            elif how == "value" and name in namespace and any(_mentions(test, name) for test in tests):
                self.watched[name] = namespace[name]
        self.namespace = namespace
        if self.watched:  # a test reads them: the code's process sends their new state with every answer
            self.ask("watch", None, sorted(self.watched), None)

    def absorb(self, globals_: list) -> None:
        """The code's plain globals a test reads, as the code's last answer left them (unless a test rebound them)."""
        for entry in globals_:
            if not (type(entry) is tuple and len(entry) == 2 and entry[0] in self.watched):
                continue
            name, new = entry
            mine = self.namespace.get(name)
            if mine is self.watched[name] and not (mine is not new and refill(mine, new)):
                self.namespace[name] = self.watched[name] = new

    def exception_class(self, payload):
        """A stand-in for an exception class the code defines: its name, deriving from its nearest builtin one, none
        of its methods (what `except TheirError` in a test catches; the code's exceptions of it arrive as it)."""
        name, base = payload if type(payload) is tuple and len(payload) == 2 else ("", "")
        base = getattr(builtins, base, None) if type(base) is str else None
        exception = isinstance(base, type) and issubclass(base, BaseException)
        if not (type(name) is str and name.isidentifier() and exception):
            return None
        return stand_in(name, base) if name != base.__name__ else base

    def library(self, how: str, payload):
        """This process's own standard library object that the code's global names; None where it is not one."""
        module, qualname = (payload, "") if how == "module" else payload if type(payload) is tuple else ("", "")
        if type(module) is not str or type(qualname) is not str:
            return None
        parts = module.split(".") + (qualname.split(".") if qualname else [])
        if module.split(".")[0] not in _LIBRARY or not all(p.isidentifier() and not p.startswith("_") for p in parts):
            return None  # never `functools.__builtins__`, nor a module outside the list
        found = __import__(module, fromlist=["_"])
        for part in qualname.split(".") if qualname else ():
            found = getattr(found, part)
        return found

    def ask(self, op: str, target, a=None, b=None):
        result = super().ask(op, target, a, b)
        if op == "call" and len(self.calls) < 4:
            shown = [_show(x) for x in a] + [f"{k}={_show(v)}" for k, v in b.items()]
            self.calls.append(f"{_name_of(target)}({', '.join(shown)}) = {_show(result)}")
        return result

    def answer_of(self, kind: type, op: str, target: CodeValue, a=None):
        value = self.ask(op, target, a)
        if type(value) is not kind or kind is int and value < 0:
            raise TypeError(f"the code's {op} gave a {type(value).__name__}, not a {kind.__name__}")
        return value


_KINDS: dict = {}


def _kind(name: str) -> type:
    """A CodeValue subclass named as the code's class is (`type(s).__name__ == 'Stack'` holds), one per name; none of
    the code's methods."""
    if not (type(name) is str and name.isidentifier() and len(name) <= 100):
        return CodeValue
    if name not in _KINDS:
        if len(_KINDS) > 256:
            return CodeValue
        _KINDS[name] = type(name, (CodeValue,), {"__slots__": (), "__module__": "__main__", "__qualname__": name})
    return _KINDS[name]


def _mentions(text: str, name: str) -> bool:
    """Does `name` occur in `text` as a whole word (`re` in `re.match`, not in `assert`)? An over-estimate is safe."""
    start = text.find(name)
    while start >= 0:
        end = start + len(name)
        if not (start and (text[start - 1].isalnum() or text[start - 1] == "_")) and \
                not (end < len(text) and (text[end].isalnum() or text[end] == "_")):
            return True
        start = text.find(name, end)
    return False


def _name_of(target: CodeValue) -> str:
    handle = object.__getattribute__(target, "_handle")
    return handle.name if handle.name is not None else f"<{handle.kind}>"


def _show(value) -> str:
    """A short repr (reprlib's, which looks at a few items only), for a failure note."""
    try:
        return reprlib.repr(value)
    except Exception:  # noqa: BLE001 - an int past Python's digit limit, a setup __repr__ that raises
        return "(cannot be shown)"


def judge(job: dict, pipe, report) -> None:
    """Run the setup, wait for the code's process to load, then run each test and report its verdict."""
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # from the code's process (same uid): no KeyboardInterrupt here
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    time_s = job["time_s"]
    ok, _ = _timed(time_s + _MARGIN_S, lambda: exec(compile(job["setup"], "<setup>", "exec"), namespace), "<setup>")
    classes = {name: v for name, v in namespace.items() if isinstance(v, type) and v.__module__ == "__main__"}
    link = Link(pipe, classes)
    got, loaded = _timed(2 * time_s + 1.0, link.loaded, "<completion>")  # the code's process loads meanwhile
    code_ok, names = loaded if got else (False, [])
    ok = ok and code_ok and _timed(time_s + _MARGIN_S, lambda: link.bind(names, namespace, job["tests"]), "<load>")[0]
    report("load", "1" if ok else "0")
    for i, test in enumerate(job["tests"]):
        if not ok:
            report("fail", i, b"the setup or the code did not load")
            continue
        link.label, link.calls = i, []
        label = f"<test {i}>"
        passed, err = _timed(time_s + _MARGIN_S, lambda: exec(compile(test, label, "exec"), namespace), label)
        if passed:
            report("pass", i)
        else:
            calls = f" ({', '.join(link.calls)})" if link.calls else ""
            report("fail", i, (_why(err) + calls).encode("utf-8", "replace"))


def _why(err: BaseException) -> str:
    """`Type: message` of a failed test's exception (its message may hold what cannot be shown)."""
    try:
        text = str(err)[:160]
    except Exception:  # noqa: BLE001 - a KeyError of an object that refuses repr()
        text = ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def _timed(seconds: float, run, label: str) -> tuple:
    """(True, run()) or (False, the exception), within `seconds`."""
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return True, run()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as err:  # noqa: BLE001 - a failing test, whatever it raised
        try:
            print(f"{label}: {_why(err)}", file=sys.stderr)
        except BaseException:  # noqa: BLE001
            pass
        return False, err
