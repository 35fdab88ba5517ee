"""code_tests: the local code verifier -- extraction, scoring, and a hostile corpus it must survive."""

import contextlib
import ctypes
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import rewards
from rewards import code as code_reward
from grpokit.untrusted import CHILD, Limits, SandboxError, isolation, run, run_many
from rewards.code import CodeTests, extract_code

ROOT = Path(__file__).resolve().parents[2]
CODE20 = [json.loads(line) for line in (ROOT / "grpokit/assets/code20.jsonl").read_text().splitlines()]
FAST = Limits(time_s=0.3, memory_mb=256, processes=16, file_mb=4, output_kb=16)  # tight: the whole file stays quick
LAYERS = isolation(FAST)
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


# (completion, expected code)
EXTRACT = [
    ("```python\nx = 1\n```", "x = 1\n"),  # one fenced block
    ("a\n```python\nx = 1\n```\nb\n```py\nx = 2\n```\nc", "x = 2\n"),  # the last block wins
    ("```\nx = 3\n```", "x = 3\n"),  # no language tag
    ("```python\nx = 1\n```\nthen\n```python\nx = 2", "x = 2"),  # a last block cut off by the token limit
    ("def f():\n    return 1", "def f():\n    return 1"),  # no fence: the whole text
    ("", ""),  # nothing
]


@pytest.mark.parametrize("completion, expected", EXTRACT)
def test_extract_code(completion, expected):
    assert extract_code(completion) == expected


def test_reference_solutions_score_one_and_broken_ones_less():
    reward = CodeTests(timeout=FAST.time_s)
    tests = [row["tests"] for row in CODE20]
    good = [f"Here it is:\n```python\n{row['solution']}```" for row in CODE20]
    # The reference with its function replaced by one returning None: asserts fail (one expects None).
    broken = [f"```python\n{row['solution']}\n{_name(row)} = lambda *a, **k: None\n```" for row in CODE20]
    assert reward(completions=good, tests=tests) == [1.0] * 20
    scores = reward(completions=broken, tests=tests)
    assert all(s < 1.0 for s in scores) and sum(scores) == 1 / 3  # second_largest([7, 7]) is None holds


def _name(row) -> str:
    return row["solution"].split("def ", 1)[1].split("(", 1)[0]


def test_each_assert_counts_on_its_own():
    tests = ["assert is_prime(1) == False", "assert is_prime(97) == True", "assert is_prime(91) == False"]
    odd = "def is_prime(n):\n    return n % 2 == 1\n"  # right only for 97
    assert CodeTests()(completions=[odd], tests=[tests]) == [1 / 3]
    assert CodeTests(binary=True)(completions=[odd], tests=[tests]) == [0.0]
    # A test that hangs fails alone; the ones after it still run.
    hang = "def f(x):\n    while x == 0:\n        pass\n    return x\n"
    assert run(hang, ["assert f(0) == 0", "assert f(1) == 1", "assert f(2) == 2"], limits=FAST).passed == [False, True, True]


def test_samples_without_tests_are_none_and_completions_without_code_zero():
    conv = [{"role": "assistant", "content": "```python\ndef f():\n    return 1\n```"}]
    out = CodeTests()(
        completions=[conv, "   ", "def f(): return 1", "def f(): return 1"],
        tests=[["assert f() == 1"], ["assert f() == 1"], [], None],
    )
    assert out == [1.0, 0.0, None, None]  # conversational format; blank completion; no tests; no tests


def test_column_names_and_setup_code_come_from_the_args():
    reward = CodeTests(tests_column="test_list", setup_column="test_setup_code")
    out = reward(completions=["def g():\n    return K + 1"], test_list=[["assert g() == K + 1"]],
                 test_setup_code=["K = 2\nclass Box:\n    pass"])
    assert out == [0.0]  # the setup's values are the tests', never the code's (its imports and classes are)
    # MBPP sanitized keeps its setup as a list of import lines (`test_imports`).
    imports = CodeTests(tests_column="test_list", setup_column="test_imports")
    out = imports(completions=["def g():\n    return floor(2.5)"], test_list=[["assert g() == 2"]],
                  test_imports=[["import math", "from math import floor"]])
    assert out == [1.0]
    with pytest.raises(ValueError, match="needs the dataset column 'test_list'.*answer"):
        reward(completions=["x"], answer=["1"])


