"""The link between code_tests' two processes: requests and answers, as plain data, in both directions.

The judge (sandbox/judge.py) asks the code's process (sandbox/candidate.py) to call a function of
the code's, read an attribute of its object, take an item, and so on; while it waits, the code's process may ask
back about an object the judge lent it -- a test's function passed as an argument (`apply(lambda x: x * 2, 3)`), a
test's generator -- and the judge answers before it goes on waiting. Each side keeps the objects it sent by
reference (numbered handles, sandbox/values.py) and makes a proxy for each the other side sent. A message
is `("?", seq, label, op, target, a, b)` (a request; `label`: the test it belongs to) or `("!", seq, printed, kind,
...)` (its answer, with what the request printed: "ok" with the result, the arguments' new state and that of the
globals the other side watches, "raise" with the exception's nearest builtin type, the setup's class, its own
class's name and its args, "timeout", "unsendable").
"""

from __future__ import annotations

import os
import select
import signal
import sys
# This file's own references, taken when it is loaded (before any graded code runs, which may rebind the builtins).
from builtins import (BaseException, EOFError, Exception, OSError, TypeError, ValueError, bool, bytearray, bytes, dict,
                      enumerate, getattr, id, int, isinstance, issubclass, iter, len, list, next, set, str, tuple, type)

from grpokit.untrusted.values import MAX_BYTES, BadValue, Decoder, Encoder, Handle, encode, refill, stand_in


class Pipe:
    """One end of the link: frames of `<4-byte length><bytes>` on a pair of descriptors. Reading and writing go on
    together (neither side can block the other by writing while it writes), and with SIGALRM held back: the timer
    that ends a test takes effect between frames' bookkeeping, never in the middle of it, so an interrupted frame
    is finished by the next call and the stream stays whole. A frame past MAX_FRAME, more unread input than two of
    them, or a descriptor closed ends the link (EOFError)."""

    MAX_FRAME = 2 * MAX_BYTES + (1 << 16)

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd, self.inbox, self.outbox = read_fd, write_fd, bytearray(), bytearray()
        self._read, self._write, self._select, self._signal = os.read, os.write, select.select, signal

    def send(self, data: bytes) -> None:
        self.outbox += len(data).to_bytes(4, "big") + data
        self._exchange(want_frame=False)

    def receive(self) -> bytes:
        frame = self._exchange(want_frame=True)
        if frame is None:  # the timer ran out and its handler did not raise: nothing more will come in time
            raise EOFError("no answer in time")
        return frame

    def _exchange(self, want_frame: bool):
        """Write what is queued; read what comes; return a whole frame if one is wanted. With SIGALRM blocked: a
        timer that expires meanwhile ends the wait (the select's own timeout) and its handler runs on return."""
        signal = self._signal
        held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        try:
            while True:
                if want_frame and len(self.inbox) >= 4:
                    size = int.from_bytes(self.inbox[:4], "big")
                    if size > self.MAX_FRAME:
                        raise EOFError("frame too big")
                    if len(self.inbox) >= 4 + size:
                        frame = bytes(self.inbox[4:4 + size])
                        del self.inbox[:4 + size]
                        return frame
                if not self.outbox and not want_frame:
                    return None
                left = signal.getitimer(signal.ITIMER_REAL)[0]
                readable, writable, _ = self._select([self.read_fd], [self.write_fd] if self.outbox else [], [],
                                                     left if left > 0 else None)
                if not readable and not writable:
                    return None  # the timer ran out: its handler raises once SIGALRM is let through
                if writable:  # at most PIPE_BUF: a pipe select calls writable takes that much without blocking
                    del self.outbox[:self._write(self.write_fd, self.outbox[:4096])]
                if readable:
                    chunk = self._read(self.read_fd, 1 << 20)
                    if not chunk:
                        raise EOFError("the other side closed the link")
                    self.inbox += chunk
                    if len(self.inbox) > 2 * self.MAX_FRAME + 8:
                        raise EOFError("too much unread input")
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)


class Broken(BaseException):
    """The other side sent no usable answer: it left, sent malformed bytes, or a value too big to send. A
    BaseException, so that a test's `except Exception` cannot take it for an exception the code raised."""


