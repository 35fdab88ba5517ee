"""Environments shipped with grpokit, for recipes' `tools.environment` (TRL's `environment_factory`).

`PythonTool`: a Python interpreter, caged, one notebook per rollout (tool-integrated reasoning); below.

`Calculator`: exact integer arithmetic the model calls as tools, for problems with numbers too long to work
out in a small model's head (reasoning-gym's `products`: "Solve the following multiplication: 4821 * 637").
The recipes that use it: recipes/smollm2-135m/calculator.yaml (offline) and recipes/qwen2.5-1.5b/calculator.yaml.
How to write one of your own: docs/tools.md.
"""

from __future__ import annotations

from grpokit.untrusted.pool import Kind, shared
from grpokit.untrusted.python_job import EXTRA_CHARS
from grpokit.untrusted.session import Session

# Operands past this many digits are refused (the call fails, which TRL counts): a model asking for a
# thousand-digit product is not doing the task, and its result would crowd the completion budget.
MAX_DIGITS = 30


class Calculator:
    """Integer add, subtract and multiply as tools; one instance per rollout, reset with the dataset row."""

    def __init__(self, max_digits: int = MAX_DIGITS):
        self.max_digits = max_digits
        self.calls: list[tuple[str, int, int]] = []

    def reset(self, **row) -> None:
        """Start a rollout: no calls yet. The row's question is already in the prompt, so nothing is added to it."""
        self.calls = []

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self._record("add", a, b)
        return a + b

    def subtract(self, a: int, b: int) -> int:
        """Subtract the second integer from the first.

        Args:
            a: The integer to subtract from.
            b: The integer to subtract.
        """
        self._record("subtract", a, b)
        return a - b

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self._record("multiply", a, b)
        return a * b

    def _record(self, name: str, a, b) -> None:
        """Refuse what the schema does not allow (TRL reports the error to the model and counts a failed call)."""
        for value in (a, b):
            if not isinstance(value, int) or isinstance(value, bool):  # "12" or 1.5: the schema says integer
                raise TypeError(f"{name} takes integers, got {type(value).__name__} {value!r}")
            if len(str(abs(value))) > self.max_digits:
                raise ValueError(f"{name}: operands are limited to {self.max_digits} digits")
        self.calls.append((name, a, b))


# The Python tool's limits (`tools.environment_args`): defaults, and the bounds --check holds a recipe's values to.
PYTHON_LIMITS = {  # name: (default, lowest, highest, what it bounds)
    "timeout_seconds": (5.0, 0.1, 60.0, "wall time of one call, from the code's start"),
    "memory_mb": (512, 64, 8192, "memory a call may add to the interpreter's (MemoryError past it)"),
    "max_output_chars": (1000, 200, 100_000, "characters of printed output the model reads (the rest is cut, and "
                                             "said to be)"),
    "processes": (8, 1, 64, "processes and threads the code may run at once"),
}


