"""The code sandbox's bounds that a candidate could otherwise stretch at its neighbours' or the host's cost:
shared memory, what it can see of the filesystem, and whose process count it uses.

Each probe's test statement passes only if the attack worked, so a bound that holds scores the probe 0.
The ones that need a user who is not root start the sandbox as `nobody` (setpriv), as a trainer
without root would: the sandbox then runs inside a user namespace.
"""

import ast
import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from grpokit.untrusted import Limits, SandboxError, isolation, run, run_many

ROOT = Path(__file__).resolve().parents[2]
FAST = Limits(time_s=2.0, memory_mb=256, processes=16, file_mb=4, output_kb=16)
LAYERS = isolation(FAST)
# Where the kernel refuses namespaces these bounds do not hold, and grpokit/untrusted/jobs.py says so.
NAMESPACES = pytest.mark.skipif(not {"newroot", "noshm"} <= LAYERS, reason="no namespaces on this machine (documented)")
MB = 1 << 20
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (the trainer's side of the case)")
NOBODY = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK),
                            reason="needs root (to start as nobody), setpriv and a system python3")

# memfd_create + posix_fallocate: shared memory with no mapping, so the address-space limit never sees
# it; each file stays under the file-size limit, and four children multiply the open-file limit.
MEMFD = """import os
def grab(n):
    got = 0
    for _ in range(n):
        try:
            fd = os.memfd_create('x')
            os.posix_fallocate(fd, 0, 4 << 20)
        except OSError:
            break
        got += 4 << 20
    return got
def release():
    pass
def f():
    total, hold = grab(48), os.pipe()
    for _ in range(4):
        r, w = os.pipe()
        if os.fork() == 0:
            os.write(w, str(grab(48)).encode())
            os.close(hold[1])
            os.read(hold[0], 1)  # keeps its memfds until its parent is gone
            os._exit(0)
        os.close(w)
        total += int(os.read(r, 32) or 0)
    return total
"""
# System V segments outlive their mapping (shmdt) and every process: only the ipc namespace frees them.
SYSV = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
ids = []
def release():
    for shmid in ids:
        libc.shmctl(shmid, 0, None)  # IPC_RMID
def f():
    got = 0
    for _ in range(12):
        shmid = libc.shmget(0, 32 << 20, 0o1600)
        if shmid < 0:
            break
        ids.append(shmid)
        addr = libc.shmat(shmid, None, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            break
        ctypes.memset(addr, 1, 32 << 20)
        libc.shmdt(ctypes.c_void_p(addr))
        got += 32 << 20
    return got
"""

# The same from a user namespace of the candidate's own, where it may make an ipc namespace with the
# kernel's default limits, or mount a tmpfs of its own (files there are shared memory too).
NESTED = """import ctypes, os
uid, gid = os.getuid(), os.getgid()
ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self its own again
if ctypes.CDLL(None).unshare(0x10000000 | 0x08000000 | 0x20000) == 0:  # user, ipc, mount
    for name, text in (('setgroups', 'deny'), ('uid_map', f'0 {uid} 1'), ('gid_map', f'0 {gid} 1')):
        with open(f'/proc/self/{name}', 'w') as f:
            f.write(text)
"""
TMPFS = NESTED + """import os
def f():
    if ctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None) != 0:
        return 0
    got = 0
    for i in range(96):
        try:
            with open(f'/tmp/{i}', 'wb') as out:
                os.posix_fallocate(out.fileno(), 0, 4 << 20)
        except OSError:
            break
        got += 4 << 20
    return got
def release():
    pass
