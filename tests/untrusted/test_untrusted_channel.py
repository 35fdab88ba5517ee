"""The side of a caged worker that holds the channel to the trainer never runs a model's text or code
(grpokit/untrusted/keeper.py): whatever an answer a scorer evaluates, or a Python-tool cell, writes to every
descriptor it holds, it cannot move its deadline, stop the run, blame the data, answer outside its kind's range, keep
running past its reply, see another worker, take more memory than its bound through the processes it forks, or send
the trainer text it cannot take. A job too big for a worker is refused once, never resent.

Each class is written from the way it is done (a message forged in the worker's framing on every descriptor the
code holds), not from any one exploit.
"""

from __future__ import annotations

import pytest
from test_sandbox_pool import countdown_item

import rewards
from grpokit.untrusted import pool as untrusted
from rewards.tasks import SCORERS

# Python that writes `message` as a worker's message (multiprocessing's framing: a 4-byte big-endian length, then
# JSON) to every descriptor the process holds above stderr.
FORGE = """
import json, os, struct
def forge(message):
    data = json.dumps(message).encode()
    for name in os.listdir('/proc/self/fd'):
        try:
            os.write(int(name), struct.pack('!i', len(data)) + data)
        except OSError:
            pass
"""


# Python for a cell that forges its call's reply with everything the runner was told of the job it runs (read from
# the runner's own frames: the code shares its process), then goes on.
FORGE_REPLY = FORGE + """
import sys
def told():
    frame = sys._getframe()
    while frame is not None:
        seen = frame.f_locals.get('message')
        if isinstance(seen, dict) and 'job' in seen:
            return {k: v for k, v in seen.items() if k not in ('job', 'timeout', 'cpu_s')}
        frame = frame.f_back
    return {}
def forge_reply(output):
    forge({'result': {'output': output, 'failed': False}, **told()})
def job_pipe():
    frame = sys._getframe()
    while frame is not None:
        inbox = frame.f_locals.get('inbox')
        if inbox is not None and hasattr(inbox, 'fileno'):
            return inbox.fileno()
        frame = frame.f_back
"""


def answer_running(code: str) -> str:
    """A countdown answer that sympy's parse_expr (countdown's scorer) evaluates: it runs `code` (in a namespace of
    its own: parse_expr's locals are not its functions' globals)."""
    return f"<answer>__import__('builtins').exec({code!r}, {{}}) or 1</answer>"


# ---------------------------------------------------------------------------------------------------------------
# A scorer's answer speaking the worker's protocol


def test_an_answer_cannot_move_its_deadline():
    # Announcing "building the problem" over and over (trusted work, not charged to the answer) for 4 s.
    reward = rewards.build("task_score", workers=1, timeout=1.0)
    pool = untrusted.shared(SCORERS, 1)
    before = vars(pool.counts).copy()  # what the pool had counted
    hack = answer_running(FORGE + "import time\nt = time.time()\nwhile time.time() - t < 4:\n"
                                  "    forge({'build': 1})\n    time.sleep(0.05)\n")
    assert reward(completions=[hack], task_item=[countdown_item()]) == [0.0]
    assert pool.counts.invalid == before.get('invalid', 0) + 1  # a message its part never sends: the job ends there, scored 0.0


def test_an_answer_cannot_stop_the_run_or_blame_the_data():
    reward = rewards.build("task_score", workers=1)
    pool = untrusted.shared(SCORERS, 1)
    before = vars(pool.counts).copy()  # what the pool had counted
    hack = answer_running(FORGE + "forge({'fail': 'the dataset is broken'})\n")
    assert reward(completions=[hack], task_item=[countdown_item()]) == [0.0]  # no ValueError naming the data
    assert pool.counts.invalid == before.get('invalid', 0) + 1 and reward.fn.last.scorer_errors == 1


def test_an_answer_cannot_score_outside_its_kinds_range():
    reward = rewards.build("task_score", workers=1)
    pool = untrusted.shared(SCORERS, 1)
    before = vars(pool.counts).copy()  # what the pool had counted
    for forged in (5.0, "1.0", [1.0]):
        hack = answer_running(FORGE + f"forge({{'result': {forged!r}}})\n")
        assert reward(completions=[hack], task_item=[countdown_item()]) == [0.0]
    assert pool.counts.invalid == before.get('invalid', 0) + 3
    honest = reward(completions=["<answer>1 + 2</answer>"], task_item=[countdown_item()])
    assert honest[0] in (0.0, 0.01, 0.05, 1.0)  # the next completion is scored by a fresh worker


