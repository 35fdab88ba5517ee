"""The sandbox's inside: started by `grpokit.untrusted.jobs` as `python -I -S child.py RESULT_FD SECRET_FD`.

Standard library only; of grpokit's, only the two sides' modules of this package (judge, candidate, link,
values), loaded before the new root hides them. Four processes, so that the one running the candidate is
never the one that judges it, nor the one that cleans up after it:

    bootstrap   reads the job from stdin (the code, the setup's imports and classes, the limits: never the
                tests), makes the candidate's cgroups where it may (memory and pids, under its own groups),
                enters new namespaces (network, pid, mount, ipc, uts; plus a user namespace when not root),
                forks the supervisor and waits for it; on SIGTERM it kills the supervisor and still waits,
                so its exit means the job's processes are gone; then it removes the cgroups (killing first
                what a job without a pid namespace left)
    supervisor  pid 1 of the new pid namespace: dies with the bootstrap (PR_SET_PDEATHSIG), joins the
                cgroups (every process the job starts is counted there), zeroes the ipc namespace's
                System V limits, pivots into a new root (this python's prefix and the system libraries
                read-only, a few /dev nodes, a fresh /proc, a private size-capped /tmp as the working
                directory), makes itself undumpable, forks the judge, then the code runner in a pid
                namespace of its own, and kills them at the deadline (the code runner as soon as the judge
                is done). When pid 1 of a namespace exits the kernel kills everything left in it, so a
                runner that forked, `setsid`-ed or slept cannot outlive the job.
    judge       drops privileges and sets the limits as the code runner does (below), makes itself
                undumpable (the code runner, same uid, cannot ptrace it or open its /proc files), reads the
                job's secret part (the setup, the tests, the nonce) from SECRET_FD, reports the layers, lets
                the code runner start, then runs the setup and the tests (sandbox/judge.py),
                one report per test on RESULT_FD
    code runner drops to an unprivileged uid in a user namespace of its own (as root) or drops every
                capability (already in a user namespace), sets rlimits (CPU, address space, processes,
                file size, open files, message queues, no core), refuses memfd_create and new namespaces
                (seccomp), closes every descriptor but its two pipes to the judge (never RESULT_FD or
                SECRET_FD), then runs the code and answers the judge (sandbox/candidate.py). It is
                pid 1 of its own pid namespace: the judge is not there to signal.

Reports are `<nonce> <kind> <value>` lines, a failing test's note following its line; the nonce is in the
secret part, which neither the bootstrap, the supervisor nor the code runner ever reads, and is never printed.
Namespaces the kernel refuses, and a user namespace refused to a runner, are reported (`iso ...`) rather than
fatal: the parent decides and documents. A step that fails once its namespace exists (a mount of the new root,
the seccomp filter) ends the job before the code runs: the parent raises rather than score it.
"""

import ctypes
import marshal
import os
import resource
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE = 1024, 2048, 4096, 16384, 1 << 18
MS_RELATIME, MS_STRICTATIME = 1 << 21, 1 << 24
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 4, 38, 22, 2
MNT_DETACH = 2
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # syscall numbers: glibc has no wrapper
# AUDIT_ARCH_*, the numbers of (memfd_create, memfd_secret, unshare, setns), clone and clone3
_SECCOMP_ARCH = {"x86_64": (0xC000003E, (319, 447, 272, 308), 56, 435),
                 "aarch64": (0xC00000B7, (279, 447, 97, 268), 220, 435)}
CLONE_NEWCGROUP = 0x02000000
_CLONE_NEW_ANY = CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWCGROUP
# A bind remount must repeat these flags of the mount it changes (in a user namespace they are locked).
_KEEP = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME,
         "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}

_libc = ctypes.CDLL(None, use_errno=True)


class _Timeout(BaseException):
    """Raised by the per-test timer; a BaseException so the candidate's `except Exception` cannot eat it."""


def _raise_timeout(signum, frame):
    """SIGALRM's handler in the runner (a test's time) and the supervisor (the job's deadline)."""
    raise _Timeout()


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


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ok = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)) == 0
    _must(ok, f"mount {source or ''} on {target}")


