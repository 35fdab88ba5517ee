"""What a tool's own exception tells its author: its type, its message and the line of the tool's file it came from.

A user's tool runs in the trainer process (grpokit.tools.toolguard calls it), so the exception object is here, on the
trusted side: `fault_of` reads it, and `Faults` keeps each by the tool and the text the model read for the call
(TRL writes `{'error': message}` and the run goes on), says each new place once on the console, and hands them to
report.md's failed calls (grpokit.reporting.failed_calls). The model reads what it always read.

A tool grpokit ships (grpokit/tools/environments.py: the Python tool, the calculator) raises only to answer the model's
call -- its code timed out, an operand was too long -- so its errors are the model's, not an author's: no fault.

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# Faults kept for the report, and places said on the console, at most: a tool failing in a thousand ways at once
# needs its first few read, not a thousand lines.
MAX_KEPT = 200
MAX_SAID = 5
SAID_CHARS = 300  # of what the model read, on the console (report.md shows it whole)
_GRPOKIT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Fault:
    """An exception a tool's own code raised: `kind` its type, `where` the tool file's line (`calc.py:12 in divide`)."""

    kind: str
    message: str
    where: str

    def text(self) -> str:
        """`ZeroDivisionError: division by zero (calc.py:12 in divide)`"""
        return f"{self.kind}: {self.message} ({self.where})" if self.message else f"{self.kind} ({self.where})"


def fault_of(err: BaseException, function: Callable, message: str) -> Fault | None:
    """The fault `err` is of the tool `function`: its deepest frame in the tool's own file (a library it called may
    have raised below it), else its deepest frame; None for a tool grpokit ships. `message` is its text as the model
    read it (grpokit.tools.tooltext.message, read within the call's bounds): `str(err)` is the tool's code, never run here.

    >>> def divide(a, b):
    ...     return a / b
    >>> try:
    ...     divide(1, 0)
    ... except ZeroDivisionError as err:
    ...     fault = fault_of(err, divide, str(err))
    >>> fault.kind, fault.where.endswith("in divide")
    ('ZeroDivisionError', True)
    """
    source = _source(function)
    if source is not None and _GRPOKIT in source.parents:
        return None
    frames = [(tb.tb_frame.f_code, tb.tb_lineno) for tb in _frames(err.__traceback__)]
    if not frames:
        return None
    own = [f for f in frames if source is not None and Path(f[0].co_filename).resolve() == source]
    code, line = (own or frames)[-1]
    return Fault(type(err).__name__, message[:500], f"{_shown_path(code.co_filename)}:{line} in {code.co_name}")


def _frames(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _source(function: Callable) -> Path | None:
    try:
        found = inspect.getsourcefile(inspect.unwrap(getattr(function, "__func__", function)))
    except TypeError:  # a builtin: no file of its own
        return None
    return Path(found).resolve() if found else None


def _shown_path(filename: str) -> str:
    """A file as the console names it: relative to the working folder when inside it."""
    path = Path(filename)
    try:
        return os.path.relpath(path) if Path.cwd() in path.resolve().parents else filename
    except ValueError:  # another drive (Windows)
        return filename


class Faults:
    """Faults by (tool name, the text the model read for the call); each new place said once through `say`.

    >>> said = []
    >>> faults = Faults(said.append)
    >>> fault = Fault("ZeroDivisionError", "division by zero", "calc.py:3 in divide")
    >>> faults.add("divide", "{'error': 'division by zero'}", fault); faults.add("divide", "{'error': 'x'}", fault)
    >>> faults.get("divide", "{'error': 'division by zero'}") == fault, len(said)
    (True, 1)
    """

    def __init__(self, say: Callable[[str], None]):
        self.say = say
        self.kept: dict[tuple[str, str], Fault] = {}
        self.said: set[str] = set()

    def add(self, tool: str, read: str, fault: Fault | None) -> None:
        if fault is None:
            return
        if len(self.kept) < MAX_KEPT:
            self.kept.setdefault((tool, read), fault)
        if fault.where not in self.said and len(self.said) < MAX_SAID:
            self.said.add(fault.where)
            shown = read if len(read) <= SAID_CHARS else read[:SAID_CHARS] + "..."  # the console line stays one line
            self.say(f"[grpokit] tool {tool} raised {fault.text()}; the model read {shown} as the call's result and "
                     "the run goes on. report.md lists each step's failed calls (a new place this raises is said "
                     "here once)")

    def get(self, tool: str, read: str) -> Fault | None:
        return self.kept.get((tool, read))
