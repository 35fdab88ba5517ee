"""The README's promises that code can check: its reward list is the registry's, its commands exist."""

from __future__ import annotations

import re

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
