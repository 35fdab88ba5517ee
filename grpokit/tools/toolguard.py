"""Every call TRL makes into a user's tools and environment, bounded and blamed.

TRL 1.16 calls a tool inline, in the training process's main thread, and writes whatever the tool raises as the
call's result (`{'error': str(exception)}`, counted in `tools/failure_frequency`). Around each call this module adds:

* a time limit (`tools.timeout_seconds`): at the deadline a watchdog thread sends CUT_SIGNAL (a signal of grpokit's
  own, not the alarm clock a tool may use for itself) to the main thread, whose handler raises `ToolCut` inside the
  tool -- a `BaseException`, so a tool's own `except Exception` does not swallow it -- and the call fails with an
  error naming the limit. The signal is how the limit usually holds; the clock is why it always does: each call's
  elapsed time is measured, and whatever came back past the limit (a tool that ignored, blocked or swallowed its
  cut) is refused the same way;
* every text read from what the call handed back -- its result, its exception's message -- is read while the
  deadline is open (grpokit.tools.tooltext: a `__str__` is the tool's code; one that never returns is cut, one that raises
  is the call's failure), cut to `tools.max_result_chars` and made valid (no lone surrogates): a 10 MB string is
  refused or cut before TRL tokenizes it (the tokenizer would abort the process allocating gigabytes). TRL gets the
  exception as a `ToolError` holding that text, so its own `str()` of it runs nothing of the tool's;
* an exception of the tool's own, which TRL makes the call's result, is kept for the tool's author too: its type,
  message and the tool file's line (grpokit.tools.toolfaults), said once on the console and shown with the step's failed
  calls in report.md;
* the tool gets a copy of its arguments as parsed: one that changes them leaves the completion's record of the call
  (what report.md shows) as the model wrote it;
* a stop signal during a call (Ctrl-C, SIGTERM) goes to the run's handler (`lifecycle.StopOnSignal`), untouched: the
  first is recorded and the call, and the step's later calls, run on within these same limits, so the step the run
  stops after is a whole one; a second stops at once, and the step it cut is not taken;
* an environment's own faults -- `__init__` or `reset` raising, a tool raising what is not an answer to the call
  (a `BaseException`: `SystemExit`, its own `KeyboardInterrupt`, `GeneratorExit`), `reset` returning what TRL
  cannot add to a prompt, `get_reward` returning what is not a finite real number (a string, an array, an int too
  large for a float, NaN, inf) -- end the run with `EnvironmentFailure`, one line naming the environment, the
  method, the value's type and the sample (the environment's side: grpokit.tools.envguard).

Signals reach only the main thread: a tool called from another thread is not cut, but what it brings back late is
refused. An async tool, which TRL runs on its event loop thread, is cut by `asyncio.wait_for` where it awaits; one
that blocks the loop past the limit has what it brought dropped when it returns; whatever it raises (SystemExit
included: leaving its task, it would end TRL's event loop) is a failed call. A tool stuck in C code that never
returns to the interpreter cannot be cut from inside the process; SIGKILL ends it.
"""
from __future__ import annotations

import asyncio
import functools
import inspect
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from grpokit.tools.toolfaults import Faults, fault_of
from grpokit.tools.tooltext import as_parsed, as_result, message, named, text_size

# Should a tool swallow the first cut (a bare `except:` in a retry loop), the timer fires again this often; after
# RECUTS_BEFORE_NOTICE of them the console is told why the call does not end.
RECUT_SECONDS = 1.0
RECUTS_BEFORE_NOTICE = 3


class EnvironmentFailure(BaseException):
    """An environment's or tool's own code failed in a way no model's call explains: the run stops, as it does for a
    failing reward (`training.run` says `run stopped:` and where it can go on from). Not an `Exception`: TRL takes
    any Exception a tool raises for the call's result, which the model would read and the run go on."""


class ToolLimitError(RuntimeError):
    """A call that ran past a limit: TRL writes the message as the call's result (what the model reads) and counts a
    failed call."""


class ToolError(RuntimeError):
    """A tool's own exception as TRL gets it: its message, read within the call's bounds, cut to
    tools.max_result_chars and made valid, so that the `str()` TRL takes of it (what the model reads) runs no code
    of the tool's."""