@pytest.mark.parametrize("args", [{"timeout": 0}, {"memory_mb": 8}, {"workers": 0}, {"tests_column": ""}])
def test_bad_arguments_name_the_argument(args):
    with pytest.raises(rewards.RewardError, match=next(iter(args))):
        rewards.build("code_tests", **args)


# ----------------------------------------------------------------------------------------------------
# The hostile corpus: each entry's tests pass only if the attack worked; each must score 0, return in
# bounded time, leave the host as it was, and not disturb an honest candidate run alongside it.

SECRET = "grpokit-test-secret-" + uuid.uuid4().hex
OUTSIDE = f"/var/tmp/grpokit-code-canary-{uuid.uuid4().hex}"  # world-writable parent: only the sandbox guards it
# World-writable folders the code tries to write in: names of this process's own, since the probe test below writes
# them for real, and another worker checking for them at that moment would see a write that was never the sandbox's.
EVIL = tuple(f"{folder}/grpokit-evil-{uuid.uuid4().hex}" for folder in ("/var/tmp", "/dev/shm"))

HOSTILE = {
    # never returns; the second one also swallows the per-test timer
    "infinite_loop": ("def f():\n    return 1\nwhile True:\n    pass\n", ["assert f() == 1"]),
    "loop_ignoring_timer": ("def f():\n    return 1\nwhile True:\n    try:\n        while True:\n            pass\n"
                            "    except BaseException:\n        pass\n", ["assert f() == 1"]),
    # forks until refused and keeps the children alive; passes if it got past the process limit
    "fork_bomb": ("import os, time\ndef f():\n    n = 0\n    try:\n        while n < 500:\n            if os.fork() == 0:\n"
                  "                time.sleep(30)\n                os._exit(0)\n            n += 1\n    except OSError:\n"
                  "        pass\n    return n\n", ["assert f() >= 500"]),
    "fork_bomb_spinning": ("import os\ndef f():\n    return 1\nwhile True:\n    try:\n        os.fork()\n"
                           "    except OSError:\n        pass\n", ["assert f() == 1"]),
    # 4 GiB, which a lazily zeroed bytearray would get at once without the address-space limit
    "memory_bomb": ("big = bytearray(4 << 30)\ndef f():\n    return len(big)\n", ["assert f() == 4 << 30"]),
    "write_outside": ("import os\ndef f():\n    hits = 0\n"
                      f"    for p in ({OUTSIDE + '/evil'!r}, {EVIL[0]!r}, {EVIL[1]!r}):\n"
                      "        try:\n            open(p, 'w').write('x')\n            hits += 1\n        except OSError:\n"
                      "            pass\n    return hits\n", ["assert f() > 0"]),
    "delete_files": ("import os, shutil\ndef f():\n"
                     f"    try:\n        os.remove({OUTSIDE + '/canary'!r})\n        return True\n    except OSError:\n"
                     f"        shutil.rmtree({OUTSIDE!r}, ignore_errors=True)\n        return False\n", ["assert f()"]),
    "read_secrets": ("import os, glob\ndef f():\n    seen = ' '.join(os.environ.values())\n"
                     "    for p in glob.glob('/proc/*/environ'):\n        try:\n"
                     "            seen += open(p, 'rb').read().decode(errors='ignore')\n        except OSError:\n"
                     "            pass\n    return seen\n", [f"assert {SECRET!r} in f()"]),
    "socket": ("import socket\ndef f(port):\n    socket.create_connection(('127.0.0.1', port), timeout=0.2).close()\n"
               "    return True\n", ["assert f(PORT)"]),  # PORT: filled in with a port listening in this process
    "print_1gb": ("import sys\nfor _ in range(1024):\n    sys.stdout.write('x' * (1 << 20))\ndef f():\n    return 1\n",
                  ["assert f() == 1"]),
    "os_exit": ("import os\nos._exit(0)\n", ["assert True"]),  # an exit status is never taken for a pass
    "kill_parent": ("import os\nfor target in (os.getppid(), -1, 0):\n    try:\n        os.kill(target, 9)\n"
                    "    except OSError:\n        pass\n", ["assert True"]),
    # writes what a result line might look like to every descriptor it has, then leaves
    "forge_results": ("import os\nfor fd in range(64):\n    try:\n        os.write(fd, b'test 0 1\\nload 1\\n')\n"
                      "    except OSError:\n        pass\nprint('PASS')\nos._exit(0)\n", ["assert False"]),
}


