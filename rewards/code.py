"""Code rewards: run the completion's Python against the sample's assert tests, locally, in a sandbox.

The tests come from a dataset column holding a list of Python statements, MBPP's `test_list` form:
`["assert add(1, 2) == 3", ...]`. Each candidate runs in its own sandboxed process tree
(`grpokit.untrusted`: time, memory, process, file and output limits, no network, no secrets, a private
read-only view of the filesystem where the kernel allows it), a few at a time; inside it the tests and
the code run in two processes that exchange only plain data.
"""

from __future__ import annotations

import re
import sys
import warnings

from rewards import is_integer, is_number, register, text
from grpokit.untrusted import Limits, SandboxError, isolation, run_many

# A fence opens and closes at the start of a line; the info string (```python) is skipped.
_FENCED = re.compile(r"^[ \t]*```[^\n`]*\n(.*?)^[ \t]*```", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*```[^\n`]*\n(.*)\Z", re.S | re.M)
# Layers whose absence changes what a hostile completion can do; said once per process.
_EXPECTED = {"net", "pid", "readonly", "tmpfs"}
_warned = False
_checked: frozenset | None = None  # the layers this process's sandbox gets, probed once before any candidate runs


def extract_code(completion: str) -> str:
    """The last fenced code block; a final block cut off before its closing fence (a completion that ran
    out of tokens) counts up to the end; with no fence at all, the whole text.

    >>> extract_code("First try:\\n```python\\nx = 1\\n```\\nBetter:\\n```python\\nx = 2\\n```\\n")
    'x = 2\\n'
    >>> extract_code("def f():\\n    return 1")
    'def f():\\n    return 1'
    """
    blocks = list(_FENCED.finditer(completion))
    tail_from = blocks[-1].end() if blocks else 0
    unclosed = _OPEN_FENCE.search(completion, tail_from)
    if unclosed:
        return unclosed.group(1)
    if blocks:
        return blocks[-1].group(1)
    return completion