class ToolCut(BaseException):
    """Raised inside a tool to end a call: its time is up, or (an environment's own code) the run is stopping."""


# Logged per call, as TRL logs tools/failure_frequency (failed calls over calls): the share of calls each limit cut.
TIMEOUT_KEY, OVERSIZE_KEY = "tools/timeout_frequency", "tools/oversize_frequency"
BAD_ARGUMENTS_KEY = "tools/bad_arguments_frequency"  # calls naming arguments the tool does not take (or missing one)


# A step's tool calls print nothing until its step line; when they hold the step up this long (wall time, at least
# half of it inside the tools), one line says how many ran and how long they took, then again each period.
NOTICE_EVERY_S = 30.0


class Tally:
    """Where each call's outcome goes: `sink(key, value)`, once the trainer exists to log it (trl_compat.metric_sink);
    nowhere before (the probe TRL makes while it is built calls no tool). `spent(seconds)` is told each call's time:
    a long batch of calls shows progress through `say` (see NOTICE_EVERY_S)."""

    def __init__(self, say: Callable[[str], None] = lambda line: print(line, flush=True), clock=time.monotonic):
        self.sink: Callable[[str, float], None] | None = None
        self.say, self.clock = say, clock
        self.since: float | None = None  # when the calls counted below began
        self.faults = Faults(say)  # what each tool's own exceptions tell its author, for the console and report.md
        self.calls, self.seconds = 0, 0.0

    def spent(self, seconds: float) -> None:
        now = self.clock()
        if self.since is None or now - self.since > 2 * NOTICE_EVERY_S and self.seconds < NOTICE_EVERY_S / 2:
            self.since, self.calls, self.seconds = now - seconds, 0, 0.0  # a new batch of calls, or a quiet spell
        self.calls += 1
        self.seconds += seconds
        if now - self.since >= NOTICE_EVERY_S and self.seconds >= (now - self.since) / 2:
            self.say(f"[grpokit] tools: {self.calls} calls in the last {now - self.since:.0f} s, {self.seconds:.0f} s "
                     "of it in the tools; the step goes on")
            self.since, self.calls, self.seconds = now, 0, 0.0
        elif now - self.since >= NOTICE_EVERY_S:  # mostly generation between the calls: the step line will do
            self.since, self.calls, self.seconds = now, 0, 0.0

    def raised(self, tool: str, text: str, fault) -> None:
        """A tool's own exception, which TRL makes the call's result (`text`, as `message` read it): its `fault`
        (toolfaults.fault_of) kept with what the model reads of it."""
        from rewards.tools import failure_text

        self.faults.add(tool, failure_text(text), fault)

    def record(self, timed_out: bool = False, oversized: bool = False, bad_arguments: bool = False) -> None:
        if self.sink is not None:
            self.sink(TIMEOUT_KEY, float(timed_out))
            self.sink(OVERSIZE_KEY, float(oversized))
            self.sink(BAD_ARGUMENTS_KEY, float(bad_arguments))


@dataclass(frozen=True)
class Limits:
    """A recipe's `tools.timeout_seconds` and `tools.max_result_chars` (defaults and bounds: grpokit.tools.tooluse.TOOLS),
    and the tally their cuts are counted in."""

    timeout_seconds: float
    max_result_chars: int
    tally: Tally = field(default_factory=Tally, compare=False)


_inside = threading.local()  # a tool calling another tool (an environment method calling self.add) is one call


# The signal that cuts a call: one of the real-time signals no library here uses (glibc keeps those below SIGRTMIN),
# sent to the main thread by grpokit's own watchdog thread, so a tool's own `signal.alarm(n)` / `alarm(0)` or
# `setitimer` -- which share the one ITIMER_REAL clock -- cannot disarm it. SIGALRM with that clock where there is none.
CUT_SIGNAL = signal.SIGRTMIN + 5 if hasattr(signal, "SIGRTMIN") else signal.SIGALRM