def test_a_job_that_kills_its_worker_is_not_run_again():
    reward = rewards.build("task_score", workers=1)
    pool = untrusted.shared(SCORERS, 1)
    before = vars(pool.counts).copy()  # what the pool had counted
    hack = answer_running("import os\nos._exit(3)\n")
    assert reward(completions=[hack], task_item=[countdown_item()]) == [0.0]
    assert pool.counts.crashes == before.get('crashes', 0) + 1  # once: a second try would have crashed a second worker


def test_a_job_over_the_message_bound_is_refused_once_and_never_sent():
    # NUL characters are six bytes each in JSON: 1.5 M of them (under the completion cap) is over a worker's bound.
    reward = rewards.build("task_score", workers=1)
    pool = untrusted.shared(SCORERS, 1)
    before = vars(pool.counts).copy()  # what the pool had counted
    assert reward(completions=["\0" * 1_500_000], task_item=[countdown_item()]) == [0.0]
    assert pool.counts.refused == before.get('refused', 0) + 1 and reward.fn.last.refused == 1


# ---------------------------------------------------------------------------------------------------------------
# A Python-tool cell speaking the worker's protocol, or changing how a call returns


def test_a_cell_that_replies_for_itself_and_runs_on_is_ended_and_the_model_told(tool):
    t = tool()
    t.python("kept = 1")
    out = t.python(FORGE_REPLY + "forge_reply('forged')\nwhile True:\n    pass\n")
    assert "the interpreter was restarted after this call" in out  # its loop did not run on
    assert "NameError" in t.python("kept")  # a fresh interpreter


def test_a_cell_that_replaces_how_calls_return_fails_a_call_not_the_run(tool):
    t = tool()
    t.python("import grpokit.untrusted.python_job as job\njob.run = lambda job: [1, 2]")
    with pytest.raises(RuntimeError, match="not a cell's output"):
        t.python("1 + 1")  # its reply is a list: a failed call, not a TypeError in the trainer
    assert t.python("1 + 1") == "2\n"  # a fresh interpreter
    assert t.calls == ["ok", "crash", "ok"]


def test_a_thread_a_call_started_does_not_outlive_it(tool):
    t = tool()
    out = t.python("kept = 1\nimport threading, time\n"
                   "threading.Thread(target=lambda: time.sleep(600), daemon=True).start()\nprint('started')")
    assert out.startswith("started\n") and "left 1 thread(s) running" in out
    assert "NameError" in t.python("kept")


# ---------------------------------------------------------------------------------------------------------------
# What a worker sees, and what its limits bound


def test_a_worker_sees_no_other_workers_process(tool):
    a, b = tool(), tool()
    a.python("import ctypes\nctypes.CDLL(None).prctl(15, b'rollout-a-mark', 0, 0, 0)")  # PR_SET_NAME
    seen = b.python("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"
                    "print([open(f'/proc/{p}/comm').read().strip() for p in os.listdir('/proc') if p.isdigit()])")
    assert seen.splitlines()[0] == "[1]"  # itself, pid 1 of its own namespace
    assert "rollout-a-mark" not in seen


