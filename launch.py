"""Run a GRPO recipe on TRL's GRPOTrainer.

    .venv/bin/python launch.py --recipe recipes/smoke.yaml --check
    .venv/bin/python launch.py --recipe recipes/<name>.yaml [section.key=value ...] [--num-processes N]

The story: check this Python has grpokit's dependencies (a plain `python3` outside `.venv` does not),
read the recipe (and its bases and overrides), validate every key before anything heavy is imported or
any weight loads, then build the trainer and train. See `grpokit/cli.py`.
"""

import os
import shlex
import sys
from importlib.util import find_spec
from pathlib import Path

# What a run imports first; probed without importing (find_spec), so the check costs milliseconds.
DEPENDENCIES = ("yaml", "torch", "transformers", "trl", "peft", "datasets", "accelerate")


def missing_dependencies_message(argv: list[str]) -> str | None:
    """One line telling a user on the wrong interpreter what to run instead; None when nothing is missing.

    Checked before anything else, `--help` included: a `--help` that answers from a bare `python3` only
    hides the problem until the first real command traces back on `import yaml`.
    """
    missing = [name for name in DEPENDENCIES if find_spec(name) is None]
    if not missing:
        return None
    here = Path(__file__).resolve().parent
    python = os.path.relpath(here / ".venv" / "bin" / "python")
    script = os.path.relpath(here / "launch.py")
    command = shlex.join([python, script, *argv])
    return (f"launch.py: this Python ({sys.executable}) lacks grpokit's dependencies (no {', '.join(missing)}); "
            f"they live in .venv: run `make demo` once to build it, then `{command}` "
            f"(or `. {os.path.relpath(here / '.venv' / 'bin' / 'activate')}` once per shell, then `python {script} ...`)")


if __name__ == "__main__":
    problem = missing_dependencies_message(sys.argv[1:])
    if problem:
        print(problem, file=sys.stderr)
        sys.exit(2)
    from grpokit.cli import main

    sys.exit(main())
