"""Starting and ending a sandbox's outer process, the same for code_tests' sandbox (`jobs`) and the untrusted-work
pool's cage (`pool`): the minimal environment, no stdin, its own process group, killed whole at the end; and the ids
its jobs run as when the trainer is root."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess

# The whole environment of a sandbox's process (nothing of the trainer's passes). One thread per numeric library: a
# pool of threads would reserve address space the memory bound counts.
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp",
       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def start(argv: list, pass_fds: tuple, **popen) -> subprocess.Popen:
    """Start a sandbox's outer process: the minimal environment, no stdin, its own process group (killed whole by
    `end`), the descriptors it is given and no others."""
    return subprocess.Popen(argv, pass_fds=pass_fds, env=ENV, cwd="/", start_new_session=True,
                            stdin=popen.pop("stdin", subprocess.DEVNULL), **popen)


def end(proc: subprocess.Popen, stop: bool, timeout: float = 5.0) -> None:
    """Leave nothing running: ask it to stop (it kills what it started and exits once that is gone), wait, then
    kill its process group, for what a machine without pid namespaces leaves behind."""
    try:
        if stop:
            proc.terminate()
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader only as long as we let it
    except ProcessLookupError:
        pass
    proc.wait()


def sandbox_ids() -> tuple[int, int]:
    """The uid/gid jobs run as when we are root: nobody's (65534 where there is no such user)."""
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534