def test_memory_bounds_every_process_a_call_forks(tool):
    # Six children fill 200 MB each and hold it: each is within its own address-space limit, so only a bound on the
    # call's processes together stops them all holding it at once (the kernel kills those past it).
    memory_mb, file_mb = 256, 16
    t = tool(memory_mb=memory_mb, processes=16, timeout_seconds=20.0)
    code = """
import os, select, time
with open('/proc/self/status') as f:
    warm = int([l for l in f if l.startswith('VmRSS')][0].split()[1]) // 1024
r, w = os.pipe()
children = {}
for k in range(6):
    pid = os.fork()
    if pid == 0:
        try:
            block = b'x' * (200 << 20)
            os.write(w, bytes([k]))
        finally:
            time.sleep(60)
    children[pid] = k
filled, alive, until = set(), dict(children), time.time() + 8
while time.time() < until:  # until every child still alive holds its 200 MB (the kernel kills those past the bound)
    if select.select([r], [], [], 0.05)[0]:
        filled |= set(os.read(r, 16))
    alive = {pid: k for pid, k in alive.items() if os.waitpid(pid, os.WNOHANG) == (0, 0)}
    if set(alive.values()) <= filled:
        break
held = len(set(alive.values()) & filled)
print(warm, held)
"""
    try:
        warm, held = map(int, t.python(code).split())
    except RuntimeError:  # the kernel's OOM killer chose the interpreter itself: the bound held
        return
    assert held * 200 <= warm + memory_mb + file_mb, (warm, held)


# ---------------------------------------------------------------------------------------------------------------
# What the model reads


def test_undecodable_output_reaches_the_model_as_valid_text(tool):
    out = tool().python("print(b'caf\\xe9 \\xff'.decode('utf-8', 'surrogateescape'))")
    assert out.encode("utf-8") and out == "caf\ufffd \ufffd\n"


def test_multibyte_output_at_the_character_limit_fits_and_keeps_the_interpreter(tool):
    t = tool(max_output_chars=100_000)
    t.python("kept = 1")
    out = t.python("print('\\U0001F600' * 100_000, end='')")  # twelve bytes each in JSON
    assert out == "\U0001F600" * 100_000
    assert t.python("kept") == "1\n"


# ---------------------------------------------------------------------------------------------------------------
# A reply is bound to its job: by the number its keeper gave the job, never by the order replies arrive in


def test_a_cell_that_forges_its_reply_and_returns_never_answers_the_next_call(tool):
    t = tool()
    out = t.python(FORGE_REPLY + "forge_reply('forged')\nprint('its real output')")
    assert "the interpreter was restarted after this call" in out  # it spoke twice: ended, and the model told
    assert t.python("1 + 1") == "2\n"  # its real reply is never read as this call's


@pytest.mark.parametrize("wait", [
    "r, w = os.pipe()\nos.read(r, 1)",                                  # a pipe of its own
    "r, w = os.pipe()\nos.dup2(r, job_pipe())\nos.read(job_pipe(), 1)",  # ... under the job pipe's number
], ids=["own pipe", "own pipe, job pipe's number"])
def test_a_cell_blocked_on_a_pipe_of_its_own_is_not_back_waiting_for_its_job(tool, wait):
    t = tool()
    out = t.python(FORGE_REPLY + f"forge_reply('forged')\nimport os\n{wait}")
    assert "the interpreter was restarted after this call" in out
    assert t.python("1 + 1") == "2\n"


@pytest.mark.parametrize("arm", ["signal.setitimer(signal.ITIMER_REAL, 0.3)", "signal.alarm(1)"])
def test_a_timer_or_handler_a_call_set_never_fires_during_the_next(tool, arm):
    t = tool()
    t.python(f"import signal\ndef late(*_):\n    raise RuntimeError('from an earlier call')\n"
             f"signal.signal(signal.SIGALRM, late)\n{arm}\nkept = 1")
    out = t.python("import time\ntime.sleep(1.2)\nprint('quiet', kept)")
    assert out == "quiet 1\n"  # nothing fired, and the interpreter (its names) was kept


def test_an_interpreter_replaced_for_any_reason_is_said_in_the_next_result(tool):
    from grpokit.tools.toolguard import Limits, ToolLimitError, bounded_function

    t = tool(timeout_seconds=5.0)
    t.python("kept = 1")
    with pytest.raises(ToolLimitError):  # the tools section's limit cuts the call from outside the interpreter
        bounded_function(t.python, Limits(0.3, 1000))(code="import time\ntime.sleep(3)")
    out = t.python("1 + 1")
    assert out.startswith("2\n") and "names defined before are gone" in out
    # After a taint (a message only a scorer's audit hook sends): the worker is replaced, and the next call says so.
    t.python(FORGE_REPLY + "kept = 1\nforge({'taint': 'x', **told()})")
    out = t.python("1 + 1")
    assert out.startswith("2\n") and "names defined before are gone" in out