# Why each fails, from the line the sandbox prints or, for a value the trainer judged, the judge's note:
# a probe must fail on the layer it tests, not on an import or a typo (the ones not listed leave no line:
# they end or are ended before one is printed).
REASON = {
    "infinite_loop": b"<completion>: Timeout", "fork_bomb": b"<test 0>: AssertionError",
    "fork_bomb_spinning": b"<completion>: Timeout", "memory_bomb": b"<completion>: MemoryError",
    "write_outside": b"<test 0>: AssertionError", "delete_files": b"<test 0>: AssertionError",
    "read_secrets": b"<test 0>: AssertionError", "socket": b"<test 0>: OSError: [Errno 101] Network is unreachable",
}


@pytest.fixture
def outside():
    """A canary in a world-writable directory outside any sandbox: nothing but the sandbox keeps it alive."""
    os.makedirs(OUTSIDE)
    os.chmod(OUTSIDE, 0o777)
    canary = Path(OUTSIDE, "canary")
    canary.write_text("alive")
    canary.chmod(0o666)
    yield canary
    shutil.rmtree(OUTSIDE, ignore_errors=True)
    for p in EVIL:
        Path(p).unlink(missing_ok=True)


def _children() -> dict:
    """This process's children: pid -> whether it still runs (a zombie has ended and waits to be reaped)."""
    ours, found = str(os.getpid()), {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:
            continue  # ended while we looked
        state, parent = text[text.rindex(")") + 2:].split()[:2]  # after "pid (name)"
        if parent == ours:
            found[int(stat.split("/")[2])] = state != "Z"
    return found


def _runs_sandbox(pid: int) -> bool:
    """Whether process `pid` runs this checkout's sandbox (a zombie's command line reads empty)."""
    try:
        return CHILD.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@contextlib.contextmanager
def _adopting_orphans():
    """Make this process a subreaper while inside: a process one of our jobs leaves running after its parents are
    gone is reparented to us (the nearest subreaper ancestor), never to init, so `_leftovers` sees it and nothing
    else -- not another worker's jobs, not a job another program runs beside us. On the way out whatever was adopted
    is killed and reaped: a leak fails its own test, not the ones after it."""
    libc = ctypes.CDLL(None, use_errno=True)
    before = set(_children())
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        for pid in set(_children()) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _leftovers() -> set:
    """Sandbox processes our jobs left running, inside `_adopting_orphans`: `run` reaps each job's first process before
    it returns and everything else of the job runs below that one, so a child of ours running the sandbox now is a
    process that outlived its job (adopted by us, the subreaper, when its parents ended)."""
    return {pid for pid, running in _children().items() if running and _runs_sandbox(pid)}


def test_the_leak_check_counts_only_this_tests_jobs():
    """Another job running beside this test (another worker's trainer, a subprocess that scores code) is not a leak
    of this test's jobs, whatever its place in the process tree."""
    probe = ("from grpokit.untrusted import jobs\ncollect = jobs._collect\n"
             "def started(proc, *rest):\n    print(proc.pid, flush=True)\n    return collect(proc, *rest)\n"
             "jobs._collect = started\n"
             "jobs.run('while True:\\n    pass', [], limits=jobs.Limits(time_s=2))\n")
    other = subprocess.Popen([sys.executable, "-c", probe], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        sandbox = int(other.stdout.readline())  # its sandbox's first process exists now
        with _adopting_orphans():
            assert _leftovers() == set()
    finally:
        with contextlib.suppress(ProcessLookupError, NameError):
            os.kill(sandbox, signal.SIGTERM)  # asked to stop, it ends its job whole; the other program then returns
        other.wait(timeout=60)


def test_the_leak_check_sees_a_process_that_outlives_its_job():
    # Without a pid namespace or a cgroup nothing ends a process that left the job's process group (documented in
    # grpokit/untrusted/jobs.py): the check must see it, or a leak under the full layers would pass unseen too.
    escape = ("import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n        os.setsid()\n"
              "        time.sleep(120)\n    os._exit(0)\nos.wait()\ndef f():\n    return 1\n")
    bare = Limits(time_s=FAST.time_s, namespaces=False, cgroup=False)
    with _adopting_orphans():
        assert run(escape, ["assert f() == 1"], limits=bare).passed == [True]
        left = _leftovers()
        assert len(left) == 1, left  # the grandchild, orphaned before the code finished loading
    assert not any(pid in _children() for pid in left)  # killed and reaped on the way out


def _needs(name: str) -> None:
    """Skip what this machine's layers cannot stop (isolation() says which hold; the docs say what each gives)."""
    other_uid = any(x.startswith("uid=") and x != "uid=0" for x in LAYERS)  # root dropped to nobody
    if name == "socket" and "net" not in LAYERS:
        pytest.skip("no network namespace here: candidate code can reach the network (documented)")
    if name in ("write_outside", "delete_files") and not ("readonly" in LAYERS or other_uid):
        pytest.skip("neither read-only mounts nor a uid drop here: the code can write what this user can (documented)")
    if name in ("kill_parent", "read_secrets") and not ("pid" in LAYERS or other_uid):
        pytest.skip("neither a pid namespace nor a uid drop here: the code can signal and read this user's processes")


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_code_scores_zero_and_harms_nothing(name, outside, monkeypatch):
    _needs(name)
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", SECRET)  # in this process's environment, which the code must not see
    code, tests = HOSTILE[name]
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    tests = [t.replace("PORT", str(listener.getsockname()[1])) for t in tests]
    honest = CODE20[0]
    with _adopting_orphans():
        outcomes = run_many([(code, tests, ""), (honest["solution"], honest["tests"], "")], FAST, workers=2)
        leftovers = _leftovers()
    assert outcomes[0].passed == [False] * len(tests), outcomes[0]
    why = outcomes[0].output + "\n".join(outcomes[0].notes).encode()  # the sandbox's lines, then the judge's
    assert REASON.get(name, b"") in why, why[:300]
    assert outcomes[1].passed == [True] * 3, "a hostile candidate disturbed the honest one next to it"
    assert not leftovers, "a sandbox process outlived its job"
    assert outside.read_text() == "alive"
    assert sorted(os.listdir(OUTSIDE)) == ["canary"]
    assert not any(Path(p).exists() for p in EVIL)
    with pytest.raises(BlockingIOError):  # nobody connected
        listener.accept()
    listener.close()


def test_the_hostile_probes_work_outside_the_sandbox(outside, monkeypatch):
    # Without this, a probe that can never succeed would make its hostile test pass vacuously.
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", SECRET)
    listener = socket.create_server(("127.0.0.1", 0))
    for name in ("read_secrets", "write_outside", "delete_files", "socket"):
        namespace = {"PORT": listener.getsockname()[1]}
        exec(HOSTILE[name][0], namespace)
        exec(HOSTILE[name][1][0], namespace)
    listener.close()


def test_too_much_output_ends_the_candidate():
    out = run(*HOSTILE["print_1gb"], limits=FAST)
    assert out.ended == "output" and len(out.output) <= 4096


def test_this_machine_holds_every_layer():
    # What the docs claim for this machine (root, Linux): measured here, not assumed. Elsewhere the
    # missing layers are reported by isolation() and warned about once by the reward.
    if os.geteuid() != 0:
        pytest.skip("the claims are for running as root")
    assert {"net", "pid", "mountns", "newroot", "readonly", "tmpfs", "proc", "noshm", "nomemfd", "userns"} <= LAYERS
    assert any(x.startswith("uid=") and x != "uid=0" for x in LAYERS)  # nobody: RLIMIT_NPROC applies


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK),
                    reason="needs root (to start as nobody), setpriv and a system python3")
