"""How a run uses the CPU's cores: torch's intra-op threads and how OpenMP's idle threads wait.

Measured (bench/cpu_speed.py, bench/README.md "CPU speed"): on a small machine shared with other work, OpenMP
threads that spin while they wait (its default, "active") fight the neighbour for the cores, and a step takes
several times longer; threads that sleep while they wait ("passive") keep the step near its idle time. So a run
on CPU defaults to OMP_WAIT_POLICY=PASSIVE and DEFAULT_THREADS; `--threads N` (or OMP_NUM_THREADS / OMP_WAIT_POLICY
set in the environment, which are kept as they are) chooses otherwise.

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"


def default_threads() -> int:
    """Torch's intra-op threads when nothing says otherwise: every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def configure(threads: int | None) -> str:
    """Set the threads for this process before torch starts its thread pool; returns the line that says what was set.

    `threads` from `--threads` wins; else OMP_NUM_THREADS when the user set it; else `default_threads()`. The wait
    policy is set only where the environment does not say one (it must be set before torch is first imported to act).
    """
    said = []
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    else:
        said.append(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} from the environment")
    if threads is None and os.environ.get("OMP_NUM_THREADS", "").isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        threads = int(os.environ["OMP_NUM_THREADS"])
        said.append("OMP_NUM_THREADS from the environment")
    threads = threads or default_threads()
    os.environ["OMP_NUM_THREADS"] = str(threads)  # read by torch's OpenMP pool when torch is first imported
    import sys

    if "torch" in sys.modules:  # imported already (a test calling cli.main in-process): set it directly
        sys.modules["torch"].set_num_threads(threads)
    how = f"; {', '.join(said)}" if said else f", OpenMP waiting {os.environ['OMP_WAIT_POLICY'].lower()}"
    return f"cpu: {threads} torch thread{'s' if threads != 1 else ''}{how} (--threads N to change)"