def _as_tests(value) -> list[str] | None:
    """A column value as a list of test statements; None (no tests) for a missing or empty value."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value] if value.strip() else None
    tests = [str(t) for t in value if t is not None and str(t).strip()]
    return tests or None


def _as_code(value) -> str:
    """A setup column value as code: a string as is, a list of lines (MBPP sanitized's `test_imports`) joined."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return "\n".join(str(line) for line in value if line is not None)
    return str(value)


@register("code_tests")
class CodeTests:
    """Fraction of the sample's assert tests the completion's Python passes, run in a local sandbox; None without tests.

    r = (tests passed) / (tests),  or 1[all pass] with `binary=True`

    The code is the completion's last fenced block (or the whole text when it has no fence, so prose
    fails to compile); a completion with no code scores 0.0, a sample whose `tests_column` is empty or
    None scores None (TRL skips it). The tests are Python statements (`assert ...`, assignments, loops,
    helper functions, try/except), run one by one after the code (and `setup_column`'s code when named:
    a string, or a list of lines such as MBPP sanitized's `test_imports`) as Python would run them; each
    counts on its own, so one failing or hanging test does not hide the others. The code never decides
    its own score: the setup and the tests run in a judge process that never runs the code, and the
    code runs in a process that never sees the tests or the setup's values; each use of the code's names
    crosses between them as plain data, keeping what a test can observe (a Counter stays a Counter, a
    namedtuple keeps its name and fields). grpokit/untrusted/judge.py says exactly what a test sees.
    `timeout` is seconds per test (its calls into the code together); `memory_mb` the address space;
    `workers` how many candidates run at once. What the sandbox holds, and where, is in
    grpokit/untrusted/jobs.py; on a machine that refuses namespaces the code can reach the network, and this
    reward warns once; where candidates would share the trainer's uid and process space (not root, no
    user namespaces) it refuses to run, saying how to fix the machine.

    >>> sq = "```python\\ndef sq(x):\\n    return x * x\\n```"
    >>> CodeTests()(completions=[sq, "I don't know.", sq],
    ...             tests=[["assert sq(3) == 9", "assert sq(-2) == 4", "assert sq(0) == 1"], ["assert sq(1) == 1"], []])
    [0.6666666666666666, 0.0, None]
    """

    def __init__(self, tests_column: str = "tests", setup_column: str | None = None, binary: bool = False,
                 timeout: float = 2.0, memory_mb: int = 512, workers: int = 4):
        if not isinstance(tests_column, str) or not tests_column:
            raise ValueError(f"tests_column must be a column name, got {tests_column!r}")
        if setup_column is not None and (not isinstance(setup_column, str) or not setup_column):
            raise ValueError(f"setup_column must be a column name or null, got {setup_column!r}")
        if not is_number(timeout) or not 0 < timeout <= 60:
            raise ValueError(f"timeout must be seconds per test in (0, 60], got {timeout!r}")
        if not is_integer(memory_mb) or memory_mb < 64:
            raise ValueError(f"memory_mb must be an integer >= 64 (python itself needs ~30 MB), got {memory_mb!r}")
        if not is_integer(workers) or workers < 1:
            raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
        self.tests_column, self.setup_column, self.binary = tests_column, setup_column, bool(binary)
        self.limits = Limits(time_s=float(timeout), memory_mb=memory_mb)
        self.workers = workers

    def __call__(self, completions, **kwargs) -> list[float | None]:
        columns = {self.tests_column: kwargs.get(self.tests_column)}
        if self.setup_column:
            columns[self.setup_column] = kwargs.get(self.setup_column)
        for name, values in columns.items():
            if values is None:
                present = sorted(k for k in kwargs if k not in ("prompts", "completion_ids", "trainer_state"))
                raise ValueError(f"code_tests needs the dataset column {name!r}, which is not among the columns "
                                 f"passed to rewards ({', '.join(present) or 'none'}); set args.tests_column / setup_column")
        tests = columns[self.tests_column]
        setups = columns[self.setup_column] if self.setup_column else [None] * len(completions)
        scores: list[float | None] = [None] * len(completions)
        jobs, where = [], []
        for i, completion in enumerate(completions):
            cases = _as_tests(tests[i])
            if cases is None:
                continue
            code = extract_code(text(completion))
            if not code.strip():
                scores[i] = 0.0
                continue
            jobs.append((code, cases, _as_code(setups[i])))
            where.append(i)
        if jobs:
            _check_isolation(self.limits)
        outcomes = run_many(jobs, self.limits, self.workers)
        for i, outcome in zip(where, outcomes):
            scores[i] = float(all(outcome.passed)) if self.binary else outcome.fraction
        return scores


def _check_isolation(limits: Limits) -> None:
    """Refuse to run candidates where one could kill or read the trainer; warn once about weaker layers."""
    global _checked
    if _checked is None:
        _checked = isolation(limits)
    if not unsafe(_checked):
        _warn_if_weak(_checked)
        return
    raise SandboxError(
        "code_tests: this machine gives candidate code neither a pid namespace nor a user id of its own "
        f"(sandbox layers: {', '.join(sorted(_checked))}), so a completion could kill the trainer (kill(-1)) "
        "or read its environment. Run as root (candidates then run as nobody), or allow user namespaces "
        "(sysctl kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu 24.04; docker: --security-opt "
        "seccomp=unconfined). See grpokit/untrusted/jobs.py."
    )


def unsafe(layers: frozenset) -> bool:
    """True when candidates would share the trainer's uid and pid space (no pid namespace, no uid drop)."""
    return "pid" not in layers and not any(x.startswith("uid=") and x != "uid=0" for x in layers)


def _warn_if_weak(layers: frozenset) -> None:
    global _warned
    missing = _EXPECTED - layers
    if _warned or not (missing or "stdlib-unreadable" in layers):
        return
    _warned = True
    if missing:
        warnings.warn(
            f"code_tests: this machine refused sandbox layer(s) {', '.join(sorted(missing))} (namespaces: "
            "a container's seccomp profile or user namespaces turned off); limits on time, memory, processes, "
            "files and output still hold, but candidate code can reach the network and write to world-writable "
            "folders. See grpokit/untrusted/jobs.py.",
            stacklevel=3,
        )
    if "stdlib-unreadable" in layers:
        warnings.warn(
            "code_tests: candidates run as an unprivileged user who cannot read this python's standard library "
            f"({sys.base_prefix}), and without a mount namespace it cannot be exposed to them: `import math` fails "
            "in every candidate. Install python where others can read it (e.g. /usr or /opt).",
            stacklevel=3,
        )
