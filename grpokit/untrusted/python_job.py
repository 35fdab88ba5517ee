"""A cell of the Python tool, as a kept worker of the untrusted-work pool runs it (`sandbox.pool.Session`; imported
in the cage): the model's code, run as a notebook runs a cell.

One worker serves one rollout's calls in turn and nothing else, so its module globals are the notebook's namespace:
a later cell sees the names, imports and functions an earlier one defined. A job is {"code": str, "max_chars": int};
the result is {"output": text, "failed": bool}: what the cell printed (stdout and stderr interleaved, as a terminal
shows them), then, as a notebook shows it, the repr of a last line that is an expression with a value, or, when the
cell raised, the exception's last lines (the frames of the model's own code, without this module's). The printed
text is cut to `max_chars` with a note saying how much was left out, so the model reads the start and knows it was
cut; the traceback's end follows it whole (at most TRACEBACK_CHARS).

Every cell runs model code: the pool's audit hook (which taints a scorer's worker) is off for this kind (`WATCH`);
the worker is the rollout's alone, ends with it, and the cage's limits bound each cell (sandbox/pool.py).
"""

from __future__ import annotations

import ast
import sys
import traceback

from grpokit.untrusted.candidate import Captured
from grpokit.untrusted.keeper import valid_text

WATCH = False  # every job here is the model's code by design: no taint to report, the worker dies with its rollout
MAX_CHARS = 100_000  # the most output a call may ask for (the keeper's bound on a reply is sized from it)
TRACEBACK_LINES = 6  # the end of a traceback is what says what went wrong; the model reads no more than these
TRACEBACK_CHARS = 600  # ... and no more than these of them (the end: the exception's own line)
CUT_NOTE = "\n[output cut: {} more characters]\n"
# What a result may hold beyond `max_chars` of output: the note that it was cut, then the traceback's end.
EXTRA_CHARS = len(CUT_NOTE.format(10 ** 9)) + TRACEBACK_CHARS
_FILE = "<cell>"
_namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}


def warm() -> None:
    """Import what a model's arithmetic and algebra reaches for, once in the zygote (each worker forks with them
    loaded; sympy's import alone is ~1 s of CPU), so a cell's `import sympy` costs no time of its own."""
    import collections  # noqa: F401
    import decimal  # noqa: F401
    import fractions  # noqa: F401
    import functools  # noqa: F401
    import itertools  # noqa: F401
    import math  # noqa: F401
    import statistics  # noqa: F401

    for name in ("sympy", "numpy"):
        try:
            __import__(name)
        except ImportError:  # not installed here: a cell importing it gets the ImportError, as on any Python
            pass


def _chars(job: dict) -> int:
    return max(0, min(int(job["max_chars"]), MAX_CHARS))


def run(job: dict) -> dict:
    code, limit = str(job["code"]), _chars(job)
    out = Captured(limit)
    ending = ""
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        tree = ast.parse(code, _FILE)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, _FILE, "exec"), _namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), _FILE, "eval"), _namespace)
            if value is not None:
                print(repr(value))
    except BaseException as err:  # noqa: BLE001 - whatever the cell raised (SystemExit, KeyboardInterrupt too) is its output
        ending = _last_lines(err)
    finally:
        sys.stdout, sys.stderr = saved
    text = out.text()
    if out.dropped:
        text += CUT_NOTE.format(out.dropped)
    elif ending and text and not text.endswith("\n"):
        text += "\n"
    return {"output": valid_text(text + ending), "failed": bool(ending)}


def check(job: dict, value) -> dict:
    """The keeper's check of a result: {"output": text the model can read, within the call's bound; "failed"}."""
    if not (isinstance(value, dict) and set(value) == {"output", "failed"} and isinstance(value["output"], str)
            and isinstance(value["failed"], bool)):
        raise ValueError(f"a cell's result is {{output: text, failed: true or false}}, got {type(value).__name__}")
    most = _chars(job) + EXTRA_CHARS
    if len(value["output"]) > most:
        raise ValueError(f"{len(value['output'])} characters of output, over the {most} a call returns at most")
    return {"output": valid_text(value["output"]), "failed": value["failed"]}


def _last_lines(err: BaseException) -> str:
    """The traceback as Python prints it from the cell's first frame on (what ran before it -- this module, the parser
    a SyntaxError comes from -- is not the model's), and only its last TRACEBACK_LINES lines."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != _FILE:
        tb = tb.tb_next  # None when no frame is the cell's: a SyntaxError shows only its own lines
    try:
        lines = "".join(traceback.format_exception(type(err), err, tb)).splitlines()
    except BaseException:  # noqa: BLE001 - an exception whose str() raises
        lines = [type(err).__name__]
    return ("\n".join(lines[-TRACEBACK_LINES:]) + "\n")[-TRACEBACK_CHARS:]
