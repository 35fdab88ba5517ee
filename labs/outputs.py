"""Where a lab or bench script writes: under runs/ unless the committed reference results are asked for by name.

The rule, for every script in labs/ and bench/: run with its defaults, a script writes under `runs/bench/` (gitignored),
so a try (`labs/algorithms.py --set trainer.max_steps=1`) never replaces the figures bench/README.md quotes.
`--commit-results` writes the committed reference results (bench/results/..., and the sections of bench/README.md a
script keeps); an explicit `--out` goes where it names.

>>> import argparse; parser = argparse.ArgumentParser(); add_commit_flag(parser)
>>> results_dir(parser.parse_args([])).relative_to(ROOT).as_posix()
'runs/bench'
>>> results_dir(parser.parse_args(["--commit-results"])).relative_to(ROOT).as_posix()
'bench/results'
"""

from __future__ import annotations

import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "bench" / "results"  # the reference results the repository carries and bench/README.md links to
SCRATCH = ROOT / "runs" / "bench"  # gitignored: what a script writes unless told otherwise


def add_commit_flag(parser: argparse.ArgumentParser) -> None:
    """Give `parser` the one flag that writes the committed reference results (and the README sections) instead of
    runs/bench/."""
    parser.add_argument("--commit-results", action="store_true",
                        help="write the committed reference results in bench/results/ (and bench/README.md's section) "
                             "instead of runs/bench/")


def results_dir(opts: argparse.Namespace) -> Path:
    """bench/results/ when the script was asked for the committed results (`--commit-results`), else runs/bench/."""
    return COMMITTED if opts.commit_results else SCRATCH


def out_path(opts: argparse.Namespace, name: str) -> Path:
    """The script's results file: its explicit `--out`, else `name` in `results_dir(opts)`."""
    return Path(opts.out) if opts.out else results_dir(opts) / name