class Peer:
    """One side of the link. Subclasses say how the other side's objects look here (`proxy`), what this side may
    lend (`lend`), what a global name means (`named`), and how a request is run here (`run`, `guarded`)."""

    def __init__(self, pipe, classes: dict):
        self.pipe, self.seq, self.label = pipe, 0, ""
        self.lent, self.numbers, self.proxies = [], {}, {}
        self.classes = classes  # {name: class} of the setup's
        self.encoder = Encoder({cls: name for name, cls in classes.items()}, self.refer)
        self.decoder = Decoder(classes, self.held)

    # -- objects by reference ----------------------------------------------------------------------------------

    def refer(self, x) -> Handle | None:
        handle = self.handle_of(x)
        if handle is not None:
            return Handle(handle.number, handle.name, "", True) if handle.name is None else handle
        if not self.lend(x):
            return None
        number = self.numbers.get(id(x))
        if number is None:
            number = self.numbers[id(x)] = len(self.lent)
            self.lent.append(x)  # kept alive: its id stays its own
        try:
            kind = type(x).__name__
        except BaseException:  # noqa: BLE001 - a metaclass's own __name__
            kind = "object"
        return Handle(number, None, kind if isinstance(kind, str) else "object")

    def held(self, handle: Handle):
        if handle.name is not None:
            return self.named(handle.name)
        if handle.theirs:  # one of ours, sent back
            if not 0 <= handle.number < len(self.lent):
                raise BadValue("no such object")
            return self.lent[handle.number]
        if handle.number not in self.proxies:
            self.proxies[handle.number] = self.proxy(handle)
        return self.proxies[handle.number]

    def handle_of(self, x) -> Handle | None:
        """The handle of the other side's object that `x` stands for here, or None."""
        return None

    def lend(self, x) -> bool:
        return True

    def proxy(self, handle: Handle):
        raise NotImplementedError

    def named(self, name: str):
        raise BadValue("a global name where a value was expected")

    # -- asking --------------------------------------------------------------------------------------------------

    def ask(self, op: str, target, a=None, b=None):
        """The other side's answer to one request, or the exception it raised there, raised here; its requests
        meanwhile are answered."""
        self.seq += 1
        seq = self.seq
        try:
            request = self.encoder.encode(("?", seq, self.label, op, target, a, b))
        except BadValue as err:  # what is passed cannot cross (too big, or an object this side does not lend)
            raise TypeError(f"cannot pass that to the other side: {err}") from None
        try:
            self.pipe.send(request)
            while True:
                message = self.decoder.decode(self.pipe.receive())
                if not (type(message) is tuple and len(message) >= 4):
                    raise BadValue("not a message")
                if message[0] == "?":
                    self.pipe.send(self.answer(message))
                elif message[0] == "!" and message[1] in (seq, -1):
                    break  # an earlier request's late answer (its test ran out of time) is skipped
        except (BadValue, EOFError, OSError) as err:
            raise Broken(f"{type(err).__name__}: {err}") from None
        if type(message[2]) is str and message[2]:  # what the request printed there, printed here
            try:
                sys.stdout.write(message[2])
            except Exception:  # noqa: BLE001 - a test's own stdout that refuses it
                pass
        return self.outcome(message[3:], op, a, b)

    def outcome(self, answer: tuple, op: str, a, b):
        kind = answer[0]
        if kind == "ok" and len(answer) == 4:
            if type(answer[2]) is not list or type(answer[3]) is not list:
                raise Broken("a malformed answer")
            self.absorb(answer[3])
            result = answer[1]
            for change in answer[2]:  # the arguments' new state: the test's own objects change too
                if type(change) is tuple and len(change) == 2:
                    key, new = change
                    mine = a[key] if type(key) is int and 0 <= key < len(a) else \
                        b.get(key) if type(key) is str else None
                    if mine is not None and refill(mine, new) and result is new:
                        result = mine  # a result that is one of the arguments is that object
            return result
        if kind == "timeout":
            raise self.timeout()
        if kind == "raise" and len(answer) == 5:
            raise self.exception(*answer[1:])
        if kind == "unsendable" and len(answer) == 2:
            raise Broken(f"the answer cannot be sent: {str(answer[1])[:100]}")
        raise Broken("a malformed answer")

    def timeout(self) -> BaseException:
        return Broken("the other side ran out of time")

    def fresh(self) -> list:
        """[(name, value)] of this side's globals that the other side watches, sent with each answer."""
        return []

    def absorb(self, globals_: list) -> None:
        """Take the other side's watched globals' new values."""

    def exception(self, name, setup_name, own, args) -> BaseException:
        """The exception the other side raised, with its args: as the setup's class, or as a stand-in of its own
        class's name deriving from its nearest builtin type (so `except ValueError` and `except TheirError` work)."""
        import builtins

        cls = self.classes.get(setup_name) if type(setup_name) is str else None
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            cls = getattr(builtins, name, None) if type(name) is str else None
            cls = cls if isinstance(cls, type) and issubclass(cls, BaseException) else Exception
            if type(own) is str and own != cls.__name__ and own.isidentifier() and not own.startswith("__"):
                try:
                    cls = stand_in(own, cls)
                except BadValue:  # too many of them
                    pass
        args = args if type(args) is tuple else ()
        try:
            err = cls(*args) if cls.__module__ == "builtins" else BaseException.__new__(cls)
        except Exception:  # noqa: BLE001 - args its constructor refuses (UnicodeDecodeError needs five)
            err = BaseException.__new__(cls)
        err.args = args
        return err

    # -- answering -----------------------------------------------------------------------------------------------

    def answer(self, message) -> bytes:
        """The encoded answer to one request (a decoded message, or its bytes)."""
        try:
            if not isinstance(message, tuple):
                message = self.decoder.decode(message)
            _, seq, label, op, target, a, b = message
            if op not in OPS or op == "call" and not (type(a) is tuple and type(b) is dict):
                raise BadValue(f"no such request: {op!r}")
        except (BadValue, ValueError, TypeError) as err:  # an argument this side cannot rebuild (no such class)
            return encode(("!", -1, "", "unsendable", f"a request: {str(err)[:100]}"))
        captured = self.capture()
        try:
            ok, result = self.guarded(str(label), lambda: self.run(op, target, a, b))
        finally:
            printed = self.captured(captured)
        if ok:
            changed = [(k, arg) for k, arg in [*enumerate(a), *b.items()] if _mutable(arg, self.encoder.classes)] \
                if op == "call" else []
            try:
                return self.encoder.encode(("!", seq, printed, "ok", result, changed, self.fresh()))
            except BaseException as err:  # noqa: BLE001 - too big to send, or an object's own misbehaviour
                return encode(("!", seq, printed, "unsendable", f"{type(err).__name__}: {_text(err)}"))
        if self.timed_out(result):
            return encode(("!", seq, printed, "timeout"))
        return encode(("!", seq, printed, "raise", *_exception(result, self.encoder.classes)))

    def capture(self):
        """Start collecting what a request prints here (it is printed on the asking side, where a test may be
        capturing its output); returns what `captured` needs to stop."""
        return None

    def captured(self, token) -> str:
        return ""

    def guarded(self, label: str, run) -> tuple:
        """(True, run()) or (False, the exception it raised) for the exceptions this side answers with."""
        try:
            return True, run()
        except Exception as err:  # noqa: BLE001 - a BaseException (this side's timer) ends this side's test instead
            return False, err

    def timed_out(self, err: BaseException) -> bool:
        return False

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
        raise TypeError(f"{op!r} is not asked of this side")