class PythonTool:
    """A Python interpreter as the model's tool: tool-integrated reasoning (the model writes code, reads what it
    printed, goes on), one notebook per rollout.

    The tool `python(code)` runs the code in a caged worker of grpokit's untrusted-work pool (no network, a new root
    showing only Python and its libraries read-only, a private /tmp of its own, an unprivileged user, seccomp; see
    grpokit/untrusted/pool.py) and returns what it printed, stdout and stderr, then the value of a last
    line that is an expression, or the traceback's last lines when it raised. Later calls of one rollout see what
    earlier calls defined -- variables, imports, functions -- as cells of a notebook do: the rollout keeps one worker
    process, started warm from the cage on its first call (sympy and numpy already imported) and ended at the next
    `reset`. A call past `timeout_seconds`, or one that kills its interpreter (past `memory_mb` outside Python's own
    MemoryError, a crash), fails: the model reads a one-line error saying so and that earlier definitions are gone,
    and the next call starts a fresh interpreter. After every call, whatever the code started is killed.

    Limits (recipe: `tools.environment_args`, checked at --check against PYTHON_LIMITS and the `tools` section's own
    limits): `timeout_seconds`, `memory_mb`, `max_output_chars`, `processes`.
    """

    def __init__(self, timeout_seconds: float = 5.0, memory_mb: int = 512, max_output_chars: int = 1000,
                 processes: int = 8):
        self.timeout_seconds, self.max_output_chars = float(timeout_seconds), int(max_output_chars)
        self._kind = _python_kind(int(memory_mb), int(processes))
        self._session = None
        # each call's outcome this rollout: "ok", "error" (the code raised), "timeout", "crash"
        self.calls: list[str] = []

    @classmethod
    def argument_problems(cls, args: dict, tools: dict) -> list[tuple[str, str, str]]:
        """Each limit of `args` out of its bounds, or not fitting the `tools` section's limits (a per-call time
        limit at least the section's `timeout_seconds`, whose cut would come first; output that cannot fit the
        section's `max_result_chars`): (key, what is wrong, what is allowed). Called by --check.

        >>> [(key, allowed) for key, _, allowed in PythonTool.argument_problems(
        ...     {"timeout_seconds": 0}, {"timeout_seconds": 10, "max_result_chars": 10000})]
        [('timeout_seconds', 'a number from 0.1 to 60')]
        """
        found = []
        for key, value in args.items():
            if key not in PYTHON_LIMITS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # unknown names and wrong types are --check's own (the constructor's signature, annotations)
            _, low, high, what = PYTHON_LIMITS[key]
            if not low <= value <= high:
                kind = "a number" if isinstance(low, float) else "an integer"
                found.append((key, f"is out of range for {what}", f"{kind} from {low:g} to {high:g}"))
        timeout, chars = (args.get(k, PYTHON_LIMITS[k][0]) for k in ("timeout_seconds", "max_output_chars"))
        if isinstance(timeout, (int, float)) and timeout >= tools["timeout_seconds"]:
            found.append(("timeout_seconds", f"is not below tools.timeout_seconds ({tools['timeout_seconds']:g}), "
                                             "which would cut the call first, without this tool's message",
                          f"less than {tools['timeout_seconds']:g}"))
        room = tools["max_result_chars"] - EXTRA_CHARS
        if isinstance(chars, int) and chars > room:
            found.append(("max_output_chars", f"cannot fit tools.max_result_chars ({tools['max_result_chars']}) with "
                                              "the note saying the output was cut and a traceback's end",
                          f"at most {room}"))
        return found

    def reset(self, **row) -> None:
        """Start a rollout: a fresh interpreter (started on the first call), no calls yet."""
        self._close()
        self.calls = []

    def python(self, code: str) -> str:
        """Run Python code and return what it printed. Names defined in earlier calls stay defined.

        Args:
            code: Python source; print() what you need to see.
        """
        if not isinstance(code, str):
            self.calls.append("error")
            raise TypeError(f"python takes the code as a string, got {type(code).__name__}")
        if self._session is None:
            self._session = Session(_pool(self._kind))
        reply = self._session.run({"code": code, "max_chars": self.max_output_chars}, self.timeout_seconds)
        if reply.how == "result":
            self.calls.append("error" if reply.value["failed"] else "ok")
            output = reply.value["output"] or "(no output)"
            if reply.ended:  # it left something running: ended with the interpreter, and the model is told
                output += (f"\n[the interpreter was restarted after this call: {reply.ended}; names defined before "
                           "are gone]")
            if reply.fresh:  # the interpreter before was ended where no result said so: said now
                output += f"\n[a fresh interpreter ran this call: {reply.fresh}; names defined before are gone]"
            return output
        self.calls.append("timeout" if reply.how == "timeout" else "crash")
        if reply.how == "timeout":
            raise TimeoutError(f"the code ran past {self.timeout_seconds:g} s and was stopped; the interpreter "
                               "restarted, so names defined before are gone")
        if reply.how == "refused":
            raise ValueError(f"the code was not run: {reply.value}")
        if reply.how == "invalid":
            raise RuntimeError("the interpreter's answer was not a cell's output (the code replaced how a call "
                               "returns, or answered out of turn); it restarted, so names defined before are gone")
        raise RuntimeError("the interpreter stopped (out of memory, or killed); it restarted, so names defined before "
                           "are gone")

    def _close(self) -> None:
        """End this rollout's interpreter, if one started (not a tool: TRL makes every public method one)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def __del__(self):
        try:
            self._close()
        except Exception:  # noqa: BLE001 - at interpreter exit the pool may be gone first; its cage dies with it
            pass


def _python_kind(memory_mb: int, processes: int):
    return Kind("grpokit.untrusted.python_job", "Python tool", "import sympy", memory_mb=memory_mb,
                processes=processes, scratch=True)


def _pool(kind):
    """The process-wide pool of this kind: its cage is shared by every rollout's interpreter; no workers of its own."""
    return shared(kind, 0)