def _new_root(tmpfs_mb: int, uid: int, gid: int, extra: tuple = ()) -> list:
    """Pivot into a new root holding only this python (its prefix and the system libraries its modules
    link) and the folders in `extra` (read-only, like the rest), /dev/null, zero, random and urandom, a fresh /proc
    (its /sys read-only) and a private size-capped /tmp; every other mount read-only. Raises OSError where a step
    fails: a half-built root is no sandbox."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below may reach the host's mounts
    visible = _visible() + [p for p in extra if os.path.isdir(p)]
    # Any existing folder will do as the mount point the new root is built on, but not one holding a folder to show:
    # the tmpfs mounted on it would hide that folder from its own bind.
    new = next((base for base in ("/tmp", "/mnt", "/srv", "/media", "/opt", "/var/tmp", "/root", "/home")
                if os.path.isdir(base) and not any(p == base or p.startswith(base + "/") for p in visible)), None)
    if new is None:
        raise OSError(f"sandbox set-up: no folder to build the new root on outside {visible}")
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    # The private /tmp first: a folder to show that lives under the host's /tmp (a checkout there) is bound inside it.
    for folder in ("/tmp", "/proc"):
        os.mkdir(new + folder)
    _mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=0700")
    os.chown(new + "/tmp", uid, gid)
    for path in visible:
        if os.path.islink(path):  # /lib -> usr/lib on merged-/usr systems
            os.makedirs(os.path.dirname(new + path), exist_ok=True)
            os.symlink(os.readlink(path), new + path)
        else:
            os.makedirs(new + path, exist_ok=True)
            _mount(path, new + path, None, MS_BIND | MS_REC)
    os.mkdir(new + "/dev")
    for node in ("null", "zero", "random", "urandom"):
        open(f"{new}/dev/{node}", "w").close()
        _mount(f"/dev/{node}", f"{new}/dev/{node}", None, MS_BIND)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(new)
    _must(_libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b".") == 0, "pivot_root")  # old root now under "."
    _must(_libc.umount2(b".", MNT_DETACH) == 0, "detach the old root")
    os.chdir("/")
    _mount("/proc/sys", "/proc/sys", None, MS_BIND)  # /proc itself stays writable: uid_map is written later
    _read_only(keep_writable=("/tmp", "/proc"))
    return ["newroot", "readonly", "tmpfs", "proc"]


def _visible() -> list:
    """What a candidate sees of the host: this python's installation and the system's libraries."""
    system = [p for p in ("/usr", "/bin", "/lib", "/lib64", "/lib32", "/libx32") if os.path.lexists(p)]
    prefixes = {sys.base_prefix, sys.base_exec_prefix}
    return system + sorted(p for p in prefixes if not any(p == s or p.startswith(s + "/") for s in system))


def _read_only(keep_writable: tuple) -> None:
    """Remount every mount read-only, repeating the flags a bind remount must keep (locked in a user namespace)."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split() for line in f]
    for fields in mounts:
        target, options = fields[4].replace("\\040", " "), fields[5].split(",")
        if target in keep_writable or "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for opt in options:
            flags |= _KEEP.get(opt, 0)
        _mount(None, target, None, flags)


def _must(ok: bool, step: str) -> None:
    """A set-up step that failed ends the job before any code runs; the parent reports the step."""
    if not ok:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox set-up, {step}: {os.strerror(err)}")


def _no_shared_memory() -> None:
    """Shared memory that no address-space limit sees is refused: System V segments (which outlive every
    process) and message queues by this ipc namespace's own limits, set to zero; memfd_create by a
    seccomp filter (a memfd holds pages without being mapped). Shared memory left: the capped /tmp,
    and shared mappings, each counted in its mapper's address space."""
    for name in ("shmall", "shmmax", "shmmni", "msgmni"):
        with open(f"/proc/sys/kernel/{name}", "w") as f:
            f.write("0")


