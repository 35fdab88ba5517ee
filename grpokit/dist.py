"""Processes of one run: which one is the main process, printing from it, and ending a distributed launch.

A leaf: imports nothing of grpokit's.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys


def is_main_process() -> bool:
    return os.environ.get("RANK", "0") in ("0", "") and os.environ.get("LOCAL_RANK", "0") in ("0", "")


def say(message: str) -> None:
    """One progress line per phase, from the main process only."""
    if is_main_process():
        print(f"[grpokit] {message}", flush=True)


def num_processes_from_env() -> int:
    """The process count an accelerate/torchrun launch gives this run (1 when run with plain python)."""
    for var in ("WORLD_SIZE", "ACCELERATE_NUM_PROCESSES"):
        value = os.environ.get(var)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def end_distributed(code: int) -> None:
    """End a distributed launch's process here with `code`; returns at once when no process group is up.

    On success every rank waits for the others (all have saved) and the process group is closed. Then the
    process leaves without interpreter finalization: in torch 2.13 a gloo worker thread can drop the last
    reference to a finished collective's tensors just after the main thread began finalizing, and taking
    the GIL then aborts the process (SIGABRT, "terminate called without an active exception") after a
    complete run -- caught here about once in 30-40 two-process CPU runs; see pytorch/pytorch#190489.
    Python's exit handlers still run and output is flushed first, so nothing a run writes is lost.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    if code == 0:  # a failed rank may have left collectives unmatched: waiting for the others would hang
        dist.barrier()
        dist.destroy_process_group()
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
