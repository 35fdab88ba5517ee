"""The sandbox's inside: started by `rewards._sandbox` as `python -I -S _sandbox_child.py RESULT_FD`.

Standard library only, and nothing of grpokit's: this file is the whole of what the untrusted code's
process has loaded before the code runs. Three processes, so that the one running the candidate is
never the one that cleans up after it:

    bootstrap   reads the job from stdin, enters new namespaces (network, pid, mount, ipc, uts; plus a
                user namespace when not root), forks the supervisor and waits for it; on SIGTERM it
                kills the supervisor and still waits, so its exit means the job's processes are gone
    supervisor  pid 1 of the new pid namespace: dies with the bootstrap (PR_SET_PDEATHSIG), makes every
                mount read-only, mounts a private size-capped tmpfs on /tmp (the working directory) and
                a fresh /proc, forks the runner, kills it at the deadline. When pid 1 of a namespace
                exits the kernel kills everything left in it, so a runner that forked, `setsid`-ed or
                slept cannot outlive the job.
    runner      sets rlimits (CPU, address space, processes, file size, open files, no core), drops to
                an unprivileged uid (as root) or drops every capability (in a user namespace), then
                runs the setup, the code and each step of the job, one report per step on RESULT_FD.

A step is a probe (an expression needing the code's names, e.g. `add(1, 2)`: its value is sent back in
rewards/_values.py's format and the parent decides the test, see rewards/_judge.py) or an opaque test
(run whole here; pass or fail sent back). Reports are `<nonce> <kind> <value>` lines, a value's bytes
following its line; the nonce comes with the job and is never printed, so a candidate that writes
"pass 0" to every descriptor it can find forges nothing. What each step could not do on this machine
is reported (`iso ...`) rather than fatal: the parent decides and documents.
"""

import ctypes
import marshal
import os
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# A bind remount must repeat these flags of the mount it changes (in a user namespace they are locked).
_KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

_libc = ctypes.CDLL(None, use_errno=True)


class _Timeout(BaseException):
    """Raised by the per-test timer; a BaseException so the candidate's `except Exception` cannot eat it."""


def _unshare(wanted: bool) -> list:
    """Enter the namespaces this machine allows; returns the names of those entered."""
    if not wanted:
        return []
    base = CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWUTS
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    if not hasattr(_libc, "unshare"):  # not Linux: the rlimits and the uid drop are all there is
        return []
    # Not root: a user namespace grants the capabilities the others need (where the kernel allows it).
    if _libc.unshare(base if root else base | CLONE_NEWUSER) != 0:
        return []
    if not root:
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    return ["net", "pid", "ipc", "uts", "mountns"] + ([] if root else ["userns"])


def _mount(source, target, fstype, flags, data=None) -> bool:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    return _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0


def _read_only_world(tmpfs_mb: int, uid: int, gid: int, new_proc: bool) -> list:
    """Every mount read-only, a private tmpfs on /tmp, a /proc showing only this namespace."""
    done = []
    if not _mount(None, "/", None, MS_REC | MS_PRIVATE):  # nothing below may reach the host's mounts
        return done
    ok = True
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        target = fields[4].replace("\\040", " ")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in fields[5].split(","):
            flags |= _KEEP.get(opt, 0)
        if "ro" not in fields[5].split(",") and not _mount(None, target, None, flags):
            ok = False
    if ok:
        done.append("readonly")
    if _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=0700"):
        os.chown("/tmp", uid, gid)
        done.append("tmpfs")
    if new_proc and _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC):
        done.append("proc")
    return done


def _open_to_others(path: str) -> bool:
    """Can a uid that neither owns `path` nor is in its group read it (every directory above searchable)?"""
    path, bits = os.path.abspath(path), 0o005
    while True:
        if os.stat(path).st_mode & bits != bits:
            return False
        if path == "/":
            return True
        path, bits = os.path.dirname(path), 0o001


def _expose_stdlib() -> list:
    """Bind this python's library folders read-only into /tmp when the unprivileged uid could not read
    them where they are (a python under root's 0700 home, as pyenv or conda installs it there); the
    (old, new) folder pairs, or None when that is not possible."""
    needed = [p for p in sys.path if os.path.isdir(p)]
    mapped = []
    for i, path in enumerate(needed):
        target = f"/tmp/.python{i}"
        os.mkdir(target, 0o755)
        if not (_mount(path, target, None, MS_BIND)
                and _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)):
            return None
        mapped.append((path, target))
    return mapped


def _use_stdlib(mapped: list) -> None:
    """Point sys.path, and the packages imported already (their submodules are found through
    `__path__`: `collections` is loaded, `collections.abc` is not), at the bound copies."""

    def moved(path: str) -> str:
        for old, new in mapped:
            if path == old or path.startswith(old + os.sep):
                return new + path[len(old):]
        return path

    sys.path[:] = [new for _, new in mapped]
    sys.path_importer_cache.clear()
    for module in list(sys.modules.values()):
        search = getattr(module, "__path__", None)
        if isinstance(search, list):
            search[:] = [moved(p) for p in search]


