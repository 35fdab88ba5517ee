"""What a `launch.py` command asks for, read once from the command line (`cli.request`) and handed down as is.

A leaf: it names the request's parts and nothing else, so the rooms that act on it (`training`, `build`) import
it without importing the command line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

DEFAULT_RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "smoke.yaml"

# What the command does: one of these, never a combination of flags read again further down.
Mode = Literal["list-rewards", "plot", "merge", "check", "eval", "launch", "train", "probe"]


@dataclass(frozen=True)
class Request:
    """One command. The defaults are `python launch.py` with nothing else: train the smoke recipe afresh."""

    mode: Mode = "train"
    recipe: Path = DEFAULT_RECIPE
    overrides: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()  # the whole command line: what `launch` hands to the processes it starts
    resume: str | None = None  # "latest" (--resume), a checkpoint (--resume-from), None for a new run
    overwrite: bool = False
    continue_with: str | None = None  # the whole command that continues this run (`rundir.resume_command`)
    num_processes: int | None = None
    accelerate_config: Path | None = None
    gpu_memory: float | None = None  # GiB, for --check's plan; None: the default card (planning.memory.DEFAULT_CARD)
    full: bool = False  # --check --full: the resolved recipe and the first rows whole
    run_dir: Path | None = None  # --plot's and --merge's run
    compare: tuple[Path, ...] = ()  # --plot's other runs
    merge_out: Path | None = None
    eval_run: str | None = None  # --eval's run or checkpoint; None: the recipe's base model
    eval_samples: int = 0
    eval_out: Path | None = None
