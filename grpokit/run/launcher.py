"""Several processes for one run, through accelerate's own launch API, after the recipe is checked here.

    python launch.py --recipe recipes/qwen2.5-1.5b/dapo.yaml --num-processes 4          # DDP, one process per GPU
    python launch.py --recipe recipes/<name>.yaml --accelerate-config recipes/accelerate/zero2.yaml --num-processes 4

Why not only `accelerate launch launch.py ...`: there each process validates the recipe, and when one exits
2 on a mistake, accelerate's launcher raises `CalledProcessError` (or torch's `ChildFailedError`) after
grpokit's message -- a 12-line traceback under a clean error -- and without a config file it first prints
6 lines of "defaults used". No setting of accelerate turns that off (`--quiet` still exits 1). Here the
recipe is validated and everything that needs no weights is built in this process first (a mistake exits
2 before any process starts); then accelerate starts the processes with a config file (DDP's by default),
and this process ends with their exit code, leaving their own messages as the only output.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_SCRIPT = ROOT / "launch.py"
DEFAULT_CONFIG = ROOT / "recipes" / "accelerate" / "multi_gpu.yaml"  # DDP: one process per GPU (gloo on CPU)
LAUNCHED = "GRPOKIT_LAUNCHED"  # set for the started processes, whichever launcher accelerate picks


def under_launcher() -> bool:
    """True inside a process that accelerate / torchrun started (it must train, not launch again)."""
    return any(os.environ.get(v) for v in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", LAUNCHED))


def wanted(num_processes: int | None, accelerate_config: Path | None) -> bool:
    """Whether this command should start processes rather than train in this one.

    >>> wanted(None, None), wanted(1, None), wanted(4, None)  # doctest: +SKIP
    (False, False, True)
    """
    return not under_launcher() and (accelerate_config is not None or (num_processes or 1) > 1)


def accelerate_argv(script_args: list[str], num_processes: int | None, config: Path | None) -> list[str]:
    """`accelerate launch` arguments: a config file always (no "defaults used" lines), the process count when given."""
    argv = ["--config_file", str(config or DEFAULT_CONFIG)]
    if num_processes:
        argv += ["--num_processes", str(num_processes)]
    if not os.environ.get("MASTER_PORT"):  # one machine: any free port, so two runs side by side do not clash on 29500
        argv += ["--main_process_port", str(free_port())]
    return argv + [str(LAUNCH_SCRIPT), *script_args]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(script_args: list[str], num_processes: int | None, config: Path | None) -> int:
    """Start the run's processes with accelerate's launcher; their exit code (0, 1 run stopped, 2 mistake, ...).

    The processes print their own messages (grpokit's, one per problem); what accelerate and torch's elastic
    agent would add on a failure -- an exception with its traceback, a log line per failed rank -- is dropped.
    """
    from accelerate.commands.launch import launch_command, launch_command_parser

    from grpokit.dist import say

    say(f"recipe checked; starting {num_processes or 'the configured number of'} processes through accelerate "
        f"({os.path.relpath(config or DEFAULT_CONFIG)})")
    # torch's elastic agent logs each failed rank and every SIGTERM it sends; the ranks already said why
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    os.environ[LAUNCHED] = "1"  # inherited: the started processes train; they never launch again
    args = launch_command_parser().parse_args(accelerate_argv(script_args, num_processes, config))
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:  # accelerate's one-process launcher
        return err.returncode
    except Exception as err:  # noqa: BLE001 - torch's ChildFailedError: the first failed rank's code
        failures = getattr(err, "failures", None)
        if not failures:
            raise
        first = min(failures.values(), key=lambda f: f.timestamp)
        return first.exitcode if first.exitcode > 0 else 1
    return 0