def _limit(job: dict) -> None:
    """Hard limits; only lowering is allowed afterwards, and the runner no longer has the right to raise them."""
    cpu = int(job["wall_s"]) + 1
    for which, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard
                         (resource.RLIMIT_AS, (job["memory_mb"] << 20,) * 2),
                         (resource.RLIMIT_NPROC, (job["processes"],) * 2),
                         (resource.RLIMIT_FSIZE, (job["file_mb"] << 20,) * 2),
                         (resource.RLIMIT_NOFILE, (64, 64)),
                         (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(which, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too big a file is an OSError in the code, not a kill


def _drop_privileges(uid: int, gid: int, userns: bool) -> str:
    """Root: become `uid` (loses every capability; RLIMIT_NPROC now applies). A user namespace: clear capabilities."""
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary can give anything back
    if os.geteuid() == 0 and not userns:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            return f"uid={uid}"
        except OSError:
            pass
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words, all zero
    tag = "nocaps" if _libc.capset(header, data) == 0 else "caps-kept"
    # Real root (setuid refused) stays exempt from RLIMIT_NPROC whatever its capabilities: say so.
    return tag if userns or os.getuid() != 0 else f"uid=0,{tag}"


def _close_fds(keep: int) -> None:
    os.closerange(3, keep)
    os.closerange(keep + 1, 1 << 16)


# The harness's own references, taken before any graded code runs (which may rebind the builtins' and
# os's): these names resolve to module globals, whatever `builtins.int = ...` or `os.write = ...` does.
from builtins import (bool, bytearray, bytes, complex, dict, float, frozenset, int, isinstance,  # noqa: E402
                      issubclass, len, list, memoryview, set, str, tuple, type)

_exec, _eval, _compile, _write = exec, eval, compile, os.write


def _run_tests(job: dict, report) -> None:
    """Execute the setup and the code, then each step in the code's namespace, reporting each before the
    next starts: a probe's value (`value`, or `fail` when it raised or is not a plain value), an opaque
    test's verdict (`pass` / `fail`)."""

    def on_alarm(signum, frame):
        raise _Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    left = {}  # seconds left to each label: the probes of one test share its time_s, as the test would

    def timed(run, source: str, label: str):
        try:
            budget = left.get(label, job["time_s"])
            if budget <= 0:
                raise _Timeout()
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                return True, run(source, label)
            finally:
                left[label] = signal.setitimer(signal.ITIMER_REAL, 0)[0]
        except BaseException as err:  # noqa: BLE001 - assert failing, code crashing, sys.exit, timeout: all "did not pass"
            try:  # one line for whoever reads the output (the parent keeps its start)
                print(f"{label}: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
            except BaseException:  # noqa: BLE001 - stderr closed or replaced by the code
                pass
            return False, None

    def execute(source: str, label: str) -> None:
        _exec(_compile(source, label, "exec"), namespace)

    def value(iterable: bool):
        return lambda source, label: _encode(_eval(_compile(source, label, "eval"), namespace), iterable)

    loaded = timed(execute, job["setup"], "<setup>")[0] and timed(execute, job["code"], "<completion>")[0]
    report("load", "1" if loaded else "0")
    for j, (kind, source, label, iterable) in enumerate(job["steps"]):
        if not loaded:
            report("fail", j)
        elif kind == "exec":
            report("pass" if timed(execute, source, label)[0] else "fail", j)
        else:
            ok, payload = timed(value(iterable), source, label)
            if ok:
                report("value", j, payload)
            else:
                report("fail", j)


_VALUE_BYTES = 1 << 19  # one value's encoding; past it the probe fails (the parent reads 1 MiB per candidate)
_VALUE_ITEMS = 1 << 16  # items in one value (rewards/_values.py refuses more)
_VALUE_DEPTH = 64
_SEQUENCES = ((list, b"l"), (tuple, b"t"), (set, b"S"), (frozenset, b"Z"))
_PLAIN = (type(None), bool, int, float, complex, str, bytes, bytearray, list, tuple, set, frozenset, dict)


def _encode(value, iterable: bool) -> bytes:
    """The value in rewards/_values.py's format, as its base types (a Counter as a dict, a namedtuple as a
    tuple); `iterable`: any other iterable as the list of its items. ValueError for anything else."""
    if iterable and not isinstance(value, _PLAIN):
        items = []
        for item in value:
            items.append(item)
            if len(items) > _VALUE_ITEMS:
                raise ValueError("too many items")
        value = items
    out, budget = [], [_VALUE_ITEMS, _VALUE_BYTES]
    _put(value, out, 0, budget)
    if budget[1] < 0:
        raise ValueError("value too big to send")
    return b"".join(out)


def _put(x, out: list, depth: int, budget: list) -> None:
    """Append x's encoding to `out`; budget is [items left, bytes left]."""
    budget[0] -= 1
    if budget[0] < 0 or budget[1] < 0 or depth > _VALUE_DEPTH:
        raise ValueError("value too big or too deep to send")
    kind = type(x)
    if x is None or x is True or x is False:
        piece = b"N" if x is None else b"T" if x else b"F"
    elif issubclass(kind, int):
        piece = b"i%x;" % int.__index__(x)
    elif issubclass(kind, float):
        piece = b"f%s;" % float.hex(x).encode()
    elif issubclass(kind, complex):
        real, imag = complex.__getnewargs__(x)
        piece = b"c%s;%s;" % (float.hex(real).encode(), float.hex(imag).encode())
    elif issubclass(kind, (str, bytes, bytearray)):
        raw = str.encode(x, "utf-8", "surrogatepass") if issubclass(kind, str) else bytes(memoryview(x))
        piece = b"%c%d:%s" % (115 if issubclass(kind, str) else 98, len(raw), raw)
    elif issubclass(kind, dict):
        pairs = list(dict.items(x))
        out.append(b"d%d:" % len(pairs))
        for key, item in pairs:
            _put(key, out, depth + 1, budget)
            _put(item, out, depth + 1, budget)
        return
    else:
        for base, tag in _SEQUENCES:
            if issubclass(kind, base):
                items = list(base.__iter__(x))
                out.append(b"%s%d:" % (tag, len(items)))
                for item in items:
                    _put(item, out, depth + 1, budget)
                return
        raise ValueError(f"a {kind.__name__} is not a plain value")
    out.append(piece)
    budget[1] -= len(piece)


def _supervise(job: dict, out: int, report, layers: list) -> int:
    """Pid 1 of the namespace: prepare the filesystem, run the runner, kill it at the deadline."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    uid, gid = (0, 0) if "userns" in layers else (job["uid"], job["gid"])  # our own ids, as the namespace maps them
    if "mountns" in layers:
        layers += _read_only_world(job["file_mb"], uid, gid, new_proc="pid" in layers)
    stdlib = None
    if os.geteuid() == 0 and "userns" not in layers and uid != 0:  # about to become `uid`: can it import?
        if not all(_open_to_others(p) for p in sys.path if os.path.isdir(p)):
            stdlib = _expose_stdlib() if "tmpfs" in layers else None
            # Without it only the modules imported by now would import (`math` would not): the parent warns.
            layers.append("stdlib-bound" if stdlib is not None else "stdlib-unreadable")
    os.chdir("/tmp" if "tmpfs" in layers else "/")
    runner = os.fork()
    if runner == 0:
        try:
            _close_fds(out)
            _limit(job)
            report("iso", ",".join(layers + [_drop_privileges(uid, gid, "userns" in layers)]))
            if stdlib is not None:
                _use_stdlib(stdlib)
            _run_tests(job, report)
        except BaseException:  # noqa: BLE001 - only the sandbox's own setup can get here
            import traceback

            traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):  # what the code printed, for the parent's debugging copy
                try:
                    stream.flush()
                except BaseException:  # noqa: BLE001 - a closed or replaced stream
                    pass
            os._exit(0)
    os.close(out)

    def on_deadline(signum, frame):
        raise _Timeout()

    signal.signal(signal.SIGALRM, on_deadline)
    signal.setitimer(signal.ITIMER_REAL, job["wall_s"])
    try:
        try:
            while os.waitpid(-1, 0)[0] != runner:  # pid 1 reaps every orphan of the namespace too
                pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ChildProcessError:
        pass
    except _Timeout:
        # As pid 1, returning is enough: the kernel kills the namespace. Without a pid namespace: the
        # process group (the runner and whatever it forked without leaving the group; this one too).
        if "pid" not in layers:
            os.killpg(0, signal.SIGKILL)
    return 0


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())  # marshal, not json: json would import re (~5 ms a job)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out, nonce = int(sys.argv[1]), job.pop("nonce")

    def report(kind: str, value, payload: bytes = None) -> None:
        """One line `<nonce> <kind> <value>`; with a payload, its length ends the line and its bytes follow."""
        line = f"{nonce} {kind} {value}\n" if payload is None else f"{nonce} {kind} {value} {len(payload)}\n"
        data = memoryview(line.encode() + (payload or b""))
        try:
            while data:
                data = data[_write(out, data):]
        except OSError:  # the code closed or replaced the descriptor: its later tests just go unreported
            pass

    layers = _unshare(job["namespaces"])
    supervisor = os.fork()
    if supervisor == 0:
        try:
            os._exit(_supervise(job, out, report, layers))
        except BaseException:  # noqa: BLE001 - any failure here ends the job; the parent scores what it got
            import traceback

            traceback.print_exc()  # into the output the parent keeps the start of
            os._exit(70)
    os.close(out)
    # Asked to stop (SIGTERM from the parent): kill the supervisor and wait for it. A pid namespace's
    # pid 1 is reaped only after every process in the namespace is gone, so when this process exits
    # the whole job has, and the parent can rely on that.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(supervisor, signal.SIGKILL))
    # Wait without reaping first: until reaped, the supervisor's pid cannot be reused, so a late SIGTERM
    # can only hit the zombie, never a stranger that got the number.
    os.waitid(os.P_PID, supervisor, os.WEXITED | os.WNOWAIT)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.waitpid(supervisor, 0)


if __name__ == "__main__":
    main()