class _Watchdog:
    """One thread for the process: at a call's deadline (and every RECUT_SECONDS after, should the tool swallow the
    cut) it sends CUT_SIGNAL to the main thread, until the call disarms it."""

    def __init__(self):
        self.lock = threading.Condition()
        self.due: float | None = None
        self.thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self.lock:
            self.due = time.monotonic() + seconds
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._watch, name="grpokit-tool-deadline", daemon=True)
                self.thread.start()
            self.lock.notify()

    def disarm(self) -> None:
        with self.lock:
            self.due = None
            self.lock.notify()

    def _watch(self) -> None:
        main = threading.main_thread().ident
        with self.lock:
            while True:
                if self.due is None:
                    self.lock.wait()
                    continue
                left = self.due - time.monotonic()
                if left > 0:
                    self.lock.wait(left)
                    continue
                self.due += RECUT_SECONDS
                signal.pthread_kill(main, CUT_SIGNAL)


_WATCHDOG = _Watchdog()


class _Deadline:
    """Arms the cut for one call, and with `stops` chains the stop signals so that one cuts it too (a call with no
    time limit, which no step end can wait for); `why` says what cut it, if anything did.

    Closing twice is safe: a cut can land as the first close begins (see `_call`).
    """

    def __init__(self, seconds: float | None, stops: bool = False):
        self.seconds, self.why, self.signum, self.live, self.previous = seconds, None, None, False, {}
        self.fired, self.stops = 0, stops

    def open(self) -> None:
        global _current
        if threading.current_thread() is not threading.main_thread():
            return  # Python delivers signals to the main thread only: no time bound here
        for sig in (signal.SIGINT, signal.SIGTERM) if self.stops else ():
            if callable(signal.getsignal(sig)):  # SIG_DFL ends the process anyway; SIG_IGN is the user's choice
                self.previous[sig] = signal.signal(sig, self._stop)
        self.live = True
        if self.seconds:
            # Installed for good, not restored at close: a cut sent as the call ends finds it there, and ignores it.
            if signal.getsignal(CUT_SIGNAL) is not _on_cut:
                signal.signal(CUT_SIGNAL, _on_cut)
            _current = self
            _WATCHDOG.arm(self.seconds)

    def _alarm(self, signum, frame) -> None:
        if self.live:
            self.why, self.fired = self.why or f"no result within tools.timeout_seconds ({self.seconds:g} s)", self.fired + 1
            if self.fired == RECUTS_BEFORE_NOTICE:
                import sys

                print(f"[grpokit] a tool call has run {self.seconds + (self.fired - 1) * RECUT_SECONDS:g} s, past "
                      f"tools.timeout_seconds ({self.seconds:g} s): the tool catches the exception that ends it (a bare "
                      "`except:` in a loop?); only SIGKILL stops it now", file=sys.stderr, flush=True)
            raise ToolCut(self.why)

    def _stop(self, signum, frame) -> None:
        if self.live:  # first: a stop at once, raised by the handler below, is then told from a tool's own raise
            self.signum = signum
        self.previous[signum](signum, frame)  # the run's own handler: records the stop, or stops at once by raising
        if self.live:
            self.why = f"the run is stopping ({signal.Signals(signum).name})"
            raise ToolCut(self.why)

    def close(self) -> None:
        global _current
        self.live = False
        if _current is self:
            _WATCHDOG.disarm()
            _current = None
            if signal.getsignal(CUT_SIGNAL) is not _on_cut:  # the tool replaced it: the next call needs it back
                signal.signal(CUT_SIGNAL, _on_cut)
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}


_current: _Deadline | None = None  # the call the watchdog is armed for


def _on_cut(signum, frame) -> None:
    """CUT_SIGNAL's handler for the process's life: cuts the call it was armed for, if that call is still running."""
    deadline = _current
    if deadline is not None and deadline.live:
        deadline._alarm(signum, frame)