"""
PROBES = {"memfd": MEMFD, "sysv-shm": SYSV, "sysv-shm-nested": NESTED + SYSV, "tmpfs-nested": TMPFS}


@pytest.mark.parametrize("code", PROBES.values(), ids=PROBES.keys())
@NAMESPACES
def test_shared_memory_counts_against_the_memory_limit(code):
    # A probe that gets more shared memory than the candidate's whole limit has gone around it.
    out = run(code, [f"assert f() > {FAST.memory_mb * MB}"], limits=FAST)
    assert out.passed == [False], out.output
    assert out.notes == ["<test 0>: AssertionError (f() = 0)"], (out.notes, out.output)  # it ran, and got nothing


@NOBODY
def test_shared_memory_counts_against_the_memory_limit_when_started_by_nobody():
    # A trainer that is not root: the candidate is root of a user namespace, which must not let it undo
    # the ipc namespace's limits or the seccomp filter.
    jobs = [(code, [f"assert f() > {FAST.memory_mb * MB}"], "") for code in PROBES.values()]
    said = _as_nobody(f"out = run_many({jobs!r}, {FAST!r}, workers=2)\nprint([o.passed for o in out])\n")
    assert ast.literal_eval(said.strip()) == [[False]] * len(PROBES), said


@pytest.mark.parametrize("code", [MEMFD, SYSV], ids=["memfd", "sysv-shm"])
def test_the_shared_memory_probes_work_without_the_sandbox(code):
    # (The nested variants' allocation is these two's; their namespaces are what the sandbox must refuse.)
    # Without this a probe that never worked would make the test above pass vacuously. Run in a plain
    # child process (no limits) and measured in the host's /proc/meminfo, where such memory shows.
    probe = code + "print(f(), flush=True)\nimport sys\nsys.stdin.read()\nrelease()\n"
    child = subprocess.Popen([sys.executable, "-I", "-c", probe], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        got = int(child.stdout.readline())
        assert got > FAST.memory_mb * MB
        assert _shmem() >= got  # host-wide shared memory holds at least what the probe got
    finally:
        child.stdin.close()  # it removes its System V segments, which would outlive it
        child.wait()


def _shmem() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no Shmem line in /proc/meminfo")


# ----------------------------------------------------------------------------------------------------
# What a candidate sees: the interpreter, the standard library, its scratch /tmp; no host file.

READ = "def f(path):\n    try:\n        return open(path).read()\n    except OSError:\n        return ''\n"


@AS_ROOT
@NAMESPACES
def test_world_readable_host_files_are_not_visible(tmp_path):
    # As root the code runs as another uid, which can still read anything world-readable: the project's
    # data, other users' homes, /etc.
    data = Path("/var/tmp", f"grpokit-data-{uuid.uuid4().hex}")
    data.mkdir(mode=0o755)
    try:
        (data / "train.jsonl").write_text("gold answers\n")
        (data / "train.jsonl").chmod(0o644)
        tests = [f"assert 'gold' in f({str(data / 'train.jsonl')!r})", "assert 'root' in f('/etc/passwd')",
                 f"assert f({str(ROOT / 'pyproject.toml')!r})"]
        out = run(READ, tests, limits=FAST)
        assert out.passed == [False, False, False], out.output
    finally:
        shutil.rmtree(data)


@NAMESPACES
def test_a_new_root_that_cannot_be_built_is_an_error_not_a_weaker_sandbox(tmp_path, monkeypatch):
    # A mount of the new root refused (here: a folder to show that does not exist): the job stops before
    # the code runs, and the error names the step.
    child = tmp_path / "child.py"
    child.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'grpokit/untrusted')!r})\nimport child as c\n"
                     "c._visible = lambda: ['/nonexistent-grpokit']\nc.main()\n")
    monkeypatch.setattr("grpokit.untrusted.jobs.CHILD", str(child))
    with pytest.raises(SandboxError, match="did not start.*mount /nonexistent-grpokit on"):
        run("def f(): return 1", ["assert f() == 1"], limits=FAST)


def _as_nobody(script: str) -> str:
    """Run `script` as nobody with the sandbox importable (a copy any user can read: the checkout may sit in a private
    folder); its stdout (the trainer not being root)."""
    from helpers import readable_by_anyone

    head = (f"import sys; sys.path.insert(0, {str(readable_by_anyone())!r})\n"
            "from grpokit.untrusted import Limits, SandboxError, isolation, run, run_many\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c",
                           head + script], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    return done.stdout


@NOBODY
def test_a_non_root_trainers_private_files_are_not_visible():
    # The trainer's own 0600 files (a hub token, an ssh key): a user namespace maps the candidate to the
    # trainer's uid, so only hiding them keeps them from the code.
    home = Path("/var/tmp", f"grpokit-home-{uuid.uuid4().hex}")
    token = home / ".cache/huggingface/token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_secret\n")
    token.chmod(0o600)
    for path in (home, home / ".cache", token.parent, token):
        os.chown(path, 65534, 65534)
    try:
        tests = [f"assert 'hf_secret' in f({str(token)!r})", "assert 'root' in f('/etc/passwd')"]
        script = f"out = run({READ!r}, {tests!r}, limits=Limits(time_s=2.0))\nprint(sorted(out.isolation), out.passed)\n"
        stdout = _as_nobody(script)
        assert "'userns'" in stdout and stdout.strip().endswith("[False, False]"), stdout
    finally:
        shutil.rmtree(home)


# ----------------------------------------------------------------------------------------------------
# Process limits are each candidate's own: a neighbour holding threads takes none from the next one.

THREADS = """import threading
def f(n):
    done = []
    ts = [threading.Thread(target=done.append, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return len(done)
"""
# Holds `n` threads (processes, to the kernel's count) until its stdin closes, once it has said so.
HOLDER = ("import sys, threading\ngate = threading.Event()\nfor _ in range(int(sys.argv[1])):\n"
          "    threading.Thread(target=gate.wait, daemon=True).start()\nprint('holding', flush=True)\nsys.stdin.read()\n")


def _hold_threads(n: int, uid: int) -> subprocess.Popen:
    """A process of `uid` holding n threads, returned once they all run (it says so on stdout)."""
    holder = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-I",
                               "-c", HOLDER, str(n)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "holding\n"
    return holder


@NOBODY
@pytest.mark.parametrize("trainer", ["root", "nobody"])
def test_a_neighbour_holding_threads_does_not_use_up_the_next_candidates_processes(trainer):
    # Another process of the candidates' uid (as root: nobody, like every other candidate; not root:
    # the trainer's own uid) holds more threads than a candidate may have. RLIMIT_NPROC counted per uid
    # would leave the candidate none; counted per candidate, both candidates start their 8.
    holder = _hold_threads(FAST.processes + 4, 65534)
    try:
        if trainer == "root":
            out = run_many([(THREADS, ["assert f(8) == 8"], "")] * 2, FAST, workers=2)
            passed, said = [o.passed for o in out], out[0].output
        else:
            said = _as_nobody(f"out = run_many([({THREADS!r}, ['assert f(8) == 8'], '')] * 2, {FAST!r}, workers=2)\n"
                              "print([o.passed for o in out])\n")
            passed = ast.literal_eval(said.strip())
        assert passed == [[True], [True]], said
    finally:
        holder.stdin.close()
        holder.wait()


# ----------------------------------------------------------------------------------------------------
# A candidate's memory is bounded as a whole: every process of it together, its /tmp included.

# Forks `n` children that each allocate and touch (write every page of) `mb` MB, all held at once;
# returns how many got there. Each child stays under the per-process address-space limit.
HOG = """import os
def hold(n, mb):
    release, pipes = os.pipe(), []
    for _ in range(n):
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(release[1])
            big = bytearray(mb << 20)
            big[::4096] = b'\\x01' * len(range(0, mb << 20, 4096))
            os.write(w, b'1')
            os.read(release[0], 1)  # holds its pages until the parent is done
            os._exit(0)
        os.close(w)
        pipes.append(r)
    held = sum(len(os.read(r, 1)) for r in pipes)
    os.close(release[1])
    return held
"""
HONEST = ("def add(a, b):\n    return a + b\n", ["assert add(1, 2) == 3"], "")


def _memory_cgroup() -> Path | None:
    """This process's own memory cgroup (v1 hierarchy, or v2 with memory.peak), where a group made under
    it is writable; None elsewhere. Found here, not by the code under test."""
    own = dict(line.rstrip("\n").split(":", 2)[1:] for line in Path("/proc/self/cgroup").read_text().splitlines())
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        if fields[3] != "/":
            continue
        if fields[dash + 1] == "cgroup" and "memory" in fields[dash + 3].split(",") and "memory" in own:
            path = Path(fields[4] + own["memory"])
        elif fields[dash + 1] == "cgroup2" and "" in own:
            path = Path(fields[4] + own[""])
            if "memory" not in (path / "cgroup.subtree_control").read_text().split():
                continue
        else:
            continue
        if os.access(path, os.W_OK):
            return path
    return None


def _peak_of_trainer(jobs: list) -> tuple[int, list]:
    """A trainer process scoring `jobs`, measured from outside: the kernel's high-water mark of the memory
    of a cgroup holding it and everything it starts (candidates included). Returns (bytes, what it said)."""
    parent = _memory_cgroup()
    measured = joined = parent / f"grpokit-test-{uuid.uuid4().hex}"
    measured.mkdir()
    if not (measured / "memory.max_usage_in_bytes").exists():  # v2: processes only in leaves, so the trainer
        (measured / "cgroup.subtree_control").write_text("+memory")  # in one, its candidates' groups beside it
        joined = measured / "trainer"
        joined.mkdir()
    try:
        script = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                  f"open({str(joined / 'cgroup.procs')!r}, 'w').write('0')\n"  # joins before it starts anything
                  "from grpokit.untrusted import Limits, run_many\n"
                  f"out = run_many({jobs!r}, {FAST!r}, workers=2)\n"
                  "print(repr([(o.passed, sorted(o.isolation)) for o in out]))\n")
        done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=120, cwd="/")
        assert done.returncode == 0, done.stderr  # the trainer itself is untouched
        name = "memory.max_usage_in_bytes" if (measured / "memory.max_usage_in_bytes").exists() else "memory.peak"
        peak = int((measured / name).read_text())
        left = [p.name for p in measured.iterdir() if p.is_dir() and p != joined]
        assert left == [], f"candidate cgroups left behind: {left}"
        return peak, ast.literal_eval(done.stdout.strip())
    finally:
        if joined != measured:  # cgroups: rmdir is refused unless empty
            joined.rmdir()
        measured.rmdir()


@AS_ROOT
@pytest.mark.skipif(os.geteuid() != 0 or _memory_cgroup() is None, reason="needs a writable memory cgroup to measure in")
def test_a_candidates_processes_together_stay_within_its_memory_limit():
    # Four children of 200 MB each: every one under the per-process limit (256 MB), 800 MB together.
    # What the host gave the candidate (the trainer's peak with it, less its peak with an honest one
    # instead) must stay within the candidate's limit; over it, the candidate loses, not the trainer.
    hog = (HOG, ["assert hold(4, 200) == 4"], "")
    peak_hog, said = _peak_of_trainer([hog, HONEST])
    peak_honest, _ = _peak_of_trainer([HONEST, HONEST])
    limit = (FAST.memory_mb + FAST.file_mb) * MB
    assert peak_hog - peak_honest <= limit, f"{(peak_hog - peak_honest) / MB:.0f} MB > {limit / MB:.0f} MB"
    assert said[0][0] == [False], said
    assert said[1][0] == [True], "the candidate next to it was disturbed"
    assert "cgroup-memory" in said[0][1], said


def test_the_memory_hog_works_without_the_sandbox():
    # Without this the test above could pass on a probe that never allocated.
    namespace = {}
    exec(HOG, namespace)
    assert namespace["hold"](2, 16) == 2


def _child_module():
    """grpokit/untrusted/child.py as a module of its own (it is a script, run by path)."""
    spec = importlib.util.spec_from_file_location("grpokit_sandbox_child", ROOT / "grpokit/untrusted/child.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CGROUP_TREES = {
    # v1 hierarchies of their own (this machine's layout): the trainer's own group in each
    "v1": ("4:memory:/jobs/trainer\n8:pids:/\n0::/\n",
           "35 31 0:32 / {cg}/memory rw - cgroup cgroup rw,memory\n39 31 0:36 / {cg}/pids rw - cgroup cgroup rw,pids\n"
           "41 31 0:38 / {cg}/unified rw - cgroup2 cgroup2 rw\n",
           {"memory/jobs/trainer": None, "pids": None, "unified": ""},
           [("memory/jobs/trainer", "v1", ("memory",)), ("pids", "v1", ("pids",))]),
    # a delegated v2 subtree: the trainer in a leaf of `unit`, which enables memory and pids for its
    # children; candidates' groups go beside the trainer's leaf
    "v2-delegated": ("0::/unit/trainer\n", "41 31 0:38 / {cg} rw - cgroup2 cgroup2 rw\n",
                     {"": "", "unit": "memory pids", "unit/trainer": ""}, [("unit", "v2", ("memory", "pids"))]),
    # v2 without the memory controller anywhere above the trainer: nothing to make
    "v2-no-memory": ("0::/unit/trainer\n", "41 31 0:38 / {cg} rw - cgroup2 cgroup2 rw\n",
                     {"": "cpu", "unit": "", "unit/trainer": ""}, []),
    # a cgroup namespace's view: the mount's root is the trainer's group itself
    "v2-mounted-below": ("0::/unit\n", "41 31 0:38 /unit {cg} rw - cgroup2 cgroup2 rw\n",
                         {"": "memory"}, [("", "v2", ("memory",))]),
}


@pytest.mark.parametrize("tree", CGROUP_TREES.values(), ids=CGROUP_TREES.keys())
def test_candidate_cgroups_go_where_the_machine_delegates_them(tree, tmp_path):
    own, mountinfo, folders, expected = tree
    cg, proc = tmp_path / "cg", tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(own)
    (proc / "mountinfo").write_text(mountinfo.format(cg=cg))
    for folder, enabled in folders.items():
        (cg / folder).mkdir(parents=True, exist_ok=True)
        if enabled is not None:
            (cg / folder / "cgroup.subtree_control").write_text(enabled + "\n")
    places = _child_module()._cgroup_places(str(proc))
    assert places == [(str(cg / folder).rstrip("/"), version, c) for folder, version, c in expected]


@NOBODY
def test_without_a_writable_cgroup_the_sandbox_runs_and_says_so():
    # A trainer that is not root here has no group it may write to: the candidate still runs, with its
    # per-process limits, and the missing layer shows in isolation().
    said = _as_nobody(f"out = run({HONEST[0]!r}, {HONEST[1]!r}, limits={FAST!r})\nprint(sorted(out.isolation), out.passed)\n")
    assert "'userns'" in said and "cgroup-memory" not in said and said.strip().endswith("[True]"), said


@AS_ROOT
@pytest.mark.skipif(os.geteuid() != 0 or _memory_cgroup() is None, reason="needs a writable memory cgroup")
def test_without_a_pid_namespace_the_cgroup_still_ends_every_process_of_the_job():
    # A process that leaves the process group (setsid) is out of reach of the kill at the end; the
    # candidate's cgroup still holds it, and the job's end empties the group before removing it.
    marker = Path("/dev/shm", f"grpokit-pid-{uuid.uuid4().hex}")
    code = ("import os, time\ndef f():\n    if os.fork() == 0:\n        os.setsid()\n"
            f"        open({str(marker)!r}, 'w').write(str(os.getpid()))\n        time.sleep(60)\n        os._exit(0)\n"
            "    time.sleep(0.5)\n    return True\n")
    try:
        out = run(code, ["assert f()"], limits=Limits(**{**FAST.__dict__, "namespaces": False}))
        assert out.passed == [True] and out.ended == "done" and "cgroup-pids" in out.isolation, out
        pid = int(marker.read_text())
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            status = ""
        assert "Uid:\t65534" not in status or "State:\tZ" in status, status  # gone (or a zombie)
    finally:
        marker.unlink(missing_ok=True)


def test_what_the_code_printed_comes_back_every_time():
    # Outcome.output is the candidate's print-out, for a user debugging a 0 score. The code runner is killed once the
    # judge is done; output still in its buffers would be lost whenever it lost that race (seen: empty in 3 of 6
    # runs of this very candidate, and in a fork bomb's run after a candidate that left a daemon).
    outcomes = run_many([("print('forks 15', end='')\ndef f():\n    return 1", ["assert f() == 1"], "")] * 8, workers=2)
    assert [o.passed for o in outcomes] == [[True]] * 8
    assert [o.output for o in outcomes] == [b"forks 15"] * 8