def test_started_by_an_unprivileged_user_it_uses_a_user_namespace():
    # A trainer that is not root: the same layers inside a user namespace, capabilities dropped.
    from helpers import readable_by_anyone

    script = (f"import sys; sys.path.insert(0, {str(readable_by_anyone())!r})\n"
              "from grpokit.untrusted import Limits, run_many\n"
              "lim = Limits(time_s=0.3)\n"
              f"jobs = [({HOSTILE['fork_bomb'][0]!r}, {HOSTILE['fork_bomb'][1]!r}, ''),"
              f" ({HOSTILE['kill_parent'][0]!r}, ['assert True'], ''), ('def f(): return 1', ['assert f() == 1'], '')]\n"
              "out = run_many(jobs, lim, workers=3)\n"
              "print(sorted(out[0].isolation), [o.passed for o in out])\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    layers, passed = done.stdout.strip().split("] ", 1)
    assert "'userns'" in layers and "'nocaps'" in layers and "'net'" in layers, done.stdout + done.stderr
    assert passed == "[[False], [False], [True]]", done.stdout + done.stderr


def test_weak_isolation_is_said_once(monkeypatch):
    monkeypatch.setattr(code_reward, "_warned", False)
    with pytest.warns(UserWarning, match="net"):
        code_reward._warn_if_weak(frozenset({"pid"}))
    code_reward._warn_if_weak(frozenset())  # already said: silent
    monkeypatch.setattr(code_reward, "_warned", False)
    with pytest.warns(UserWarning, match="import math"):
        code_reward._warn_if_weak(frozenset({"net", "pid", "readonly", "tmpfs", "stdlib-unreadable"}))