def _call(function: Callable, name: str, shown: str, limits: Limits, sample: Callable[[], str], args, kwargs):
    """One bounded call of `function`; what TRL sees: the result's text, `ToolLimitError`, `ToolError` (the tool's own
    exception as text) or `EnvironmentFailure` (it raised what is not an answer to the call). A run that is stopping
    still makes the call, within the same limits: the step it stops after is trained whole."""
    from grpokit.lifecycle import Stopped  # noqa: F401 - before the clock starts: its first import loads transformers

    if getattr(_inside, "depth", 0):
        return function(*args, **kwargs)  # inside another tool's call: that call's bounds hold
    _check_arguments(function, name, limits, args, kwargs)
    args, kwargs = as_parsed(args), as_parsed(kwargs)  # the call's record (the completion) is what the model wrote
    deadline = _Deadline(limits.timeout_seconds)
    _inside.depth = 1
    started = time.monotonic()
    try:
        deadline.open()
        try:
            kind, value, err = _outcome(function, args, kwargs, deadline, limits.max_result_chars)
        finally:
            deadline.close()
    except ToolCut as cut:  # the deadline, or a stop signal; the run's own stop (KeyboardInterrupt) goes on up
        limits.tally.record(timed_out=deadline.signum is None)
        raise ToolLimitError(f"{name}: {deadline.why or cut}; the call was stopped") from None
    finally:
        deadline.close()  # again: a cut landing as the first close began leaves the timer armed
        _inside.depth = 0
        took = time.monotonic() - started
        limits.tally.spent(took)
    # The signal is how the limit usually holds; the clock is why it always does: a tool that swallowed, ignored or
    # blocked its cut and came back late has what it brought refused.
    late = bool(limits.timeout_seconds) and took > limits.timeout_seconds
    if deadline.why or late:
        limits.tally.record(timed_out=deadline.signum is None)
        raise ToolLimitError(f"{name}: {deadline.why}; the call was stopped" if deadline.why else
                             f"{name}: no result within tools.timeout_seconds ({limits.timeout_seconds:g} s; it came "
                             f"back after {took:.1f} s); what it returned was dropped")
    if kind == "fatal":
        raise EnvironmentFailure(f"tool {shown} raised {value}{sample()}")
    if kind == "raised":
        limits.tally.record()
        limits.tally.raised(name, value, fault_of(err, function, value))
        raise ToolError(value)  # the tool's answer to a bad call: TRL writes it for the model and counts a failed call
    return _sized(value, name, limits)


def _outcome(function: Callable, args, kwargs, deadline: _Deadline, most: int) -> tuple:
    """The call, and every text read from what it handed back, within its bounds (the caller holds the deadline
    open): ("result", its text or blocks, None), ("raised", the text the model reads, err) for an `Exception` of the
    tool's -- or one raised writing its result as text --, ("fatal", what it raised, err) for any other
    BaseException. A cut (ToolCut) and the run's own stop propagate."""
    try:
        result = function(*args, **kwargs)
    except BaseException as err:  # noqa: BLE001 - sorted here, its text read while the bound holds
        if isinstance(err, ToolCut) or _run_stopping(err, deadline):
            raise
        if isinstance(err, Exception):
            return "raised", message(err, most), err
        return "fatal", named(err, most), err
    try:
        # Its text inside the bound: a huge object takes time to write out too, and its __str__ is the tool's code
        return "result", as_result(result), None
    except BaseException as err:  # noqa: BLE001 - a result that cannot be written is the call's failure
        if isinstance(err, ToolCut) or _run_stopping(err, deadline):
            raise
        return "raised", f"its result cannot be written as text ({named(err, most)})", err


def _run_stopping(err: BaseException, deadline: _Deadline) -> bool:
    """Whether `err` is the run's own stop (a stop signal's handler raised it), not something a tool raised."""
    from grpokit.lifecycle import Stopped

    return isinstance(err, KeyboardInterrupt) and (isinstance(err, Stopped) or deadline.signum is not None)


