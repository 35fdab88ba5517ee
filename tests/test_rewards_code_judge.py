"""code_tests' verdicts: nothing the graded code executes can change its own verdict.

The trainer side decides pass/fail from values; the graded side computes only the sub-expressions that
need its names and never sees the expected answer (rewards/_judge.py).
"""

import pytest

from rewards._sandbox import Limits, run
from rewards.code import CodeTests

FAST = Limits(time_s=0.5, memory_mb=256, processes=16, file_mb=4, output_kb=16)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"]
WRONG_ADD = "def add(a, b):\n    return 0\n"

# Each line, appended to a wrong `add`, tries to turn its failing asserts into passes.
ATTACKS = {
    # rewrites the harness's own report lines on their way out
    "patched_os_write": "import os; _w=os.write; os.write=lambda fd,b: _w(fd, b[:-2]+b'1\\n' if b.endswith(b' 0\\n') else b)",
    # the harness formats its verdict with int()
    "patched_int": "import builtins; builtins.int=lambda *a,**k: 1",
    # the harness compiles and runs each test with the builtins of the interpreter it shares with the code
    "patched_compile": "import builtins; _c=builtins.compile; builtins.compile=lambda s,f,m,*a,**k: _c('pass',f,m)",
    "patched_exec": "import builtins; builtins.exec=lambda *a,**k: None",
    # finds the reporter on the stack and reports every test passed, then leaves before any test runs
    "frame_walk": ("import sys, os\nf = sys._getframe()\nwhile f is not None and 'report' not in f.f_locals:\n"
                   "    f = f.f_back\nfor i in range(3):\n    f.f_locals['report']('test', f'{i} 1')\nos._exit(0)"),
    # the same through the garbage collector's list of live objects
    "gc_walk": ("import gc, os\nfor o in gc.get_objects():\n    if getattr(o, '__name__', '') == 'report' and callable(o):\n"
                "        for i in range(3):\n            o('test', f'{i} 1')\nos._exit(0)"),
    # a value that claims to equal anything
    "always_equal": "class _Any:\n    __eq__ = lambda s, o: True\nadd = lambda a, b: _Any()",
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_a_wrong_answer_scores_zero_whatever_else_the_code_runs(name):
    completion = f"```python\n{WRONG_ADD}{ATTACKS[name]}\n```"
    assert CodeTests(timeout=FAST.time_s)(completions=[completion], tests=[ADD_TESTS]) == [0.0]


def test_the_attacks_leave_a_right_answer_passing():
    # Each attack line is harmless in itself: with a right `add` before it the score stays what it was,
    # so the zeros above come from the verdicts, not from code that no longer runs.
    right = "def add(a, b):\n    return a + b\n"
    for name in ("patched_os_write", "patched_int", "always_equal"):
        code = right + ATTACKS[name] if name != "always_equal" else right
        assert run(code, ADD_TESTS, limits=FAST).passed == [True] * 3, name


def test_flooding_the_results_pipe_ends_the_candidate_early():
    # The results descriptor's number is on the command line; an endless writer to it is cut off once
    # the parent has read its cap, rather than being read until the wall-clock deadline.
    flood = ("import os, sys\nfd = int(sys.argv[1])\nchunk = b'x' * 65536\nwhile True:\n    os.write(fd, chunk)\n")
    out = run("def add(a, b):\n    return a + b\n" + flood, ADD_TESTS, limits=Limits(time_s=5.0))
    assert out.ended == "results" and out.passed == [False] * 3
