"""How a run uses the CPU's cores: torch's intra-op threads and how OpenMP's idle threads wait.

Measured (bench/cpu_speed.py, bench/README.md "CPU speed"): on a small machine shared with other work, OpenMP
threads that spin while they wait (its default, "active") fight the neighbour for the cores, and a step takes
several times longer; threads that sleep while they wait ("passive") keep the step near its idle time. So a run
on CPU defaults to OMP_WAIT_POLICY=PASSIVE and DEFAULT_THREADS; `--threads N` (or OMP_NUM_THREADS / OMP_WAIT_POLICY
set in the environment, which are kept as they are) chooses otherwise. And whether the CPU computes bfloat16
natively, which decides what a recipe's `dtype: auto` means on it (`cpu_dtype`).

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import os

WAIT_POLICY = "PASSIVE"
# PyTorch's CUDA allocator: segments that grow in place rather than fixed blocks, so a batch of a new shape (a long
# prompt, a long completion) reuses memory instead of fragmenting it -- the first remedy PyTorch's own out-of-memory
# message names. Read when CUDA starts: set before torch is imported; PYTORCH_ALLOC_CONF is its newer name (either
# set by the user is kept).
ALLOC_CONF, ALLOC_CONF_VALUE = "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"


# glibc's malloc serves an allocation over its mmap threshold from fresh pages it hands back on free; under it, from
# heaps that keep what is freed. The threshold rises to the size of each large block freed (up to 32 MiB), so after a
# step's first tensors are freed most later ones land in the heaps, and a CPU run's resident memory held 16-22 % more
# than its live tensors in the training phase (the calculator recipe); fixed at 1 MiB, 1.01x, and no step time lost
# that a run could see (bench/README.md, "A run's own figures").
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def fixed_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD for this process (where it is glibc): large tensors' memory goes
    back to the system when they are freed. False where there is no glibc or MALLOC_MMAP_THRESHOLD_ says otherwise."""
    import ctypes
    import ctypes.util

    if "MALLOC_MMAP_THRESHOLD_" in os.environ:  # the user's own setting, read by glibc at start
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (OSError, AttributeError):
        return False


def cuda_allocator() -> None:
    """Set ALLOC_CONF where the user set neither it nor PYTORCH_ALLOC_CONF (harmless without CUDA)."""
    if ALLOC_CONF not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ[ALLOC_CONF] = ALLOC_CONF_VALUE


def default_threads() -> int:
    """Torch's intra-op threads when nothing says otherwise: every core this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def configure(threads: int | None) -> str:
    """Set the threads for this process before torch starts its thread pool; returns the line that says what was set.

    `threads` from `--threads` wins; else OMP_NUM_THREADS when the user set it (not the 1 `accelerate launch` sets by
    default: the cores shared by the machine's processes instead); else `default_threads()`. The wait
    policy is set only where the environment does not say one (it must be set before torch is first imported to act).
    """
    said = []
    cuda_allocator()
    fixed_mmap_threshold()
    if "OMP_WAIT_POLICY" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    else:
        said.append(f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']} from the environment")
    if threads is None and os.environ.get("OMP_NUM_THREADS") == "1" and "ACCELERATE_MIXED_PRECISION" in os.environ:
        # `accelerate launch` sets OMP_NUM_THREADS=1 for its processes unless told otherwise (--cpu and
        # --num_cpu_threads_per_process aside), so one process on a CPU ran on one of its cores: share them instead
        local = next((int(v) for v in (os.environ.get("LOCAL_WORLD_SIZE"), os.environ.get("WORLD_SIZE"))
                      if v and v.isdigit() and int(v) > 0), 1)
        share = max(1, default_threads() // local)
        if share > 1:
            threads = share
            said.append(f"not accelerate launch's OMP_NUM_THREADS=1: the {default_threads()} cores shared by "
                        f"{local} process{'es' if local > 1 else ''} (--threads 1 keeps one)")
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


def cpu_dtype(model: dict, lora: bool) -> str:
    """What `auto` resolves to on CPU (`trainer_args.resolved_dtype` says why)."""
    native = lora and model.get("quantization", "none") == "none" and cpu_computes_bf16()
    return "bfloat16" if native else "float32"


_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # x86 instructions that multiply bfloat16 natively (oneDNN uses them)


def cpu_computes_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when this CPU has bfloat16 matrix instructions (AVX512-BF16 or AMX-BF16 on x86; read from the kernel's
    flags, so False where there is no /proc/cpuinfo or on other architectures, where grpokit has not measured).

    >>> cpu_computes_bf16("/nonexistent")
    False
    """
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return any(flag in flags for flag in _CPU_BF16_FLAGS)