def _check_arguments(function: Callable, name: str, limits: Limits, args, kwargs) -> None:
    """A call whose arguments do not fit the tool's parameters fails before it runs, with a TypeError (TRL counts a
    failed call; the model reads it) naming the parameters the tool takes; counted under BAD_ARGUMENTS_KEY."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin without a readable signature: its own error will do
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        limits.tally.record(bad_arguments=True)
        params = signature.parameters
        takes = ", ".join(p.name for p in params.values())
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            raise TypeError(f"{name}({takes}): {err}") from None
        unknown = [repr(k) for k in kwargs if k not in params]
        said = [f"takes no argument {', '.join(unknown)}"] if unknown else []
        try:
            bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params}).arguments
        except TypeError:  # too many positional arguments: the plain error says so
            raise TypeError(f"{name}({takes}): {err}") from None
        missing = [repr(p.name) for p in params.values() if p.name not in bound and p.default is p.empty
                   and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        said += [f"missing {', '.join(missing)}"] if missing else []
        raise TypeError(f"{name}({takes}): {'; '.join(said) or err}") from None


def _sized(result, name: str, limits: Limits):
    """The result as `_as_result` made it (plain text: its size takes no time of the tool's), counted; refused past
    tools.max_result_chars."""
    size = text_size(result)
    limits.tally.record(oversized=size > limits.max_result_chars)
    if size > limits.max_result_chars:
        raise ToolLimitError(f"{name}: its result is {size} characters, over tools.max_result_chars "
                             f"({limits.max_result_chars}); it was dropped")
    return result


async def _call_async(function: Callable, name: str, limits: Limits, args, kwargs):
    """An async tool, on TRL's event loop thread: `asyncio.wait_for` cuts it where it awaits, then the same size rule.
    One that blocks the loop (a `time.sleep`, a CPU loop) cannot be cut there, where no signal comes: past the limit
    what it brought (its result or its error) is dropped and the call fails, naming why. Whatever it raises, SystemExit
    included, is a failed call: a BaseException leaving a task ends the event loop, and TRL's with it."""
    _check_arguments(function, name, limits, args, kwargs)
    args, kwargs = as_parsed(args), as_parsed(kwargs)
    started = time.monotonic()
    try:
        result, err = await asyncio.wait_for(_caught(function(*args, **kwargs)), limits.timeout_seconds)
    except asyncio.TimeoutError:
        limits.tally.record(timed_out=True)
        raise ToolLimitError(f"{name}: no result within tools.timeout_seconds ({limits.timeout_seconds:g} s); the call "
                             "was stopped") from None
    most = limits.max_result_chars
    if err is None:
        kind, value = "result", result
        try:
            value = as_result(result)
        except Exception as why:  # noqa: BLE001 - a result that cannot be written is the call's failure
            kind, value, err = "raised", f"its result cannot be written as text ({named(why, most)})", why
    else:
        kind, value = "raised", message(err, most) if isinstance(err, Exception) else named(err, most)
    took = time.monotonic() - started
    if took > limits.timeout_seconds:
        limits.tally.record(timed_out=True)
        raise ToolLimitError(f"{name}: it blocked its event loop past tools.timeout_seconds "
                             f"({limits.timeout_seconds:g} s; {took:.1f} s without awaiting: time.sleep, not "
                             "asyncio.sleep?); what it returned was dropped")
    if kind == "raised":
        limits.tally.record()
        limits.tally.raised(name, value, fault_of(err, function, value))
        raise ToolError(value)
    return _sized(value, name, limits)


async def _caught(coroutine) -> tuple:
    """(result, None) or (None, what the coroutine raised): caught in the coroutine's own task, before a SystemExit or
    KeyboardInterrupt can leave it (asyncio re-raises those out of the event loop). Its cancel (the deadline) goes
    on."""
    try:
        return await coroutine, None
    except asyncio.CancelledError:
        raise
    except BaseException as err:  # noqa: BLE001 - every other way it ends is the call's failure
        return None, err


def _error(err: BaseException) -> str:
    """An environment's own fault as its `run stopped:` line names it (`SystemExit: 3`)."""
    return named(err, 500)


def _wrap(function: Callable, name: str, shown: str, limits: Limits, sample: Callable[[], str]):
    """`function` bounded, with its name, signature and docstring (the schema the model reads is unchanged)."""
    if inspect.iscoroutinefunction(function):
        @functools.wraps(function)
        async def bounded_async(*args, **kwargs):
            return await _call_async(function, name, limits, args, kwargs)
        return bounded_async

    @functools.wraps(function)
    def bounded(*args, **kwargs):
        return _call(function, name, shown, limits, sample, args, kwargs)
    return bounded


def bounded_function(function: Callable, limits: Limits) -> Callable:
    """A tool function (`tools.functions`) as TRL gets it: same name, signature and docstring, each call bounded."""
    return _wrap(function, function.__name__, f"{function.__name__} (tools.functions)", limits, lambda: "")