def test_a_sandbox_that_could_reach_the_trainer_refuses_to_run(monkeypatch):
    # No pid namespace and no uid drop (a non-root trainer where user namespaces are off): a candidate
    # could kill(-1) the trainer, so nothing runs and the message says how to fix the machine.
    monkeypatch.setattr(code_reward, "_checked", frozenset({"nocaps"}))
    with pytest.raises(SandboxError, match="neither a pid namespace nor a user id.*allow user namespaces"):
        CodeTests()(completions=["x = 1"], tests=[["assert x == 1"]])
    assert CodeTests()(completions=["x = 1"], tests=[[]]) == [None]  # nothing to run: no probe, no error
    assert not code_reward.unsafe(frozenset({"uid=65534"})) and not code_reward.unsafe(frozenset({"pid", "nocaps"}))


def test_candidates_import_the_standard_library():
    # As root the code runs as nobody, who may not be able to read this python's files where they are
    # (here: pyenv under root's 0700 home); the new root holds them read-only at their own path, under
    # folders nobody can search. Imports loaded before the drop (collections) must find their
    # submodules (collections.abc) too.
    modules = "math, re, heapq, bisect, itertools, functools, collections.abc, string, fractions, socket, glob"
    out = run(f"import {modules}\ndef f():\n    return math.isqrt(17) + len(string.digits)", ["assert f() == 14"], limits=FAST)
    assert out.passed == [True], out.output


def test_many_candidates_at_once_keep_their_order():
    jobs = [(f"def f():\n    return {i}", [f"assert f() == {i}", "assert f() >= 12"], "") for i in range(24)]
    out = run_many(jobs, FAST, workers=4)
    assert [o.passed for o in out] == [[True, i >= 12] for i in range(24)]


@pytest.mark.slow
def test_a_recipe_column_reaches_the_reward_in_real_steps(tmp_path):
    # Data preparation keeps every column (it only adds `prompt`), and TRL hands the columns to rewards:
    # code_tests raises if `tests` does not arrive, which would stop this run.
    from helpers import with_trainer, write_recipe

    from grpokit import config
    from grpokit.run import training

    data = with_trainer(tmp_path, max_steps=1)
    data["dataset"] = {"path": str(ROOT / "grpokit/assets/code20.jsonl"), "prompt_column": "prompt"}
    data["rewards"] = [{"name": "code_tests", "args": {"timeout": 0.5}}]
    trainer = training.train(config.validate(config.load(write_recipe(tmp_path, data))))
    logged = [h for h in trainer.state.log_history if "rewards/code_tests/mean" in h]
    assert len(logged) == 1 and 0.0 <= logged[0]["rewards/code_tests/mean"] <= 1.0


def test_a_sandbox_that_cannot_start_is_an_error_not_a_zero(tmp_path, monkeypatch):
    broken = tmp_path / "child.py"
    broken.write_text("raise SystemExit('no namespaces, no nothing')\n")
    monkeypatch.setattr("grpokit.untrusted.jobs.CHILD", str(broken))
    with pytest.raises(SandboxError, match="did not start.*no namespaces, no nothing"):
        run("def f(): return 1", ["assert f() == 1"], limits=FAST)


def test_trl_contract_pickles_ignores_extra_columns_and_documents_itself():
    import doctest
    import importlib
    import pickle

    reward = pickle.loads(pickle.dumps(rewards.build("code_tests", timeout=FAST.time_s)))
    out = reward(prompts=["q"], completions=[[{"role": "assistant", "content": "x = 1"}]], completion_ids=[[1]],
                 tests=[["assert x == 1"]], answer=["1"], trainer_state=None, some_other_column=[3])
    assert out == [1.0]
    assert ">>>" in rewards.entry("code_tests").doc
    for module in ("rewards.code", "grpokit.untrusted", "grpokit.untrusted.jobs"):
        assert doctest.testmod(importlib.import_module(module)).failed == 0, module

