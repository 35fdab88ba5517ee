"""How a lab or bench script ends when the file door (grpokit.files) refuses: one line per problem, exit 2.

A refused output (a file of the user's, a link) or a malformed input (a results file, a trainer state) is a
`RecipeError` naming the file; a script's `main` wrapped in `one_line_exit` prints it as
`algorithms.py: bench/results/lab/README.md: ... exists and grpokit did not write it ...` and returns 2,
never a traceback.

>>> from grpokit.errors import Problem, RecipeError
>>> @one_line_exit
... def main(argv=None):
...     raise RecipeError([Problem("--out", "is a FIFO", file="/tmp/x.json")])
>>> import contextlib, io; err = io.StringIO()
>>> with contextlib.redirect_stderr(err): code = main()
>>> code, err.getvalue().endswith(": /tmp/x.json: --out: is a FIFO\\n")  # after the script's name
(2, True)
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

from grpokit.errors import EXIT_USAGE, RecipeError


def one_line_exit(main):
    """`main`, returning EXIT_USAGE (2) after one line per problem on stderr when it raises a `RecipeError`, and the
    shell's exit code (130 / 143) after one line when a signal stopped it (grpokit's `Stopped` from a training it
    ran, a KeyboardInterrupt itself, or Ctrl-C anywhere else)."""
    script = Path(inspect.getfile(main)).name

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RecipeError as err:
            for problem in err.problems:
                print(f"{script}: {problem.format()}", file=sys.stderr)
            return EXIT_USAGE
        except KeyboardInterrupt as stop:
            print(f"{script}: stopped by {stop or 'SIGINT (Ctrl-C)'}", file=sys.stderr)
            return getattr(stop, "exit_code", 130)

    return wrapped


def check_outputs(paths, key: str = "--out") -> None:
    """Before any work: every path the script will write is new or grpokit's own, and reached through no link; a
    `RecipeError` naming the others otherwise (the door's check, once for all of a script's outputs, so a refusal
    leaves none of them written)."""
    from grpokit.files import ownership

    ownership.refuse_unless_replaceable([Path(p) for p in paths], key=key)
