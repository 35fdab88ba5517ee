"""What a newcomer meets in the first hour after `make demo` (issue 14): each stumble, pinned.

These run `launch.py` the way a user does -- as a subprocess, with the interpreter a user might have --
and assert on what they would read: one plain line, the exit code, no traceback.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest
from helpers import ROOT

LAUNCH = str(ROOT / "launch.py")


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> str:
    """A fresh venv without pip or any package: the interpreter a user gets from `python3` outside .venv."""
    where = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    return str(where / "bin" / "python")


@pytest.mark.parametrize("argv", [
    ["--recipe", "recipes/smoke.yaml", "trainer.max_steps=2"],  # the command
    ["--help"],  # --help used to work without the dependencies and so hid the problem
])
def test_launch_without_dependencies_says_what_to_do(bare_python, argv):
    done = subprocess.run([bare_python, LAUNCH, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    line = lines[0]
    assert "yaml" in line and "torch" in line  # what is missing, named
    assert ".venv/bin/python launch.py" in line and "make demo" in line and "activate" in line
    assert " ".join(argv) in line  # the user's own command, ready to paste


def test_launch_with_dependencies_goes_on(tmp_path):
    """The check costs nothing where the dependencies are present: --help answers as before."""
    done = subprocess.run([sys.executable, LAUNCH, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "usage: launch.py" in done.stdout
