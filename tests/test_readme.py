"""The README's promises that code can check: its reward list is the registry's, its commands exist."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT

from grpokit.cli import main

README = (ROOT / "README.md").read_text()


def test_reward_list_is_the_registry(capsys):
    """One source of truth: the README shows exactly what `--list-rewards` prints."""
    assert main(["--list-rewards"]) == 0
    printed = capsys.readouterr().out.rstrip()
    block = re.search(r"<!-- rewards:begin -->\n```text\n(.*?)\n```\n<!-- rewards:end -->", README, re.S)
    assert block, "README lost its rewards block"
    assert block.group(1) == printed, "README's reward list is stale: paste `python launch.py --list-rewards`"


def test_first_screen_gives_exactly_two_commands():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.split("#")[0].strip()]
    assert commands == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()  # CI runs what a newcomer runs


@pytest.mark.slow
def test_first_screen_names_the_next_command_and_it_works():
    """After the two commands, one line says how every further command runs (.venv's Python) and gives the
    next one; run as written (issue 14.1: a bare `python launch.py ...` traced back on `import peft`)."""
    after = README.split("```bash", 1)[1].split("```", 2)[1]
    line = after.strip().split("\n\n")[0]
    assert ".venv/bin/activate" in line
    command = re.search(r"`(\.venv/bin/python launch\.py [^`]*)`", line).group(1)
    argv = shlex.split(command)
    python = ROOT / argv[0]
    if not python.exists():  # tests run from another environment: same command, this interpreter
        python = Path(sys.executable)
    done = subprocess.run([str(python), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "check passed" in done.stdout
    # issue 14.10: its header names what a user can look up, not a chapter the repository never names
    assert "chapter" not in done.stdout and "DeepSeekMath's GRPO objective" in done.stdout
    assert '"GRPO in one screen"' in done.stdout and "## GRPO in one screen" in README