OPS = ("call", "getattr", "iter", "next", "bool", "len", "getitem", "isinstance", "watch")
_IMMUTABLE_BASES = (int, float, complex, str, bytes, tuple, frozenset)


def _mutable(arg, classes: dict) -> bool:
    """Is `arg` an object a call may change in place, whose new state goes back with the answer?"""
    kind = type(arg)
    return isinstance(arg, (list, dict, set, bytearray)) or kind in classes and not issubclass(kind, _IMMUTABLE_BASES) \
        or kind.__name__ == "deque" and kind.__module__ == "collections"


def _exception(err: BaseException, classes: dict) -> tuple:
    """(its nearest builtin type's name, the setup's class's name or None, its own class's name, its args as data)."""
    kind = type(err)
    name, setup = builtin_base(kind), classes.get(kind)
    try:
        args = err.args if type(err.args) is tuple else ()
        encode(args)
    except BaseException:  # noqa: BLE001 - args that are not plain data: their text
        args = (_text(err),)
    own = getattr(kind, "__name__", "")
    return name, setup, own if type(own) is str else "", args


def builtin_base(kind: type) -> str:
    """The name of the nearest builtin exception class `kind` derives from."""
    import builtins

    return next((c.__name__ for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c), "Exception")


def _text(err: BaseException) -> str:
    try:
        return str(err)[:200]
    except BaseException:  # noqa: BLE001 - the code's own __str__
        return ""