def _seccomp() -> None:
    """Refuse (EPERM) memfd_create and memfd_secret, new namespaces (unshare, setns, clone with a
    CLONE_NEW* flag: a user namespace of its own would let the code make an ipc namespace with the
    kernel's default limits, or mount a tmpfs of any size), and every syscall of another ABI (x32,
    i386), whose numbers differ. clone3 passes its flags in memory a filter cannot read: ENOSYS, on which
    the C library falls back to clone. Needs no_new_privs, which `_drop_privileges` has set."""
    arch, denied, clone, clone3 = _SECCOMP_ARCH[os.uname().machine]
    # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_{JEQ,JGE,JSET}|BPF_K, BPF_RET|BPF_K
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, refuse, missing = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ALLOW, _ERRNO|EPERM, _ERRNO|ENOSYS
    prog = [(ld_abs, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, refuse), (ld_abs, 0, 0, 0)]  # seccomp_data.arch, .nr
    if arch == 0xC000003E:  # x86_64: x32 calls are native numbers with bit 30 set
        prog += [(jge, 0, 1, 0x40000000), (ret, 0, 0, refuse)]
    for nr in denied:
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, refuse)]
    prog += [(jeq, 0, 1, clone3), (ret, 0, 0, missing),
             (jeq, 0, 3, clone), (ld_abs, 0, 0, 16), (jset, 0, 1, _CLONE_NEW_ANY), (ret, 0, 0, refuse),  # .args[0]
             (ret, 0, 0, allow)]
    filters = (_SockFilter * len(prog))(*prog)
    fprog = _SockFprog(len(prog), filters)
    _must(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0, "seccomp filter")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _open_to_others(path: str) -> bool:
    """Can a uid that neither owns `path` nor is in its group read it (every directory above searchable)?"""
    path, bits = os.path.abspath(path), 0o005
    while True:
        if os.stat(path).st_mode & bits != bits:
            return False
        if path == "/":
            return True
        path, bits = os.path.dirname(path), 0o001


