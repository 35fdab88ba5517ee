"""report.md shows the model's and the tools' text, never executes it (grpokit/reporting/report.py): control
characters appear as visible escapes (an ESC or BEL from a tool's output would clear or retitle the terminal of
whoever runs `cat report.md`), bidirectional overrides too, and the text stays inside a fence it cannot close."""

from __future__ import annotations

import json
import re

import pytest

from grpokit.reporting.report import write_report

HOSTILE = [
    "\x1b]0;pwned\x07\x1b[2J\x1b[31mred",         # retitle the terminal, clear it, colour it
    "tool python: \x08\x08\x08\x7fgone\x9b2J",       # backspaces, DEL, an 8-bit CSI
    "abc\u202egnp.exe",                              # a right-to-left override that reorders what is shown
    "```\n</details><script>alert(1)</script>\n```",  # close the fence, then raw HTML
]


def written(tmp_path, completion: str) -> str:
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 0.1}],
                                                             "global_step": 1, "max_steps": 1}))
    rows = [{"prompt": "q", "completion": completion, "rewards": {"r": 1.0}, "advantage": 0.0, "step": 1}]
    return write_report(tmp_path, recipe_name="t", completions=rows, plots=[]).read_text()


@pytest.mark.parametrize("text", HOSTILE, ids=["escape sequences", "erasing", "bidi override", "fence and html"])
def test_what_the_model_or_a_tool_wrote_is_shown_not_run(tmp_path, text):
    report = written(tmp_path, text)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", report), repr(report)
    fences = [line for line in report.splitlines() if re.fullmatch(r"`{3,}(text)?", line)]
    assert len(fences) % 2 == 0  # every fence opened is closed by the report's own, not by the text
    if "\x1b" in text:
        assert "\\x1b]0;pwned\\x07\\x1b[2J" in report  # shown, as escapes a reader can see
    if "\u202e" in text:
        assert "abc\\u202egnp.exe" in report