def _limit(job: dict) -> None:
    """Hard limits; only lowering is allowed afterwards, and the runner no longer has the right to raise them. Each
    within the hard limit this process inherited."""
    cpu = int(job["wall_s"]) + 1
    for which, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL at the hard
                         (resource.RLIMIT_AS, (job["memory_mb"] << 20,) * 2),
                         (resource.RLIMIT_NPROC, (job["processes"],) * 2),
                         (resource.RLIMIT_FSIZE, (job["file_mb"] << 20,) * 2),
                         (resource.RLIMIT_NOFILE, (64, 64)),
                         (resource.RLIMIT_MSGQUEUE, (0, 0)),  # POSIX message queues: kernel memory
                         (resource.RLIMIT_CORE, (0, 0))):
        hard = resource.getrlimit(which)[1]  # within the limit it inherited (a cluster's `ulimit -v`): never raised
        resource.setrlimit(which, value if hard == resource.RLIM_INFINITY else tuple(min(v, hard) for v in value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # too big a file is an OSError in the code, not a kill


def _drop_privileges(uid: int, gid: int, userns: bool) -> list:
    """Root: become `uid` (loses every capability; RLIMIT_NPROC now applies), in a user namespace of its
    own where the kernel allows it. Already in a user namespace: clear capabilities. Returns the layers."""
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binary can give anything back
    tags = []
    if os.geteuid() == 0 and not userns:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            tags.append(f"uid={uid}")
        except OSError:
            pass
        else:
            tags += _own_process_count(uid, gid)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words, all zero
    tags.append("nocaps" if _libc.capset(header, data) == 0 else "caps-kept")
    # Real root (setuid refused) stays exempt from RLIMIT_NPROC whatever its capabilities: say so.
    return tags if userns or os.getuid() != 0 else ["uid=0"] + tags


def _own_process_count(uid: int, gid: int) -> list:
    """A user namespace of the candidate's own, mapping `uid` to itself: the kernel counts RLIMIT_NPROC
    per (user namespace, uid), so candidates sharing `uid` do not share its count. Must come before
    `_limit`: the namespace's ceiling on the uid's count outside it is the RLIMIT_NPROC in force here and now."""
    if _libc.unshare(CLONE_NEWUSER) != 0:
        return []  # user namespaces refused: every candidate shares `uid`'s process count
    _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # setuid made /proc/self root's; for these three writes only
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    finally:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # another process of `uid` must not ptrace this one
    return ["userns"]


def _cgroups(job: dict, proc: str = "/proc/self") -> list:
    """Make this candidate's cgroups, where this process may (root, or a delegated v2 subtree): the
    memory of all its processes together, its /tmp's pages included, at most `memory_mb + file_mb`
    (no swap); at most `processes + 2` tasks (the supervisor's and the judge's). Made here, before any namespace, under
    this process's own groups (so every limit on the trainer still applies); the supervisor joins them.
    Returns (descriptor of the folder holding it, name) per group made -- the supervisor's new root
    hides /sys from this process too, and the groups are removed through these; [] where none can be
    made. A group made but not set up raises (no half a layer)."""
    if not job.get("cgroup", True):
        return []
    name, made = f"grpokit-{os.getpid()}-{os.urandom(4).hex()}", []
    values = {"memory": (job["memory_mb"] + job["file_mb"]) << 20, "pids": job["processes"] + 2}
    try:
        for parent, version, controllers in _cgroup_places(proc):
            folder = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.mkdir(name, dir_fd=folder)
            except BaseException:
                os.close(folder)
                raise
            made.append((folder, name))
            _cgroup_limit(folder, name, version, controllers, values)
    except BaseException:
        _cgroups_remove(made)
        raise
    return made


def _cgroup_limit(folder: int, name: str, version: str, controllers: tuple, values: dict) -> None:
    """Set group `name`'s limits, `values[controller]` for each of `controllers` (the files _CGROUP_FILES names)."""
    for controller in controllers:
        for file, value in _CGROUP_FILES[version, controller]:
            path = f"{name}/{file}"
            if file in _CGROUP_REQUIRED or os.access(path, os.F_OK, dir_fd=folder):  # no swap accounting: no memsw
                _cgroup_write(folder, path, value if value is not None else values[controller])


def _cgroup_write(folder: int, path: str, value) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=folder)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


# Per (hierarchy, controller): the files set, in order (v1's memsw may not go below its limit); None: the limit.
_CGROUP_FILES = {("v1", "memory"): (("memory.limit_in_bytes", None), ("memory.memsw.limit_in_bytes", None)),
                 ("v1", "pids"): (("pids.max", None),),
                 ("v2", "memory"): (("memory.max", None), ("memory.swap.max", 0)),
                 ("v2", "pids"): (("pids.max", None),)}
_CGROUP_REQUIRED = {"memory.limit_in_bytes", "memory.max", "pids.max"}


def _cgroup_places(proc: str = "/proc/self") -> list:
    """[(folder, "v1" | "v2", controllers)]: where this process may make child groups for `memory` and
    `pids`. A v1 hierarchy of that controller: this process's own group there, if writable. Otherwise
    cgroup v2: the nearest of this process's group and its ancestors that enables the controller for its
    children (`cgroup.subtree_control`) and is writable (a trainer in a delegated subtree's leaf makes
    its candidates' groups beside it)."""
    with open(f"{proc}/cgroup") as f:
        own = dict(line.rstrip("\n").split(":", 2)[1:] for line in f)  # controllers ("" for v2) -> path
    v1, v2 = {}, None
    with open(f"{proc}/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            root, point, fstype, options = fields[3], fields[4], fields[dash + 1], fields[dash + 3].split(",")
            for names, path in own.items():
                inside = path if root == "/" else path[len(root):] if (path + "/").startswith(root + "/") else None
                if inside is None:
                    continue
                if fstype == "cgroup" and names and set(names.split(",")) <= set(options):
                    for controller in ("memory", "pids"):
                        if controller in names.split(","):
                            v1.setdefault(controller, point + inside.rstrip("/"))
                elif fstype == "cgroup2" and names == "" and v2 is None:
                    v2 = (point, point + inside.rstrip("/"))
    places = [(folder, "v1", (c,)) for c, folder in sorted(v1.items()) if os.access(folder, os.W_OK)]
    wanted = [c for c in ("memory", "pids") if c not in v1]
    if v2 is not None and wanted:
        point, folder = v2
        while True:
            try:
                with open(os.path.join(folder, "cgroup.subtree_control")) as f:
                    enabled = f.read().split()
            except OSError:
                enabled = []
            if "memory" in enabled or ("memory" not in wanted and "pids" in enabled):
                if os.access(folder, os.W_OK):
                    places.append((folder, "v2", tuple(c for c in wanted if c in enabled)))
                break
            if folder == point:
                break
            folder = os.path.dirname(folder)
    return places


def _cgroups_join(groups: list) -> list:
    """Move this process (the supervisor, before it forks the runner) into the candidate's groups."""
    layers = set()
    for folder, name in groups:
        _cgroup_write(folder, f"{name}/cgroup.procs", 0)  # 0: the writer itself, whatever its pid namespace
        for controller, file in (("memory", "memory.limit_in_bytes"), ("memory", "memory.max"), ("pids", "pids.max")):
            if os.access(f"{name}/{file}", os.F_OK, dir_fd=folder):
                layers.add(f"cgroup-{controller}")
    return sorted(layers)


def _cgroups_remove(groups: list) -> None:
    """Remove the candidate's groups once the job is over. With a pid namespace they are empty by then;
    without one, what is left in them (a process that left the process group) is killed first. The
    kernel refuses rmdir of a group with processes or child groups, so nothing else can go."""
    for folder, name in groups:
        for _ in range(100):
            try:
                os.rmdir(name, dir_fd=folder)
                break
            except FileNotFoundError:
                break
            except OSError:
                _kill_members(folder, name)
                time.sleep(0.01)
        os.close(folder)


def _kill_members(folder: int, name: str) -> None:
    """SIGKILL every process in the group, through a pidfd taken before the check that the pid is still
    a member: a pid freed and reused meanwhile gets nothing."""
    def members() -> set:
        try:
            fd = os.open(f"{name}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC, dir_fd=folder)
        except OSError:
            return set()
        try:
            return set(os.read(fd, 1 << 20).split())
        finally:
            os.close(fd)

    for pid in members():
        try:
            fd = os.pidfd_open(int(pid))
        except OSError:
            continue
        try:
            if pid in members():
                signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def _close_fds(keep: tuple) -> None:
    """Close every descriptor above stderr but those in `keep`."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _supervise(job: dict, out: int, secret: int, layers: list) -> int:
    """Pid 1 of the namespace: prepare the filesystem, start the code runner and then the judge, kill both at the
    deadline (or the code runner once the judge is done)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    layers += _cgroups_join(job["cgroups"])  # first: every process the job starts is in them
    uid, gid = (0, 0) if "userns" in layers else (job["uid"], job["gid"])  # our own ids, as the namespace maps them
    if "ipc" in layers:  # first: the new root's /proc is read-only
        _no_shared_memory()
        layers.append("noshm")
    if "mountns" in layers:
        layers += _new_root(job["file_mb"], uid, gid)
    elif os.geteuid() == 0 and uid != 0 and not all(_open_to_others(p) for p in sys.path if os.path.isdir(p)):
        # No new root, and the uid about to run the code cannot read this python: only the modules
        # imported by now would import (`math` would not). The parent warns.
        layers.append("stdlib-unreadable")
    os.chdir("/tmp" if "tmpfs" in layers else "/")
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the code runner (same uid, without root) must not read our descriptors
    to_code, from_code = os.pipe(), os.pipe()
    apart = "pid" in layers  # the code runner gets a pid namespace of its own (below): the judge is not there to signal
    layers += ["pid-apart"] if apart else []
    judge_runner = os.fork()  # it reads the secret part of the job; this process never does, nor its next child
    if judge_runner == 0:
        _runner_main(job, (out, secret, from_code[0], to_code[1]), layers, uid, gid, judge=True)  # never returns
    os.close(out)
    os.close(secret)
    if apart:
        _must(_libc.unshare(CLONE_NEWPID) == 0, "a pid namespace for the code runner")
    code_runner = os.fork()
    if code_runner == 0:
        _runner_main(job, (to_code[0], from_code[1]), layers, uid, gid, judge=False)
    for fd in (*to_code, *from_code):
        os.close(fd)
    _wait_for(judge_runner, code_runner, job["wall_s"], layers)
    return 0


def _runner_main(job: dict, fds: tuple, layers: list, uid: int, gid: int, judge: bool) -> None:
    """A runner process: drop privileges, set the limits and the seccomp filter, then run its side (the judge:
    the setup and the tests, reporting; the code runner: the code, answering the judge); then `os._exit`, whatever
    happened (never return into the supervisor's code)."""
    try:
        _close_fds(fds)
        dropped = _drop_privileges(uid, gid, "userns" in layers)  # before the limits: see _own_process_count
        _limit(job)
        _seccomp()
        if judge:
            _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the code runner (same uid) cannot ptrace or read this one
            out, secret, from_code, to_code = fds
            report = _reporter(out, secret, job)
            report("iso", ",".join(layers + dropped + ["nomemfd"]))
            pipe = _link.Pipe(from_code, to_code)
            pipe.send(b"go")  # the code runs once the layers are reported: killing this process fails tests, not the job
            _judge.judge(job, pipe, report)
        else:
            pipe = _link.Pipe(*fds)
            _write_through()
            if pipe.receive() == b"go":
                _candidate.serve(job, pipe)
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


def _write_through() -> None:
    """The code runner's stdout and stderr write each print straight to the output pipe: the supervisor kills the
    runner as soon as the judge is done, and what sat in a buffer then (a print with no newline, or any print when
    the pipe made stdout block-buffered) would be lost, so the parent's debugging copy came back empty at random."""
    import io

    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  write_through=True)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _reporter(out: int, secret: int, job: dict):
    """Read the job's secret part (the nonce, the setup, the tests) into `job`; return the report function: one
    line `<nonce> <kind> <value>` per report, a payload's length ending the line and its bytes following."""
    chunks = []
    while True:
        chunk = os.read(secret, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(secret)
    job.update(marshal.loads(b"".join(chunks)))
    nonce, write = job.pop("nonce"), os.write

    def report(kind: str, value, payload: bytes = None) -> None:
        line = f"{nonce} {kind} {value}\n" if payload is None else f"{nonce} {kind} {value} {len(payload)}\n"
        data = memoryview(line.encode() + (payload or b""))
        try:
            while data:
                data = data[write(out, data):]
        except OSError:  # the parent is gone
            pass

    return report


def _wait_for(judge: int, code: int, wall_s: float, layers: list) -> None:
    """Reap until the judge exits or `wall_s` has passed; then the code runner is killed. Past the deadline the
    runners die with this process (pid 1 of its namespace) or, without a pid namespace, with its process group."""
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    try:
        try:
            while os.waitpid(-1, 0)[0] != judge:  # pid 1 reaps every orphan of the namespace too
                pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except ChildProcessError:
        pass
    except _Timeout:
        # As pid 1, returning is enough: the kernel kills the namespace. Without a pid namespace: the
        # process group (the runners and whatever they forked without leaving the group; this one too).
        if "pid" not in layers:
            os.killpg(0, signal.SIGKILL)
        return
    try:
        os.kill(code, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> None:
    global _link, _judge, _candidate
    _link, _judge, _candidate = _load_sides()
    job = marshal.loads(sys.stdin.buffer.read())  # marshal, not json: json would import re (~5 ms a job)
    devnull = os.open("/dev/null", os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out, secret = int(sys.argv[1]), int(sys.argv[2])
    job["cgroups"] = _cgroups(job)  # before the namespaces: this process's own groups, as the host sees them
    layers = _unshare(job["namespaces"])
    supervisor = os.fork()
    if supervisor == 0:
        try:
            os._exit(_supervise(job, out, secret, layers))
        except BaseException:  # noqa: BLE001 - any failure here ends the job; the parent scores what it got
            import traceback

            traceback.print_exc()  # into the output the parent keeps the start of
            os._exit(70)
    os.close(out)
    os.close(secret)
    # Asked to stop (SIGTERM from the parent): kill the supervisor and wait for it. A pid namespace's
    # pid 1 is reaped only after every process in the namespace is gone, so when this process exits
    # the whole job has, and the parent can rely on that.
    signal.signal(signal.SIGTERM, lambda *_: os.kill(supervisor, signal.SIGKILL))
    # Wait without reaping first: until reaped, the supervisor's pid cannot be reused, so a late SIGTERM
    # can only hit the zombie, never a stranger that got the number.
    os.waitid(os.P_PID, supervisor, os.WEXITED | os.WNOWAIT)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.waitpid(supervisor, 0)
    _cgroups_remove(job["cgroups"])


def _load_sides():
    """The two sides' modules, as modules of empty `grpokit` and `grpokit.untrusted` packages (their __init__s, this
    package's face, are not run): loaded here, before the new root hides them."""
    here = os.path.dirname(os.path.abspath(__file__))
    for name, path in (("grpokit", os.path.dirname(here)), ("grpokit.untrusted", here)):
        package = type(sys)(name)
        package.__path__ = [path]
        sys.modules[name] = package
    from grpokit.untrusted import candidate, judge, link

    return link, judge, candidate


_link = _judge = _candidate = None  # the two sides' modules, loaded by main()

if __name__ == "__main__":
    main()
